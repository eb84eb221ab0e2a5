//! Data URLs as Butane makes them (`base/util/url.go`, `MakeDataURL`): the shortest of
//! `data:,<percent-encoded>`, `data:;base64,<base64>` and, when compression is allowed,
//! `data:;base64,<gzip, base64>` (which also sets the resource's `compression` to `gzip`).
//!
//! The gzip stream is deterministic: level 9 (Go's `gzip.BestCompression`), header mtime 0,
//! XFL 2 and OS 255 ("unknown"), the header Go writes. The deflate bytes come from
//! `miniz_oxide`, so they differ from Go's but never between two renderings.

use base64::Engine as _;

/// The gzip compression level, Go's `gzip.BestCompression`.
pub const GZIP_LEVEL: u8 = 9;

/// A data URL and whether its payload is gzip-compressed (then the resource's `compression`
/// must be `gzip`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataUrl {
    /// The URL, `data:,…` or `data:;base64,…`.
    pub url: String,
    /// Whether the payload is gzip-compressed.
    pub gzipped: bool,
}

/// Encodes `data` as Butane does: the shortest of the percent-encoded and the base64 forms and,
/// if `allow_compression`, the gzip+base64 form, which wins only when it is shorter even after
/// counting the four bytes of `"gzip"` it adds to the resource.
///
/// Pass `allow_compression = false` for data the caller already compressed.
pub fn encode(data: &[u8], allow_compression: bool) -> DataUrl {
    let mut opaque = format!(",{}", escape(data));
    let b64 = format!(";base64,{}", base64_encode(data));
    if b64.len() < opaque.len() {
        opaque = b64;
    }
    let mut gzipped = false;
    if allow_compression {
        let gz = format!(";base64,{}", base64_encode(&gzip(data)));
        if gz.len() + "gzip".len() < opaque.len() {
            opaque = gz;
            gzipped = true;
        }
    }
    DataUrl {
        url: format!("data:{opaque}"),
        gzipped,
    }
}

/// Percent-encodes `data` as RFC 2397 data URLs need it (Go's `dataurl.Escape`): the RFC 2396
/// unreserved bytes `A-Z a-z 0-9 - _ . ! ~ * ' ( )` stay, every other byte becomes `%XX` with
/// upper-case hex digits.
pub fn escape(data: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(data.len());
    for &b in data {
        if b.is_ascii_alphanumeric() || b"-_.!~*'()".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0x0f)]));
        }
    }
    out
}

/// Decodes a `data:` URL (RFC 2397: `data:[<media type>][;base64],<data>`) into its bytes;
/// `None` when `url` is not a data URL or its payload does not decode (a bad `%XX` escape or
/// base64). The media type is ignored, as Ignition ignores it.
pub fn decode(url: &str) -> Option<Vec<u8>> {
    let (header, payload) = url.strip_prefix("data:")?.split_once(',')?;
    if header.ends_with(";base64") {
        return base64::engine::general_purpose::STANDARD
            .decode(payload)
            .ok();
    }
    let bytes = payload.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(out)
}

/// Standard base64 with padding (Go's `base64.StdEncoding`).
pub fn base64_encode(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// Compresses `data` into a gzip member with a fixed header (mtime 0, XFL 2, OS 255), so equal
/// input always gives equal bytes.
pub fn gzip(data: &[u8]) -> Vec<u8> {
    let deflated = miniz_oxide::deflate::compress_to_vec(data, GZIP_LEVEL);
    let mut out = Vec::with_capacity(deflated.len() + 18);
    // ID1 ID2, CM = deflate, FLG = none, MTIME = 0, XFL = 2 (best compression), OS = unknown.
    out.extend_from_slice(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 2, 255]);
    out.extend_from_slice(&deflated);
    out.extend_from_slice(&crc32fast::hash(data).to_le_bytes());
    // ISIZE is the input length modulo 2^32 (RFC 1952), so the truncation is intended.
    #[allow(clippy::cast_possible_truncation)]
    let isize = data.len() as u32;
    out.extend_from_slice(&isize.to_le_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read as _;

    fn gunzip(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(data)
            .read_to_end(&mut out)
            .unwrap();
        out
    }

    #[test]
    fn escape_keeps_unreserved_and_percent_encodes_the_rest() {
        assert_eq!(escape(b"azAZ09-_.!~*'()"), "azAZ09-_.!~*'()");
        assert_eq!(escape(b"a b\n"), "a%20b%0A");
        assert_eq!(
            escape(b"server = \"http://10.0.2.2:5000\"\n"),
            "server%20%3D%20%22http%3A%2F%2F10.0.2.2%3A5000%22%0A"
        );
        assert_eq!(escape(&[0x00, 0x0f, 0xff]), "%00%0F%FF");
        assert_eq!(escape("é".as_bytes()), "%C3%A9");
        assert_eq!(escape(b""), "");
    }

    #[test]
    fn plain_text_is_percent_encoded() {
        let u = encode(b"acl-test", true);
        assert_eq!(u.url, "data:,acl-test");
        assert!(!u.gzipped);
        assert_eq!(encode(b"", true).url, "data:,");
    }

    #[test]
    fn binary_data_is_base64_when_shorter() {
        // Escaping triples every byte; base64 costs 4/3 plus the longer prefix.
        let data = [0u8, 1, 2, 3, 250, 251, 252, 253, 254, 255];
        let u = encode(&data, true);
        assert_eq!(u.url, "data:;base64,AAECA/r7/P3+/w==");
        assert!(!u.gzipped);
    }

    #[test]
    fn large_repetitive_text_is_gzipped_and_round_trips() {
        let data = "# line of config\nkey = value\n".repeat(100);
        let u = encode(data.as_bytes(), true);
        assert!(u.gzipped);
        let payload = u.url.strip_prefix("data:;base64,").unwrap();
        let gz = base64::engine::general_purpose::STANDARD
            .decode(payload)
            .unwrap();
        assert_eq!(&gz[..10], &[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 2, 255]);
        assert_eq!(gunzip(&gz), data.as_bytes());
        // Not compressed when compression is not allowed; escaping this text (`#`, spaces,
        // `=`, newlines) costs more than base64, so base64 it is.
        let plain = encode(data.as_bytes(), false);
        assert!(!plain.gzipped);
        assert_eq!(
            plain.url,
            format!("data:;base64,{}", base64_encode(data.as_bytes()))
        );
        // Mostly unreserved text stays percent-encoded.
        let text = "abcdefghij-".repeat(100);
        assert_eq!(encode(text.as_bytes(), false).url, format!("data:,{text}"));
    }

    #[test]
    fn gzip_wins_only_when_shorter_including_the_compression_field() {
        // Short text: gzip's 18-byte framing makes it longer.
        assert!(!encode(b"hello world\n", true).gzipped);
        // The rule itself: compare with the length the other forms give.
        for n in [1usize, 10, 20, 40, 80, 160] {
            let data = "ab".repeat(n);
            let plain_len = format!(",{}", escape(data.as_bytes())).len();
            let gz_len = format!(";base64,{}", base64_encode(&gzip(data.as_bytes()))).len();
            assert_eq!(
                encode(data.as_bytes(), true).gzipped,
                gz_len + 4 < plain_len,
                "n = {n}"
            );
        }
    }

    #[test]
    fn gzip_is_deterministic_and_valid() {
        let data = b"deterministic gzip payload\n".repeat(50);
        assert_eq!(gzip(&data), gzip(&data));
        assert_eq!(gunzip(&gzip(&data)), data);
        assert_eq!(gunzip(&gzip(b"")), b"");
    }

    #[test]
    fn base64_is_standard_with_padding() {
        assert_eq!(base64_encode(b"a"), "YQ==");
        assert_eq!(base64_encode(&[0xfb, 0xff]), "+/8=");
    }
}
