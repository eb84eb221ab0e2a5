//! Getting images into the local registry: an OCI layout pushed as it is (the agent's image),
//! a directory tree packed into a one-layer image (the machine rootfs), a directory packed
//! as an artifact (the offline component bundle), and an image already there with one layer
//! appended (the upgrade group's candidates, [`push_appended`]).

use std::path::Path;

use bytes::Bytes;
use flex_oci::{ImageRef, OciLayout, RegistryClient};

/// Pushes the (single-platform) image of an OCI layout as `reference`; returns the manifest
/// digest.
pub async fn push_layout(
    client: &RegistryClient,
    layout_dir: &Path,
    reference: &str,
) -> anyhow::Result<String> {
    let image = ImageRef::parse(reference)?;
    let layout = OciLayout::open(layout_dir)?;
    let index = layout.index()?;
    let desc = index
        .manifests
        .first()
        .ok_or_else(|| anyhow::anyhow!("{}: empty index", layout_dir.display()))?;
    let manifest_bytes = layout.read_blob(desc, "manifest")?;
    let manifest: flex_oci::ImageManifest = serde_json::from_slice(&manifest_bytes)?;
    let config = layout.read_blob(&manifest.config, "config")?;
    client
        .push_blob(&image, &manifest.config.media_type, Bytes::from(config))
        .await?;
    for l in &manifest.layers {
        // read_blob caps sizes for documents; layers are read from their verified path.
        let data = std::fs::read(layout.verify_blob(l, "layer")?)?;
        client
            .push_blob(&image, &l.media_type, Bytes::from(data))
            .await?;
    }
    let tag = image.tag.clone().unwrap_or_else(|| "latest".into());
    let digest = client
        .push_manifest(&image, &tag, &desc.media_type, Bytes::from(manifest_bytes))
        .await?;
    Ok(digest.to_string())
}

/// Packs `tree` as a one-layer image and pushes it as `reference`; returns the manifest
/// digest. The layer is made with GNU tar (ownership, hard links and modes kept; names sorted;
/// mtimes clamped to `epoch`) and `gzip -n`, so the same tree gives the same digest.
pub async fn push_tree_image(
    r: &dyn flex_host::runner::Runner,
    client: &RegistryClient,
    tree: &Path,
    reference: &str,
    epoch: u64,
    work: &Path,
) -> anyhow::Result<String> {
    let config = TreeImage {
        cmd: &["/sbin/init"],
        created_by: "cargo xtask up: machine rootfs fixture",
        for_pods: false,
    };
    push_tree_image_with(r, client, tree, reference, epoch, work, &config).await
}

/// What a tree image's config says.
pub struct TreeImage<'a> {
    /// Its command.
    pub cmd: &'a [&'a str],
    /// Its history entry.
    pub created_by: &'a str,
    /// For a pod (unpacked by a containerd inside a machine, which may not make device nodes or
    /// set security xattrs): without `/dev`'s entries and without xattrs.
    pub for_pods: bool,
}

/// [`push_tree_image`] with another command and history entry.
pub async fn push_tree_image_with(
    r: &dyn flex_host::runner::Runner,
    client: &RegistryClient,
    tree: &Path,
    reference: &str,
    epoch: u64,
    work: &Path,
    image: &TreeImage<'_>,
) -> anyhow::Result<String> {
    use flex_host::runner::Cmd;
    use sha2::{Digest as _, Sha256};
    let tar_path = work.join("layer.tar");
    r.run(
        &Cmd::new("tar")
            .args(["--sort=name", "--numeric-owner"])
            .args(
                if image.for_pods {
                    ["--exclude=./dev/*", "--format=posix"]
                } else {
                    ["--xattrs", "--format=posix"]
                }
                .iter()
                .copied(),
            )
            .arg(format!("--mtime=@{epoch}"))
            .args([
                "--clamp-mtime",
                "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime",
            ])
            .arg("-C")
            .arg(tree.display().to_string())
            .arg("-cf")
            .arg(tar_path.display().to_string())
            .arg(".")
            .timeout(std::time::Duration::from_secs(600)),
    )
    .await?;
    let tar = std::fs::read(&tar_path)?;
    let diff_id = format!("sha256:{}", hex::encode(Sha256::digest(&tar)));
    r.run(
        &Cmd::new("gzip")
            .args(["-n", "-6", "-f"])
            .arg(tar_path.display().to_string())
            .timeout(std::time::Duration::from_secs(600)),
    )
    .await?;
    let gz = std::fs::read(work.join("layer.tar.gz"))?;
    let config = flex_image::oci::config_json(
        &flex_image::ImageConfig {
            architecture: flex_image::oci::host_architecture().to_string(),
            os: "linux".into(),
            created: epoch,
            cmd: image.cmd.iter().map(|c| c.to_string()).collect(),
            created_by: image.created_by.to_string(),
            ..Default::default()
        },
        &[diff_id],
    )?;
    let image = ImageRef::parse(reference)?;
    let desc = client
        .push_image(
            &image,
            Bytes::from(config),
            vec![(
                "application/vnd.oci.image.layer.v1.tar+gzip".to_string(),
                Bytes::from(gz),
            )],
        )
        .await?;
    Ok(desc.digest.to_string())
}

/// Pushes, into the repository of `base` (`registry/repo@sha256:…`, already in the registry),
/// the image `base` with `layer` appended ([`flex_image::derive::append_layer`]), tagged `tag`.
/// Only the new layer, the new config and the manifest are uploaded: the base's layers are in
/// the same repository already. Returns the new manifest's digest.
pub async fn push_appended(
    client: &RegistryClient,
    base: &str,
    tag: &str,
    layer: &flex_image::LayerBlob,
    created_by: &str,
    work: &Path,
) -> anyhow::Result<String> {
    use flex_oci::manifest::Manifest;
    let image = ImageRef::parse(base)?;
    let digest = image
        .digest
        .clone()
        .ok_or_else(|| anyhow::anyhow!("{base} is not pinned by digest"))?;
    let fetched = client.fetch_manifest(&image, digest.as_str(), None).await?;
    let Manifest::Image(manifest) = &fetched.manifest else {
        anyhow::bail!("{base} is an index, not an image manifest");
    };
    let config_path = work.join("base-config.json");
    client
        .pull_blob(&image, &manifest.config, &config_path, "config")
        .await?;
    let config = std::fs::read(&config_path)?;
    let derived = flex_image::derive::append_layer(&fetched.bytes, &config, layer, created_by)?;
    client
        .push_blob(&image, &layer.media_type, Bytes::from(layer.data.clone()))
        .await?;
    client
        .push_blob(
            &image,
            &derived.config_media_type,
            Bytes::from(derived.config.clone()),
        )
        .await?;
    let pushed = client
        .push_manifest(
            &image,
            tag,
            &derived.manifest_media_type,
            Bytes::from(derived.manifest.clone()),
        )
        .await?;
    if pushed.as_str() != derived.manifest_digest {
        anyhow::bail!(
            "pushed manifest {pushed}, expected {}",
            derived.manifest_digest
        );
    }
    Ok(derived.manifest_digest)
}

/// Whether the registry still has the manifest `reference` names (`registry/repo@sha256:…`):
/// `false` when it answers 404, an error when it cannot be asked.
pub async fn manifest_present(client: &RegistryClient, reference: &str) -> anyhow::Result<bool> {
    use flex_oci::OciError;
    let image = ImageRef::parse(reference)?;
    let digest = image
        .digest
        .clone()
        .ok_or_else(|| anyhow::anyhow!("{reference} is not pinned by digest"))?;
    match client.fetch_manifest(&image, digest.as_str(), None).await {
        Ok(_) => Ok(true),
        Err(OciError::Status { status: 404, .. }) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// `repository@digest` for a pushed image.
pub fn pinned(repository: &str, digest: &str) -> String {
    let repo = repository.split_once('@').map_or(repository, |(r, _)| r);
    let repo = match repo.rsplit_once(':') {
        Some((r, tag)) if !tag.contains('/') => r,
        _ => repo,
    };
    format!("{repo}@{digest}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Real: the choice of tar options. Faked: tar (a recording runner, so no layer is made and
    /// the push stops there). A pod image leaves out `/dev`'s entries and xattrs, which a
    /// containerd inside a machine cannot make; the machine rootfs keeps xattrs.
    #[tokio::test]
    async fn pod_images_leave_out_dev_entries_and_xattrs() {
        let client = crate::vm::registry_client("127.0.0.1:1").unwrap();
        let work = tempfile::tempdir().unwrap();
        for (for_pods, want, not) in [
            (true, "--exclude=./dev/*", "--xattrs"),
            (false, "--xattrs", "--exclude=./dev/*"),
        ] {
            let r = flex_testkit::FakeRunner::new();
            let image = TreeImage {
                cmd: &["/bin/sh"],
                created_by: "test",
                for_pods,
            };
            let e = push_tree_image_with(
                &r,
                &client,
                Path::new("/tree"),
                "127.0.0.1:1/x:y",
                1,
                work.path(),
                &image,
            )
            .await;
            assert!(e.is_err(), "no layer was made");
            let tar = r
                .calls()
                .into_iter()
                .find(|c| c.starts_with("tar "))
                .unwrap();
            assert!(tar.contains(want), "{tar}");
            assert!(!tar.contains(not), "{tar}");
        }
    }

    #[test]
    fn pinning_strips_tags() {
        assert_eq!(
            pinned("10.0.2.100:5000/aks-flex/agent:dev", "sha256:ab"),
            "10.0.2.100:5000/aks-flex/agent@sha256:ab"
        );
        assert_eq!(
            pinned("10.0.2.100:5000/aks-flex/agent", "sha256:ab"),
            "10.0.2.100:5000/aks-flex/agent@sha256:ab"
        );
    }
}
