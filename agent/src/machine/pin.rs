//! A machine image named by tag is resolved once: the digest it resolved to at the first
//! provision is recorded ([`PINNED_IMAGE_PATH`], a checksummed record) and every later
//! provision (a repave's new side, a machine rebuilt) pulls that digest, so whoever moves the
//! tag later does not choose what the node's next machine runs (#29). The record goes with
//! `reset` (it is under `/etc/aks-flex-node`), so the next bootstrap resolves the tag afresh;
//! a config that names another image, or the same one by digest, does not use it.
//!
//! [`plan`] decides (pure, table-tested); [`crate::machine::node`] reads and writes the record
//! around its pull.

use std::future::Future;

use serde::{Deserialize, Serialize};

use flex_host::fs::HostFs;
use flex_oci::{ImageInfo, ImageSource, OciError};

use crate::state::JsonStore;

/// Where the digest is recorded.
pub const PINNED_IMAGE_PATH: &str = "/etc/aks-flex-node/machine-image.json";

/// The record: the image as the config names it, and the digest it resolved to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PinnedImage {
    /// Format version (1).
    pub version: u32,
    /// The reference as configured (a tag, no digest).
    pub reference: String,
    /// The digest it resolved to (the index's, for a multi-platform image).
    pub digest: String,
}

/// What to pull, and whether to record what it resolves to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The source to pull.
    pub source: ImageSource,
    /// Record the digest it resolves to (a tag seen for the first time).
    pub record: bool,
    /// The recorded digest was used.
    pub pinned: bool,
}

/// What to pull for `configured` given the `recorded` pin.
pub fn plan(configured: &ImageSource, recorded: Option<&PinnedImage>) -> Plan {
    let as_is = |record| Plan {
        source: configured.clone(),
        record,
        pinned: false,
    };
    let ImageSource::Registry(image) = configured else {
        return as_is(false);
    };
    if image.digest.is_some() {
        return as_is(false);
    }
    match recorded {
        Some(r) if r.reference == configured.to_string() => {
            match flex_oci::Digest::parse(&r.digest) {
                Ok(d) => Plan {
                    source: ImageSource::Registry(image.with_digest(d)),
                    record: false,
                    pinned: true,
                },
                // A record that does not parse is no pin: resolve again and record that.
                Err(_) => as_is(true),
            }
        }
        _ => as_is(true),
    }
}

/// Pulls `configured` with `pull` as [`plan`] says, reading and writing the record on `fs`: the
/// recorded digest when there is one for this tag; otherwise the tag, and then the digest it
/// resolved to is recorded (with a warning that the image is not pinned). An unreadable record
/// counts as none.
pub async fn pull<F, Fut>(
    fs: &HostFs,
    configured: &ImageSource,
    pull: F,
) -> anyhow::Result<ImageInfo>
where
    F: FnOnce(ImageSource) -> Fut,
    Fut: Future<Output = Result<ImageInfo, OciError>>,
{
    let pins = JsonStore::<PinnedImage>::at(fs.clone(), PINNED_IMAGE_PATH);
    let recorded = pins.load().unwrap_or_else(|e| {
        tracing::warn!(error = %e, path = PINNED_IMAGE_PATH, "the machine image's recorded digest is unreadable; resolving the tag again");
        None
    });
    let planned = plan(configured, recorded.as_ref());
    if planned.pinned {
        tracing::info!(image = %configured, pull = %planned.source, "machine image named by tag: pulling the digest it resolved to before");
    }
    let info = pull(planned.source).await?;
    let resolved = info.index_digest.clone().or(info.manifest_digest.clone());
    if let (true, Some(digest)) = (planned.record, resolved) {
        tracing::warn!(image = %configured, %digest, "machine image named by tag, not by digest: resolved now and kept for this node's later machines; pin it in the config (repository@sha256:...)");
        pins.save(&PinnedImage {
            version: 1,
            reference: configured.to_string(),
            digest: digest.to_string(),
        })?;
    }
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

    fn src(s: &str) -> ImageSource {
        ImageSource::parse(s).unwrap()
    }

    fn rec(reference: &str, digest: &str) -> PinnedImage {
        PinnedImage {
            version: 1,
            reference: reference.into(),
            digest: digest.into(),
        }
    }

    #[test]
    fn a_tag_is_resolved_once_and_its_digest_kept() {
        let tag = src("ghcr.io/azure/agent-ubuntu2404:v20260619");
        // First provision: pull the tag, record its digest.
        assert_eq!(
            plan(&tag, None),
            Plan {
                source: tag.clone(),
                record: true,
                pinned: false
            }
        );
        // Later: the recorded digest, whatever the tag points at now.
        let pinned = plan(&tag, Some(&rec(&tag.to_string(), D)));
        assert!(pinned.pinned && !pinned.record);
        assert_eq!(
            pinned.source.to_string(),
            format!("ghcr.io/azure/agent-ubuntu2404@{D}")
        );
        // Another image configured: resolved afresh, and recorded.
        let other = src("ghcr.io/azure/agent-ubuntu2404:v20261001");
        assert_eq!(plan(&other, Some(&rec(&tag.to_string(), D))).source, other);
        assert!(plan(&other, Some(&rec(&tag.to_string(), D))).record);
        // A digest in the config wins, and needs no record.
        let by_digest = src(&format!("ghcr.io/azure/agent-ubuntu2404@{D}"));
        assert_eq!(
            plan(&by_digest, Some(&rec(&tag.to_string(), D))),
            Plan {
                source: by_digest.clone(),
                record: false,
                pinned: false
            }
        );
        // A damaged digest in the record: resolve again.
        let bad = plan(&tag, Some(&rec(&tag.to_string(), "sha256:zz")));
        assert_eq!((bad.source, bad.record), (tag.clone(), true));
        // A local layout is not a registry tag.
        let layout = src("oci-layout:///var/lib/images/rootfs:v1");
        assert!(!plan(&layout, None).record);
    }

    /// The pull faked at its seam (what it was asked, what it resolved to); the record on a
    /// real temporary root through the state store: the first pull of a tag records the
    /// index's digest, the next pulls that digest, and a damaged record is resolved again.
    #[tokio::test]
    async fn the_first_pull_records_the_digest_and_the_next_pulls_it() {
        let fake = flex_testkit::FakeHost::new().unwrap();
        let fs = &fake.host.fs;
        let tag = src("registry.local/machine:v1");
        let asked = std::sync::Mutex::new(Vec::new());
        let fake_pull = |index: Option<&str>| {
            let asked = &asked;
            let index = index.map(|d| flex_oci::Digest::parse(d).unwrap());
            move |s: ImageSource| async move {
                asked.lock().unwrap().push(s.to_string());
                let mut info = ImageInfo::pre_existing(&s.to_string());
                info.manifest_digest =
                    Some(flex_oci::Digest::parse(&format!("sha256:{}", "2".repeat(64))).unwrap());
                info.index_digest = index;
                Ok(info)
            }
        };
        pull(fs, &tag, fake_pull(Some(D))).await.unwrap();
        pull(fs, &tag, fake_pull(None)).await.unwrap();
        assert_eq!(
            asked.lock().unwrap().as_slice(),
            [
                "registry.local/machine:v1".to_string(),
                format!("registry.local/machine@{D}")
            ]
        );
        let kept = JsonStore::<PinnedImage>::at(fs.clone(), PINNED_IMAGE_PATH)
            .load()
            .unwrap()
            .unwrap();
        assert_eq!(kept, rec("registry.local/machine:v1", D));
        // A damaged record: the tag again, and a new record.
        let path = fake
            .root
            .path()
            .join(PINNED_IMAGE_PATH.trim_start_matches('/'));
        std::fs::write(&path, b"{ not a record").unwrap();
        asked.lock().unwrap().clear();
        pull(fs, &tag, fake_pull(Some(D))).await.unwrap();
        assert_eq!(
            asked.lock().unwrap().as_slice(),
            ["registry.local/machine:v1"]
        );
        assert!(
            JsonStore::<PinnedImage>::at(fs.clone(), PINNED_IMAGE_PATH)
                .load()
                .is_ok()
        );
    }
}
