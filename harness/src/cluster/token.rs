//! The bootstrap token the harness creates in the kind cluster: kubeadm's shape
//! (`[a-z0-9]{6}.[a-z0-9]{16}`), its secret half held as a [`Secret`] (redacted `Debug`, no
//! `Display`), generated from the kernel's random source.

use std::io::Read as _;

use flex_host::secret::Secret;

const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
/// Length of the public id.
pub const ID_LEN: usize = 6;
/// Length of the secret.
pub const SECRET_LEN: usize = 16;

/// A bootstrap token: the public id (the Secret's name `bootstrap-token-<id>`, the user
/// `system:bootstrap:<id>`) and the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct BootstrapToken {
    id: String,
    secret: Secret,
}

impl std::fmt::Debug for BootstrapToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BootstrapToken({}.{:?})", self.id, self.secret)
    }
}

/// Why a token is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// The id is not `[a-z0-9]{6}`.
    #[error("bootstrap token id {0:?} is not [a-z0-9]{{6}}")]
    Id(String),
    /// The secret is not `[a-z0-9]{16}` (the value is never shown).
    #[error("bootstrap token secret is not [a-z0-9]{{16}}")]
    Secret,
}

fn valid(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| ALPHABET.contains(&b))
}

/// Maps random bytes to `len` characters of the alphabet, without modulo bias (bytes at or
/// above the largest multiple of 36 are skipped); `None` when `bytes` ran out.
fn pick(bytes: &mut impl Iterator<Item = u8>, len: usize) -> Option<String> {
    let limit = (256 / ALPHABET.len() * ALPHABET.len()) as u8;
    let mut out = String::with_capacity(len);
    while out.len() < len {
        let b = bytes.next()?;
        if b < limit {
            out.push(char::from(ALPHABET[usize::from(b) % ALPHABET.len()]));
        }
    }
    Some(out)
}

impl BootstrapToken {
    /// A token from its parts, validated.
    pub fn from_parts(id: &str, secret: &str) -> Result<Self, TokenError> {
        if !valid(id, ID_LEN) {
            return Err(TokenError::Id(id.to_string()));
        }
        if !valid(secret, SECRET_LEN) {
            return Err(TokenError::Secret);
        }
        Ok(Self {
            id: id.to_string(),
            secret: Secret::new(secret),
        })
    }

    /// A token from random bytes (see [`BootstrapToken::generate`]); `None` when they ran out.
    pub fn from_random(bytes: &[u8]) -> Option<Self> {
        let mut it = bytes.iter().copied();
        let id = pick(&mut it, ID_LEN)?;
        let secret = pick(&mut it, SECRET_LEN)?;
        Some(Self {
            id,
            secret: Secret::new(secret),
        })
    }

    /// A fresh token from `/dev/urandom`.
    pub fn generate() -> std::io::Result<Self> {
        let mut f = std::fs::File::open("/dev/urandom")?;
        loop {
            let mut buf = [0u8; 64];
            f.read_exact(&mut buf)?;
            if let Some(t) = Self::from_random(&buf) {
                return Ok(t);
            }
        }
    }

    /// The public id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The secret half.
    pub fn secret(&self) -> &Secret {
        &self.secret
    }

    /// `<id>.<secret>`, as the agent's config takes it.
    pub fn token(&self) -> Secret {
        Secret::new(format!("{}.{}", self.id, self.secret.expose()))
    }

    /// `text` with the secret replaced by `***REDACTED***` (for errors that may echo it).
    pub fn redact(&self, text: &str) -> String {
        if self.secret.expose().is_empty() {
            return text.to_string();
        }
        text.replace(self.secret.expose(), flex_host::runner::REDACTED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tokens_have_kubeadms_shape_and_differ() {
        let a = BootstrapToken::generate().unwrap();
        let b = BootstrapToken::generate().unwrap();
        let t = a.token();
        let (id, secret) = t.expose().split_once('.').unwrap();
        assert!(valid(id, ID_LEN) && valid(secret, SECRET_LEN));
        assert_ne!(a, b);
    }

    #[test]
    fn from_random_skips_biased_bytes_and_needs_enough() {
        // 252..=255 are skipped; 0 → 'a', 35 → '9', 36 → 'a'.
        let mut bytes = vec![255, 0, 35, 36, 1, 2, 3];
        bytes.extend(std::iter::repeat_n(25u8, 16));
        let t = BootstrapToken::from_random(&bytes).unwrap();
        assert_eq!(t.id(), "a9abcd");
        assert_eq!(t.secret().expose(), "zzzzzzzzzzzzzzzz");
        assert!(BootstrapToken::from_random(&[0; 21]).is_none());
        assert!(BootstrapToken::from_random(&[255; 64]).is_none());
    }

    #[test]
    fn parts_are_validated_and_the_secret_never_shows() {
        let t = BootstrapToken::from_parts("abcdef", "0123456789abcdef").unwrap();
        assert_eq!(t.token().expose(), "abcdef.0123456789abcdef");
        let dbg = format!("{t:?}");
        assert!(
            dbg.contains("abcdef") && !dbg.contains("0123456789abcdef"),
            "{dbg}"
        );
        assert_eq!(
            t.redact("secret 0123456789abcdef in an error"),
            "secret ***REDACTED*** in an error"
        );
        assert_eq!(
            BootstrapToken::from_parts("ABCDEF", "0123456789abcdef").unwrap_err(),
            TokenError::Id("ABCDEF".into())
        );
        let e = BootstrapToken::from_parts("abcdef", "short").unwrap_err();
        assert_eq!(e, TokenError::Secret);
        assert!(!e.to_string().contains("short"));
    }
}
