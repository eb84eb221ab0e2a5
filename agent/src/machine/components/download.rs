//! HTTP downloads: GET into a staging file with the SHA-256 computed while streaming, small
//! GETs for `.sha256` files, and the retry rule.
//!
//! A download is retried ([`DOWNLOAD_RETRY`], 3 retries with doubling backoff) when the
//! request fails (connect error, timeout, body cut off) or the server answers 5xx or 429. Any
//! other status than 200 fails at once. Error messages never contain the URL (the caller adds
//! the redacted one).

use std::path::Path;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use flex_host::retry::{Attempt, Backoff};

use super::error::Failure;
use flex_host::secret::redact_url;

/// Largest artifact accepted (as [`flex_host::fs::MAX_INSTALL_BYTES`]).
pub const MAX_DOWNLOAD_BYTES: u64 = flex_host::fs::MAX_INSTALL_BYTES;

/// Largest `.sha256` file read.
const MAX_CHECKSUM_BYTES: usize = 1024;

/// How failed downloads are retried by default: 4 attempts (3 retries) after 1 s, 2 s, 4 s, at
/// most 10 s apart.
pub const DOWNLOAD_RETRY: Backoff =
    Backoff::new(4, Duration::from_secs(1), Duration::from_secs(10));

/// One attempt's failure and whether another attempt may help.
struct AttemptError {
    failure: Failure,
    retryable: bool,
}

impl From<Failure> for AttemptError {
    fn from(failure: Failure) -> Self {
        let retryable = match &failure {
            Failure::Status(s) => *s >= 500 || *s == 429,
            _ => false,
        };
        Self { failure, retryable }
    }
}

/// A request error as text without its URL, and whether it is worth retrying.
fn transport(e: reqwest::Error) -> AttemptError {
    let retryable = !(e.is_builder() || e.is_redirect());
    AttemptError {
        failure: Failure::Transport(describe(e)),
        retryable,
    }
}

/// The error and its causes, without the URL.
pub(crate) fn describe(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}

async fn with_retries<T, F, Fut>(
    retry: &Backoff,
    what: &str,
    url: &str,
    mut attempt: F,
) -> Result<T, Failure>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, AttemptError>>,
{
    let label = format!("download {what} from {}", redact_url(url));
    flex_host::retry::retry(&label, *retry, |_| {
        let next = attempt();
        async move {
            next.await.map_err(|e| {
                if e.retryable {
                    Attempt::retry(e.failure)
                } else {
                    Attempt::Fatal(e.failure)
                }
            })
        }
    })
    .await
}

/// GETs `url` into `dest` (created or truncated; a real path), returning the hex SHA-256 of
/// the bytes.
pub(crate) async fn download_to_file(
    client: &reqwest::Client,
    url: &str,
    dest: &Path,
    retry: &Backoff,
    what: &str,
) -> Result<String, Failure> {
    with_retries(retry, what, url, || async {
        let mut resp = client.get(url).send().await.map_err(transport)?;
        if resp.status() != reqwest::StatusCode::OK {
            return Err(Failure::Status(resp.status().as_u16()).into());
        }
        let mut file = tokio::fs::File::create(dest)
            .await
            .map_err(|e| AttemptError::from(Failure::Io(e)))?;
        let mut hasher = Sha256::new();
        let mut total = 0u64;
        while let Some(chunk) = resp.chunk().await.map_err(transport)? {
            total += chunk.len() as u64;
            if total > MAX_DOWNLOAD_BYTES {
                return Err(Failure::TooLarge(MAX_DOWNLOAD_BYTES).into());
            }
            hasher.update(&chunk);
            file.write_all(&chunk)
                .await
                .map_err(|e| AttemptError::from(Failure::Io(e)))?;
        }
        file.flush()
            .await
            .map_err(|e| AttemptError::from(Failure::Io(e)))?;
        Ok(hex::encode(hasher.finalize()))
    })
    .await
}

/// GETs a `.sha256` file and parses it ([`parse_checksum`]).
pub(crate) async fn fetch_checksum(
    client: &reqwest::Client,
    url: &str,
    retry: &Backoff,
    what: &str,
) -> Result<String, Failure> {
    let body = with_retries(retry, what, url, || async {
        let mut resp = client.get(url).send().await.map_err(transport)?;
        if resp.status() != reqwest::StatusCode::OK {
            return Err(Failure::Status(resp.status().as_u16()).into());
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(transport)? {
            body.extend_from_slice(&chunk);
            if body.len() >= MAX_CHECKSUM_BYTES {
                body.truncate(MAX_CHECKSUM_BYTES);
                break;
            }
        }
        Ok(body)
    })
    .await?;
    parse_checksum(&body)
}

/// The hex SHA-256 of a checksum file: its first whitespace-separated field (of at most the
/// first 1024 bytes), 64 hex digits, lowercased.
pub(crate) fn parse_checksum(body: &[u8]) -> Result<String, Failure> {
    let body = &body[..body.len().min(MAX_CHECKSUM_BYTES)];
    let text = String::from_utf8_lossy(body);
    let field = text.split_whitespace().next().unwrap_or_default();
    if field.len() != 64 {
        return Err(Failure::InvalidChecksum(format!(
            "expected 64 hex digits, found {} characters",
            field.len()
        )));
    }
    if !field.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Failure::InvalidChecksum("not hexadecimal".into()));
    }
    Ok(field.to_ascii_lowercase())
}

/// The hex SHA-256 of a local file.
pub(crate) fn sha256_file(path: &Path) -> std::io::Result<String> {
    sha256_reader(std::fs::File::open(path)?)
}

/// The SHA-256 (hex) of everything `file` holds.
pub(crate) fn sha256_reader(mut file: impl std::io::Read) -> std::io::Result<String> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}
