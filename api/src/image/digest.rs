//! Content digests: the validated `sha256:<64 lowercase hex>` form, computing one over bytes or a
//! file, and a reader that hashes what passes through it.
//!
//! Only `sha256` is supported (it is the only algorithm registries and OCI layouts use in
//! practice). A [`Digest`] is validated when parsed *and* when deserialized from a manifest, so a
//! digest that reaches a file path (`blobs/sha256/<hex>`) is always exactly 64 hex characters.

use std::fmt;
use std::io::Read;
use std::path::Path;
use std::str::FromStr;

use sha2::{Digest as _, Sha256};

/// The only digest algorithm supported.
pub const SHA256: &str = "sha256";

/// A validated `sha256:<64 lowercase hex>` digest.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Digest(String);

/// Why a string is not a valid digest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid digest {digest:?}: {reason}")]
pub struct DigestError {
    /// The rejected text.
    pub digest: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl Digest {
    /// Parses `sha256:<64 lowercase hex>`.
    pub fn parse(s: &str) -> Result<Self, DigestError> {
        let err = |reason| DigestError {
            digest: s.to_string(),
            reason,
        };
        let (algo, hex) = s
            .split_once(':')
            .ok_or_else(|| err("expected <algorithm>:<hex>"))?;
        if algo != SHA256 {
            return Err(err("unsupported algorithm (only sha256 is supported)"));
        }
        if hex.len() != 64 {
            return Err(err("a sha256 digest has 64 hex characters"));
        }
        if !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(err("the hex part must be lowercase hexadecimal"));
        }
        Ok(Self(s.to_string()))
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self::from_hasher(Sha256::new_with_prefix(bytes))
    }

    /// The digest of a finished hasher.
    pub fn from_hasher(hasher: Sha256) -> Self {
        Self(format!("{SHA256}:{}", hex::encode(hasher.finalize())))
    }

    /// The digest of a file's content, read in 1 MiB chunks.
    pub fn of_file(path: &Path) -> std::io::Result<Self> {
        let mut f = std::fs::File::open(path)?;
        let mut r = HashingReader::new(&mut f);
        std::io::copy(&mut r, &mut std::io::sink())?;
        Ok(r.digest())
    }

    /// The 64 hex characters after `sha256:`.
    pub fn hex(&self) -> &str {
        self.0.split_once(':').map_or("", |(_, h)| h)
    }

    /// The full `sha256:<hex>` text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `sha256:` and the first 12 hex characters, for log lines.
    pub fn short(&self) -> &str {
        &self.0[..self.0.len().min(SHA256.len() + 1 + 12)]
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.0)
    }
}

impl FromStr for Digest {
    type Err = DigestError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// A reader that hashes (sha256) and counts every byte read through it.
pub struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    count: u64,
}

impl<R: Read> HashingReader<R> {
    /// Wraps `inner`.
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }

    /// Bytes read so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The digest of everything read so far.
    pub fn digest(&self) -> Digest {
        Digest::from_hasher(self.hasher.clone())
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY: &str = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn parse_and_compute() {
        assert_eq!(Digest::of(b"").as_str(), EMPTY);
        let d = Digest::parse(EMPTY).unwrap();
        assert_eq!(d.hex().len(), 64);
        assert_eq!(d.short(), "sha256:e3b0c44298fc");
        for bad in [
            "",
            "sha256",
            "sha512:abcd",
            "sha256:E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855",
            "sha256:e3b0",
            "sha256:../../../../../../../../../../../../../../../../../../../../etc/x",
        ] {
            assert!(Digest::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn deserialize_validates() {
        let ok: Result<Digest, _> = serde_json::from_str(&format!("\"{EMPTY}\""));
        assert!(ok.is_ok());
        let bad: Result<Digest, _> = serde_json::from_str("\"sha256:../x\"");
        assert!(bad.is_err());
    }

    #[test]
    fn hashing_reader_counts_and_hashes() {
        let mut r = HashingReader::new(&b"hello"[..]);
        std::io::copy(&mut r, &mut std::io::sink()).unwrap();
        assert_eq!(r.count(), 5);
        assert_eq!(r.digest(), Digest::of(b"hello"));
    }
}
