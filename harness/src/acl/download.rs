//! Downloading a managed disk's VHD from its SAS URL: streamed to a file that stays sparse
//! (the gallery's VHDs are fixed-size, ~30 GB, mostly zeros), resumed with a `Range` request
//! after a broken connection (the attempts and waits of [`BACKOFF`], through
//! `flex_host::retry`), with progress. The SAS URL is a secret: it is a [`SasUrl`],
//! whose `Debug` is redacted and which has no `Display`; errors name it by
//! [`SasUrl::redacted`] (scheme, host and path, no query) and never carry reqwest's URL.

use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use async_trait::async_trait;
use flex_host::retry::{self, Backoff};

/// A shared access signature URL (the query is the credential).
#[derive(Clone, PartialEq, Eq)]
pub struct SasUrl(String);

impl SasUrl {
    /// Wraps `url`.
    pub fn new(url: impl Into<String>) -> Self {
        Self(url.into())
    }

    /// The real URL, for the request only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL without its query, for messages.
    pub fn redacted(&self) -> String {
        match self.0.split_once('?') {
            Some((base, _)) => format!("{base}?{}", flex_host::runner::REDACTED),
            None => self.0.clone(),
        }
    }

    /// `text` with the URL, and its query on its own, replaced by [`SasUrl::redacted`].
    pub fn scrub(&self, text: &str) -> String {
        let mut t = text.replace(&self.0, &self.redacted());
        if let Some((_, q)) = self.0.split_once('?')
            && !q.is_empty()
        {
            t = t.replace(q, flex_host::runner::REDACTED);
        }
        t
    }
}

impl std::fmt::Debug for SasUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SasUrl({})", self.redacted())
    }
}

/// Progress of a download: bytes so far and the total, when known.
pub type OnProgress<'a> = &'a (dyn Fn(u64, Option<u64>) + Send + Sync);

/// Downloads a SAS URL into a file (a trait so the gallery's flow is tested without a network).
#[async_trait]
pub trait Fetch: Send + Sync {
    /// Downloads `url` into `dest` (replacing it); returns the size.
    async fn fetch(&self, url: &SasUrl, dest: &Path, progress: OnProgress<'_>) -> Result<u64>;
}

/// The download's attempts and waits: 6 attempts (the first and 5 resumptions), waiting 2 s
/// doubling to 32 s between them.
pub const BACKOFF: Backoff = Backoff::new(6, Duration::from_secs(2), Duration::from_secs(32));

/// The real download, over HTTPS with reqwest.
pub struct HttpFetch {
    client: reqwest::Client,
    /// Attempts, each after the first resuming where the last one stopped, and the waits
    /// between them ([`BACKOFF`]).
    pub backoff: Backoff,
}

impl HttpFetch {
    /// A client with a connect timeout and a read timeout but no overall timeout (a 30 GB
    /// download takes as long as it takes).
    pub fn new() -> Result<Self> {
        flex_host::http::install_crypto();
        let client = reqwest::Client::builder()
            .user_agent(concat!("aks-flex-node-harness/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(30))
            .read_timeout(Duration::from_secs(120))
            .build()
            .map_err(|e| anyhow::anyhow!("building the HTTP client: {}", e.without_url()))?;
        Ok(Self {
            client,
            backoff: BACKOFF,
        })
    }
}

/// Writes blocks of zeros as holes.
struct SparseWriter {
    file: File,
    pos: u64,
    buf: Vec<u8>,
}

const BLOCK: usize = 1 << 20;

impl SparseWriter {
    fn push(&mut self, mut data: &[u8]) -> std::io::Result<()> {
        while !data.is_empty() {
            let n = (BLOCK - self.buf.len()).min(data.len());
            self.buf.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.buf.len() == BLOCK {
                self.flush_block()?;
            }
        }
        Ok(())
    }

    fn flush_block(&mut self) -> std::io::Result<()> {
        if self.buf.iter().any(|b| *b != 0) {
            self.file.seek(SeekFrom::Start(self.pos))?;
            self.file.write_all(&self.buf)?;
        }
        self.pos += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }

    /// Writes what is buffered and sets the file's length.
    fn finish(&mut self) -> std::io::Result<u64> {
        self.flush_block()?;
        self.file.set_len(self.pos)?;
        self.file.sync_all()?;
        Ok(self.pos)
    }
}

enum Attempt {
    /// Finished: the size.
    Done(u64),
    /// Worth retrying from where it stopped.
    Retry(String),
}

/// Why an attempt failed, the SAS scrubbed from it.
#[derive(Debug, thiserror::Error)]
enum Failure {
    /// The connection broke or the server was busy: the next attempt resumes.
    #[error("{0}")]
    Interrupted(String),
    /// The server refused (or the file could not be written): no attempt would do better.
    #[error("{0}")]
    Fatal(String),
}

impl HttpFetch {
    async fn attempt(
        &self,
        url: &SasUrl,
        w: &mut SparseWriter,
        progress: OnProgress<'_>,
    ) -> Result<Attempt> {
        // Unflushed bytes are dropped and fetched again.
        w.buf.clear();
        let mut req = self.client.get(url.expose());
        if w.pos > 0 {
            req = req.header(reqwest::header::RANGE, format!("bytes={}-", w.pos));
        }
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) => return Ok(Attempt::Retry(e.without_url().to_string())),
        };
        let status = resp.status();
        match status.as_u16() {
            206 if w.pos > 0 => {}
            200 => {
                // The server ignored the range (or this is the first attempt): from the start.
                w.pos = 0;
                w.file.set_len(0)?;
            }
            500..=599 | 408 | 429 => {
                return Ok(Attempt::Retry(format!("the server answered {status}")));
            }
            _ => bail!(
                "GET {} answered {status} (an expired or revoked SAS answers 403)",
                url.redacted()
            ),
        }
        let total = resp.content_length().map(|l| l + w.pos);
        let mut resp = resp;
        loop {
            match resp.chunk().await {
                Ok(Some(chunk)) => {
                    w.push(&chunk)?;
                    progress(w.pos + w.buf.len() as u64, total);
                }
                Ok(None) => break,
                Err(e) => return Ok(Attempt::Retry(e.without_url().to_string())),
            }
        }
        let got = w.pos + w.buf.len() as u64;
        if let Some(t) = total
            && got < t
        {
            return Ok(Attempt::Retry(format!(
                "the connection ended at {got} of {t} bytes"
            )));
        }
        Ok(Attempt::Done(w.finish()?))
    }
}

#[async_trait]
impl Fetch for HttpFetch {
    async fn fetch(&self, url: &SasUrl, dest: &Path, progress: OnProgress<'_>) -> Result<u64> {
        let file = File::create(dest).with_context(|| format!("creating {}", dest.display()))?;
        let w = SparseWriter {
            file,
            pos: 0,
            buf: Vec::with_capacity(BLOCK),
        };
        let w = tokio::sync::Mutex::new(w);
        let w = &w;
        let r = retry::retry("the disk's download", self.backoff, |n| async move {
            let mut w = w.lock().await;
            if n > 1 {
                tracing::info!(
                    attempt = n - 1,
                    at = w.pos,
                    "download interrupted, resuming"
                );
            }
            match self.attempt(url, &mut w, progress).await {
                Ok(Attempt::Done(size)) => Ok(size),
                Ok(Attempt::Retry(why)) => {
                    Err(retry::Attempt::retry(Failure::Interrupted(url.scrub(&why))))
                }
                Err(e) => Err(retry::Attempt::Fatal(Failure::Fatal(
                    url.scrub(&format!("{e:#}")),
                ))),
            }
        })
        .await;
        match r {
            Ok(size) => Ok(size),
            Err(Failure::Fatal(why)) => bail!("{why}"),
            Err(Failure::Interrupted(last)) => bail!(
                "downloading {} failed after {} attempts: {last}",
                url.redacted(),
                self.backoff.max_attempts()
            ),
        }
    }
}

/// `n` bytes as GiB with one decimal.
pub fn gib(n: u64) -> String {
    format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const SIG: &str = "sv=2018-03-28&sr=b&si=abc&sig=S3CR3TsIgNaTuRe%3D";

    fn body() -> Vec<u8> {
        // 3 MiB: a data block, a zero block, data in the last (short) block.
        let mut b = vec![0x5au8; BLOCK];
        b.extend(vec![0u8; BLOCK]);
        b.extend(vec![0u8; BLOCK / 2]);
        b.extend(vec![0xa5u8; BLOCK / 2]);
        b
    }

    /// A one-file HTTP server on loopback: `plan` gives, per request (0, 1, …), the status and
    /// how many bytes of the (range-adjusted) body to send before closing. Records requests.
    async fn serve(
        plan: Vec<(u16, Option<usize>)>,
    ) -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen2 = seen.clone();
        let n = Arc::new(AtomicUsize::new(0));
        tokio::spawn(async move {
            let data = body();
            loop {
                let Ok((mut s, _)) = l.accept().await else {
                    return;
                };
                let i = n.fetch_add(1, Ordering::SeqCst);
                let mut req = Vec::new();
                let mut b = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    let Ok(k) = s.read(&mut b).await else { break };
                    if k == 0 {
                        break;
                    }
                    req.extend_from_slice(&b[..k]);
                }
                let text = String::from_utf8_lossy(&req).to_string();
                seen2.lock().unwrap().push(text.clone());
                let (status, cut) = plan.get(i).copied().unwrap_or((200, None));
                let from = text
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("range: bytes=")
                            .map(|r| r.trim_end_matches('-').parse::<usize>().unwrap())
                    })
                    .unwrap_or(0);
                let part = &data[from..];
                let reason = match status {
                    200 => "OK",
                    206 => "Partial Content",
                    403 => "Forbidden",
                    _ => "Error",
                };
                let len = if status >= 400 { 0 } else { part.len() };
                let head = format!(
                    "HTTP/1.1 {status} {reason}\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
                );
                let _ = s.write_all(head.as_bytes()).await;
                if status < 400 {
                    let send = cut.unwrap_or(part.len());
                    let _ = s.write_all(&part[..send]).await;
                }
                let _ = s.shutdown().await;
            }
        });
        (format!("http://{addr}/md-abc/abcd?{SIG}"), seen)
    }

    fn fetcher() -> HttpFetch {
        let mut f = HttpFetch::new().unwrap();
        f.backoff = Backoff::new(
            BACKOFF.attempts,
            Duration::from_millis(10),
            Duration::from_millis(160),
        );
        f
    }

    #[tokio::test]
    async fn downloads_sparse() {
        let (url, _) = serve(vec![(200, None)]).await;
        let d = tempfile::tempdir().unwrap();
        let dest = d.path().join("disk.vhd");
        let last = std::sync::Mutex::new((0, None));
        let n = fetcher()
            .fetch(&SasUrl::new(url), &dest, &|a, t| {
                *last.lock().unwrap() = (a, t)
            })
            .await
            .unwrap();
        assert_eq!(n, body().len() as u64);
        assert_eq!(std::fs::read(&dest).unwrap(), body());
        assert_eq!(*last.lock().unwrap(), (n, Some(n)));
        use std::os::unix::fs::MetadataExt;
        let allocated = std::fs::metadata(&dest).unwrap().blocks() * 512;
        assert!(
            allocated < n - BLOCK as u64 / 2,
            "{allocated} bytes allocated for {n}: the zero block was written"
        );
    }

    #[tokio::test]
    async fn resumes_with_a_range_after_a_broken_connection() {
        let (url, seen) = serve(vec![(200, Some(BLOCK + 1000)), (206, None)]).await;
        let d = tempfile::tempdir().unwrap();
        let dest = d.path().join("disk.vhd");
        fetcher()
            .fetch(&SasUrl::new(url), &dest, &|_, _| {})
            .await
            .unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), body());
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 2);
        assert!(
            seen[1]
                .to_ascii_lowercase()
                .contains(&format!("range: bytes={BLOCK}-")),
            "{}",
            seen[1]
        );
    }

    #[tokio::test]
    async fn a_refused_sas_is_an_error_that_does_not_show_it() {
        let (url, _) = serve(vec![(403, None)]).await;
        let d = tempfile::tempdir().unwrap();
        let e = fetcher()
            .fetch(&SasUrl::new(url), &d.path().join("x"), &|_, _| {})
            .await
            .unwrap_err();
        let text = format!("{e:#} {e:?}");
        assert!(text.contains("403"), "{text}");
        assert!(text.contains("/md-abc/abcd?***REDACTED***"), "{text}");
        assert!(!text.contains("S3CR3T"), "{text}");
    }

    #[tokio::test]
    async fn an_unreachable_server_fails_after_the_retries_without_the_sas() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        let mut f = fetcher();
        f.backoff.attempts = 2;
        let d = tempfile::tempdir().unwrap();
        let e = f
            .fetch(
                &SasUrl::new(format!("http://127.0.0.1:{port}/d?{SIG}")),
                &d.path().join("x"),
                &|_, _| {},
            )
            .await
            .unwrap_err();
        let text = format!("{e:#}");
        assert!(text.contains("after 2 attempts"), "{text}");
        assert!(!text.contains("S3CR3T"), "{text}");
    }

    /// The waits the download always had: 5 resumptions, after 2, 4, 8, 16 and 32 s.
    #[test]
    fn the_backoff_is_six_attempts_doubling_from_two_seconds() {
        assert_eq!(BACKOFF.max_attempts(), 6);
        let waits: Vec<u64> = (1..BACKOFF.max_attempts())
            .map(|n| BACKOFF.delay(n, None).as_secs())
            .collect();
        assert_eq!(waits, [2, 4, 8, 16, 32]);
    }

    #[test]
    fn sas_urls_are_redacted() {
        let u = SasUrl::new(format!("https://md-x.blob.core.example/d/abcd?{SIG}"));
        assert_eq!(
            u.redacted(),
            "https://md-x.blob.core.example/d/abcd?***REDACTED***"
        );
        assert!(!format!("{u:?}").contains("S3CR3T"));
        let t = u.scrub(&format!("error for url ({}) and {SIG}", u.expose()));
        assert!(!t.contains("S3CR3T"), "{t}");
        assert_eq!(gib(3 << 30), "3.0 GiB");
    }
}
