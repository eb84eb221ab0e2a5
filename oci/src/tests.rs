//! `pull_rootfs` and `fetch_artifact` end to end on local OCI layouts: the marker, skipping and
//! rebuilding a destination, failures leaving nothing behind, artifacts with tar and file layers.

use std::path::Path;

use super::*;
use crate::manifest::{ANNOTATION_REF_NAME, ANNOTATION_TITLE, Platform, media_type};
use flex_testkit::layer_builder::{LayerBuilder, gzip, zstd};

fn client() -> RegistryClient {
    RegistryClient::new(flex_host::http::client().unwrap())
}

/// Writes an image of `layers` (tar streams, compressed as given) into a layout, tagged `tag`,
/// inside an index for the host's platform. Returns the manifest digest.
fn layout_image(dir: &Path, tag: &str, layers: &[(Vec<u8>, &str, Vec<u8>)]) -> Digest {
    let l = OciLayout::create(dir).unwrap();
    let diff_ids: Vec<String> = layers
        .iter()
        .map(|(tar, _, _)| Digest::of(tar).to_string())
        .collect();
    let config = serde_json::json!({
        "architecture": Arch::host().as_str(), "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    });
    let cfg = l
        .add_blob(
            media_type::OCI_CONFIG,
            &serde_json::to_vec(&config).unwrap(),
        )
        .unwrap();
    let descs = layers
        .iter()
        .map(|(_, mt, blob)| l.add_blob(mt, blob).unwrap())
        .collect();
    let m = ImageManifest::new(cfg, descs);
    let md = l
        .add_blob(media_type::OCI_MANIFEST, &serde_json::to_vec(&m).unwrap())
        .unwrap()
        .with_platform(Platform::linux(Arch::host()));
    let ix = ImageIndex::new(vec![md.clone()]);
    let ixd = l
        .add_blob(media_type::OCI_INDEX, &serde_json::to_vec(&ix).unwrap())
        .unwrap()
        .with_annotation(ANNOTATION_REF_NAME, tag);
    let mut top = l.index().unwrap_or_else(|_| ImageIndex::new(vec![]));
    top.manifests
        .retain(|d| d.annotation(ANNOTATION_REF_NAME) != Some(tag));
    top.manifests.push(ixd);
    l.set_index(&top).unwrap();
    md.digest
}

fn simple_layers(content: &[u8]) -> Vec<(Vec<u8>, &'static str, Vec<u8>)> {
    let mut b = LayerBuilder::new();
    b.dir("etc", 0o755).unwrap();
    b.file("etc/a", b"base", 0o644).unwrap();
    b.file("etc/gone", b"x", 0o644).unwrap();
    let l1 = b.finish().unwrap();
    let mut b = LayerBuilder::new();
    b.file("etc/b", content, 0o600).unwrap();
    b.whiteout("etc/gone").unwrap();
    let l2 = b.finish().unwrap();
    vec![
        (l1.clone(), media_type::OCI_LAYER_GZIP, gzip(&l1).unwrap()),
        (l2.clone(), media_type::OCI_LAYER_ZSTD, zstd(&l2).unwrap()),
    ]
}

fn src(dir: &Path, tag: &str) -> ImageSource {
    ImageSource::parse(&format!("oci-layout://{}:{tag}", dir.display())).unwrap()
}

fn siblings(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn pull_from_layout_writes_marker_and_leaves_nothing_beside() {
    let t = tempfile::tempdir().unwrap();
    let layout = t.path().join("layout");
    let md = layout_image(&layout, "v1", &simple_layers(b"one"));
    let machines = t.path().join("machines");
    std::fs::create_dir(&machines).unwrap();
    let dest = machines.join("kube1");
    let source = src(&layout, "v1");
    let info = pull_rootfs(&client(), &source, &dest, &PullOptions::default())
        .await
        .unwrap();
    assert_eq!(info.status, RootfsStatus::Unpacked);
    assert_eq!(info.manifest_digest, Some(md.clone()));
    assert_eq!(info.layers.len(), 2);
    assert_eq!(std::fs::read(dest.join("etc/a")).unwrap(), b"base");
    assert_eq!(std::fs::read(dest.join("etc/b")).unwrap(), b"one");
    assert!(!dest.join("etc/gone").exists());
    let marker: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dest.join(MARKER_FILE)).unwrap()).unwrap();
    assert_eq!(marker["reference"], source.to_string());
    assert_eq!(marker["manifestDigest"], md.to_string());
    assert_eq!(marker["layers"].as_array().unwrap().len(), 2);
    assert_eq!(siblings(&machines), ["kube1"]);
    assert_eq!(read_marker(&dest).unwrap().manifest_digest, Some(md));

    // Again: already present, untouched.
    std::fs::write(dest.join("etc/local"), b"kept").unwrap();
    let again = pull_rootfs(&client(), &source, &dest, &PullOptions::default())
        .await
        .unwrap();
    assert_eq!(again.status, RootfsStatus::AlreadyPresent);
    assert_eq!(again.manifest_digest, info.manifest_digest);
    assert!(dest.join("etc/local").exists());

    // Rebuild of our own tree, from a new image.
    let md2 = layout_image(&layout, "v1", &simple_layers(b"two"));
    let opts = PullOptions {
        rebuild_owned: true,
        ..PullOptions::default()
    };
    let rebuilt = pull_rootfs(&client(), &source, &dest, &opts).await.unwrap();
    assert_eq!(rebuilt.status, RootfsStatus::Unpacked);
    assert_eq!(rebuilt.manifest_digest, Some(md2));
    assert_eq!(std::fs::read(dest.join("etc/b")).unwrap(), b"two");
    assert!(!dest.join("etc/local").exists());
    assert_eq!(siblings(&machines), ["kube1"]);
}

/// Real files, nothing faked: a marker name that is a symlink (here to a valid marker outside
/// the tree) is not followed and does not make the tree ours; a regular marker does.
#[test]
fn a_symlink_at_the_marker_name_is_no_marker() {
    let t = tempfile::tempdir().unwrap();
    let outside = t.path().join("outside-marker");
    std::fs::write(&outside, br#"{"reference":"x"}"#).unwrap();
    let dest = t.path().join("kube1");
    std::fs::create_dir(&dest).unwrap();
    std::os::unix::fs::symlink(&outside, dest.join(MARKER_FILE)).unwrap();
    assert!(read_marker(&dest).is_none());
    std::fs::remove_file(dest.join(MARKER_FILE)).unwrap();
    std::fs::copy(&outside, dest.join(MARKER_FILE)).unwrap();
    assert!(read_marker(&dest).is_some());
}

#[tokio::test]
async fn a_tree_that_is_not_ours_is_never_touched() {
    let t = tempfile::tempdir().unwrap();
    let layout = t.path().join("layout");
    layout_image(&layout, "v1", &simple_layers(b"x"));
    let dest = t.path().join("kube1");
    std::fs::create_dir_all(dest.join("etc")).unwrap();
    std::fs::write(dest.join("etc/mine"), b"m").unwrap();
    let opts = PullOptions {
        rebuild_owned: true,
        ..PullOptions::default()
    };
    let info = pull_rootfs(&client(), &src(&layout, "v1"), &dest, &opts)
        .await
        .unwrap();
    assert_eq!(info.status, RootfsStatus::PreExisting);
    assert_eq!(info.manifest_digest, None);
    assert!(dest.join("etc/mine").exists());
    assert!(!dest.join("etc/a").exists());
    // An empty directory is filled.
    let empty = t.path().join("kube2");
    std::fs::create_dir(&empty).unwrap();
    let info = pull_rootfs(
        &client(),
        &src(&layout, "v1"),
        &empty,
        &PullOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(info.status, RootfsStatus::Unpacked);
    assert!(empty.join("etc/a").exists());
    // A file at dest is an error.
    let file = t.path().join("file");
    std::fs::write(&file, b"").unwrap();
    let e = pull_rootfs(
        &client(),
        &src(&layout, "v1"),
        &file,
        &PullOptions::default(),
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("not a directory"), "{e}");
}

#[tokio::test]
async fn a_failed_unpack_leaves_nothing_at_dest_and_cleans_the_partial_tree() {
    let t = tempfile::tempdir().unwrap();
    let layout = t.path().join("layout");
    let mut b = LayerBuilder::new();
    b.file("fine", b"ok", 0o644).unwrap();
    b.raw_file(b"../escape", b"pwned").unwrap();
    let evil = b.finish().unwrap();
    layout_image(
        &layout,
        "evil",
        &[(
            evil.clone(),
            media_type::OCI_LAYER_GZIP,
            gzip(&evil).unwrap(),
        )],
    );
    let machines = t.path().join("machines");
    std::fs::create_dir(&machines).unwrap();
    // A leftover partial tree from an earlier attempt is replaced, then removed.
    std::fs::create_dir_all(machines.join(".kube1.partial/junk")).unwrap();
    let dest = machines.join("kube1");
    let e = pull_rootfs(
        &client(),
        &src(&layout, "evil"),
        &dest,
        &PullOptions::default(),
    )
    .await
    .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("../escape") && msg.contains("refused"),
        "{msg}"
    );
    assert_eq!(siblings(&machines), Vec::<String>::new());
    assert!(!t.path().join("escape").exists());
}

#[tokio::test]
async fn layout_errors_name_the_source() {
    let t = tempfile::tempdir().unwrap();
    let layout = t.path().join("layout");
    let md = layout_image(&layout, "v1", &simple_layers(b"x"));
    let dest = t.path().join("d");
    let e = pull_rootfs(
        &client(),
        &src(&layout, "nope"),
        &dest,
        &PullOptions::default(),
    )
    .await
    .unwrap_err();
    assert!(
        e.to_string().contains("nope") && e.to_string().contains("v1"),
        "{e}"
    );
    // A corrupted layer in the layout.
    let l = OciLayout::open(&layout).unwrap();
    let r = l
        .resolve(&LayoutTarget::Tag("v1".into()), Arch::host())
        .unwrap();
    assert_eq!(r.digest, md);
    let p = l.blob_path(&r.manifest.layers[1].digest);
    let mut bytes = std::fs::read(&p).unwrap();
    bytes[10] ^= 1;
    std::fs::write(&p, bytes).unwrap();
    let e = pull_rootfs(
        &client(),
        &src(&layout, "v1"),
        &dest,
        &PullOptions::default(),
    )
    .await
    .unwrap_err();
    assert!(e.is_verification_failure(), "{e}");
    assert!(
        e.to_string().contains(r.manifest.layers[1].digest.as_str()),
        "{e}"
    );
    assert!(!dest.exists());
    // manifest_reachable still resolves the manifest.
    let d = manifest_reachable(&client(), &src(&layout, "v1"), Arch::host())
        .await
        .unwrap();
    assert_eq!(d, md);
}

#[tokio::test]
async fn fetch_artifact_extracts_tar_layers_and_titled_files() {
    let t = tempfile::tempdir().unwrap();
    let layout = t.path().join("layout");
    let l = OciLayout::create(&layout).unwrap();
    let mut b = LayerBuilder::new();
    b.dir("bin", 0o755).unwrap();
    b.file("bin/kubelet", b"ELF", 0o755).unwrap();
    let tar = b.finish().unwrap();
    let empty = l.add_blob(media_type::OCI_EMPTY, b"{}").unwrap();
    let layers = vec![
        l.add_blob(
            "application/vnd.example.bundle.tar+gzip",
            &gzip(&tar).unwrap(),
        )
        .unwrap(),
        l.add_blob("application/vnd.example.notes", b"hello notes")
            .unwrap()
            .with_annotation(ANNOTATION_TITLE, "NOTES.txt"),
        l.add_blob("application/octet-stream", &zstd(&tar).unwrap())
            .unwrap(),
    ];
    let mut m = ImageManifest::new(empty, layers);
    m.artifact_type = Some("application/vnd.example.bundle".into());
    let md = l
        .add_blob(media_type::OCI_MANIFEST, &serde_json::to_vec(&m).unwrap())
        .unwrap()
        .with_annotation(ANNOTATION_REF_NAME, "bundle");
    l.set_index(&ImageIndex::new(vec![md.clone()])).unwrap();
    let dest = t.path().join("out");
    let info = fetch_artifact(&client(), &src(&layout, "bundle"), &dest)
        .await
        .unwrap();
    assert_eq!(
        info.artifact_type.as_deref(),
        Some("application/vnd.example.bundle")
    );
    assert_eq!(info.manifest_digest, Some(md.digest));
    assert_eq!(std::fs::read(dest.join("bin/kubelet")).unwrap(), b"ELF");
    assert_eq!(
        std::fs::read(dest.join("NOTES.txt")).unwrap(),
        b"hello notes"
    );

    // A title that is a path is refused.
    let bad = l
        .add_blob("application/vnd.example.notes", b"x")
        .unwrap()
        .with_annotation(ANNOTATION_TITLE, "../evil");
    let empty = l.add_blob(media_type::OCI_EMPTY, b"{}").unwrap();
    let m = ImageManifest::new(empty, vec![bad]);
    let md = l
        .add_blob(media_type::OCI_MANIFEST, &serde_json::to_vec(&m).unwrap())
        .unwrap()
        .with_annotation(ANNOTATION_REF_NAME, "bad");
    l.set_index(&ImageIndex::new(vec![md])).unwrap();
    let e = fetch_artifact(&client(), &src(&layout, "bad"), &dest)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("../evil"), "{e}");
    assert!(!t.path().join("evil").exists());
}
