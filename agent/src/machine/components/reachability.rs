//! Preflight: are the component artifacts reachable? Three checks, as upstream:
//! [`CHECK_KUBERNETES`] (kubelet, kubectl, kube-proxy), [`CHECK_CRI`] (containerd, runc,
//! crictl) and [`CHECK_CNI`] (CNI plugins).
//!
//! Downloads are probed with `HEAD`, falling back to `GET` with `Range: bytes=0-0` (some
//! mirrors refuse `HEAD`); nothing is downloaded in full. With offline artifacts the bundle is
//! checked instead: a directory is listed, an archive's member names are read (every file
//! the layout requires must be there), an `oci://` artifact's manifest is resolved (its layers
//! are not fetched, so its file list is checked only at install time). Messages name artifacts and HTTP statuses, never
//! URLs or paths.

use std::path::Path;
use std::time::Duration;

use futures::future::join_all;

use super::archive;
use super::offline::{self, ArtifactFetcher, BundleIndex, OciArtifactFetcher, OfflineSource};
use super::plan::{ComponentPlan, PlanSource};
use super::spec::{Component, Location, Payload};
use crate::machine::seams::ProbeError;
use flex_host::fs::HostFs;

pub use super::spec::{CHECK_CNI, CHECK_CRI, CHECK_KUBERNETES};

const CHECKS: [&str; 3] = [CHECK_KUBERNETES, CHECK_CRI, CHECK_CNI];

/// Deadline of one probe request.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

fn unreachable_message(check: &str) -> &'static str {
    match check {
        CHECK_KUBERNETES => "one or more required Kubernetes artifact sources are not reachable",
        CHECK_CRI => "one or more required CRI artifact sources are not reachable",
        _ => "required CNI artifact source is not reachable",
    }
}

/// Runs the three checks on the real host (offline bundle paths under `/`); `oci://` bundles
/// are fetched with [`OciArtifactFetcher`]. Returns `(check name, Ok or a message without
/// URLs)` for [`CHECK_KUBERNETES`], [`CHECK_CRI`], [`CHECK_CNI`], in that order.
pub async fn check_reachable(
    http: &reqwest::Client,
    registry: &flex_oci::RegistryClient,
    plan: &ComponentPlan,
) -> Vec<(String, Result<(), ProbeError>)> {
    let fetcher = OciArtifactFetcher::new(registry.clone());
    check_reachable_with(&HostFs::host(), &fetcher, http, plan).await
}

/// [`check_reachable`] with offline bundle paths read through `fs` and `oci://` bundles fetched
/// by `fetcher`.
pub async fn check_reachable_with(
    fs: &HostFs,
    fetcher: &dyn ArtifactFetcher,
    http: &reqwest::Client,
    plan: &ComponentPlan,
) -> Vec<(String, Result<(), ProbeError>)> {
    let problems: Vec<(Component, String)> = match &plan.source {
        PlanSource::Online { specs, .. } => {
            // node-problem-detector is optional and has no check here.
            let wanted = specs.iter().filter(|s| s.component != Component::Npd);
            let probes = wanted.flat_map(|s| {
                let urls: Vec<(String, &str)> = match &s.payload {
                    Payload::Verified(bins) => bins
                        .iter()
                        .filter_map(|b| url_of(&b.source).map(|u| (b.name.clone(), u)))
                        .collect(),
                    Payload::Archive { source, .. } | Payload::File { source, .. } => {
                        url_of(source)
                            .map(|u| (s.component.name().to_string(), u))
                            .into_iter()
                            .collect()
                    }
                };
                urls.into_iter().map(move |(label, url)| async move {
                    probe(http, url)
                        .await
                        .err()
                        .map(|why| (s.component, format!("{label} ({why})")))
                })
            });
            join_all(probes).await.into_iter().flatten().collect()
        }
        PlanSource::Offline {
            source, versions, ..
        } => match offline_index(fs, fetcher, source).await {
            Err(why) => Component::ALL
                .iter()
                .map(|c| (*c, format!("offline artifact bundle cannot be read: {why}")))
                .collect(),
            Ok(OfflineIndex::ManifestOnly) => Vec::new(),
            Ok(OfflineIndex::Files(index)) => Component::ALL
                .iter()
                .filter_map(|c| {
                    offline::bundle_spec(*c, &index, Path::new("/"), versions, &plan.arch)
                        .err()
                        .map(|e| (*c, e.to_string()))
                })
                .collect(),
        },
    };
    CHECKS
        .iter()
        .map(|check| {
            let mine: Vec<&str> = problems
                .iter()
                .filter(|(c, _)| c.check() == *check)
                .map(|(_, m)| m.as_str())
                .collect();
            let result = if mine.is_empty() {
                Ok(())
            } else if plan.is_offline() {
                Err(ProbeError::Unreachable(mine.join("; ")))
            } else {
                Err(ProbeError::Unreachable(format!(
                    "{}: {}",
                    unreachable_message(check),
                    mine.join(", ")
                )))
            };
            (check.to_string(), result)
        })
        .collect()
}

fn url_of(l: &Location) -> Option<&str> {
    match l {
        Location::Url(u) => Some(u),
        Location::File(_) => None,
    }
}

/// `HEAD`, then `GET` with `Range: bytes=0-0`; the reason has no URL. (A private `String`:
/// the reason only becomes part of a [`ProbeError`]'s message.)
async fn probe(http: &reqwest::Client, url: &str) -> Result<(), String> {
    if let Ok(r) = http.head(url).timeout(PROBE_TIMEOUT).send().await
        && r.status().is_success()
    {
        return Ok(());
    }
    match http
        .get(url)
        .header(reqwest::header::RANGE, "bytes=0-0")
        .timeout(PROBE_TIMEOUT)
        .send()
        .await
    {
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) => Err(format!("HTTP {}", r.status().as_u16())),
        Err(e) if e.is_timeout() => Err("timed out".into()),
        Err(e) if e.is_connect() => Err("connection failed".into()),
        Err(_) => Err("request failed".into()),
    }
}

/// What preflight learns about an offline bundle.
enum OfflineIndex {
    /// Its file list.
    Files(BundleIndex),
    /// Only that an `oci://` artifact's manifest resolves (its layers are not fetched).
    ManifestOnly,
}

/// The bundle's file list, or for `oci://` whether its manifest resolves. (A private `String`:
/// the reason only becomes part of a [`ProbeError`]'s message.)
async fn offline_index(
    fs: &HostFs,
    fetcher: &dyn ArtifactFetcher,
    source: &OfflineSource,
) -> Result<OfflineIndex, String> {
    match source {
        OfflineSource::Directory(p) => {
            let real = fs.path(p);
            if !real.is_dir() {
                return Err("the source is not a directory".into());
            }
            BundleIndex::from_dir(&real)
                .map(OfflineIndex::Files)
                .map_err(|e| e.kind().to_string())
        }
        OfflineSource::Archive(p) => {
            let real = fs.path(p);
            let names = tokio::task::spawn_blocking(move || archive::list_regular(&real))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| match e {
                    super::error::Failure::Io(io) => io.kind().to_string(),
                    other => other.to_string(),
                })?;
            Ok(OfflineIndex::Files(BundleIndex::from_archive_names(names)))
        }
        OfflineSource::Oci(reference) => {
            fetcher
                .check(reference)
                .await
                .map_err(|_| "the OCI artifact's manifest is not reachable".to_string())?;
            Ok(OfflineIndex::ManifestOnly)
        }
    }
}
