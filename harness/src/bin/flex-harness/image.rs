//! `cargo xtask image`: the agent's container image without a container engine.
//!
//! Builds `aks-flex-node` reproducibly (`cargo build --release --locked` with
//! `SOURCE_DATE_EPOCH` = the HEAD commit time and the workspace and cargo home paths remapped),
//! then [`flex_image::build_agent_image`] writes the OCI layout `<out>/aks-flex-node-agent/` and
//! the archive `<out>/aks-flex-node-agent.tar`. `--check-reproducible` assembles the image a
//! second time from the same binary into a temporary directory and fails unless the digests and
//! the archive bytes match.
//!
//! `--controller` builds `aks-flex-controller` the same way and assembles its image with the
//! same builder ([`flex_image::Layer`], [`flex_image::write_oci_layout`]): the binary at
//! `/usr/local/bin/aks-flex-controller` (the entrypoint), its shared libraries, the CA bundle,
//! `/etc/passwd` and `/etc/group` with the `nonroot` user (65532) the Deployment runs as and
//! `/tmp`; written to `<out>/aks-flex-controller/` and `<out>/aks-flex-controller.tar`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use flex_host::runner::{Cmd, ProcessRunner, Runner, run_inherited};
use flex_image::{
    AgentImageOptions, Image, ImageConfig, ImageInfo, Layer, build_agent_image, write_oci_archive,
    write_oci_layout,
};

const LONG: Duration = Duration::from_secs(3600);

async fn git(root: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = ProcessRunner::new()
        .run(
            &Cmd::new("git")
                .arg("-C")
                .arg(root.to_string_lossy())
                .args(args.iter().copied()),
        )
        .await?;
    Ok(out.stdout.trim().to_string())
}

/// The rustc flags that take the build machine's paths out of the binary.
fn remap_flags(root: &Path) -> Vec<String> {
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from("/root/.cargo"));
    vec![
        format!("--remap-path-prefix={}=/src", root.display()),
        format!("--remap-path-prefix={}=/cargo", cargo_home.display()),
    ]
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn print_info(info: &ImageInfo) {
    println!("image     {}", info.reference);
    println!("manifest  {}", info.manifest_digest);
    println!("config    {}", info.config_digest);
    println!("layer     {} (diff_id {})", info.layer_digest, info.diff_id);
    println!(
        "size      {} compressed, {} uncompressed ({} / {} bytes)",
        mib(info.compressed_size),
        mib(info.uncompressed_size),
        info.compressed_size,
        info.uncompressed_size
    );
    println!(
        "budget    {}",
        flex_image::agent::AGENT_BUDGET.verdict(info.compressed_size, info.uncompressed_size)
    );
    println!("layout    {}", info.layout_dir.display());
    println!(
        "archive   {} ({})",
        info.archive.display(),
        mib(info.archive_size)
    );
    println!(
        "libraries {}",
        info.libraries
            .iter()
            .map(|l| l.display().to_string())
            .collect::<Vec<_>>()
            .join(" ")
    );
}

/// Runs the task.
pub async fn run(out: Option<PathBuf>, check_reproducible: bool) -> anyhow::Result<()> {
    let root = crate::project_root();
    let out = out.unwrap_or_else(|| root.join("target/image"));
    let (info, binary, opts) = build(&out).await?;
    print_info(&info);
    if check_reproducible {
        check(&info, &binary, &opts).await?;
    }
    Ok(())
}

/// Builds the binary and the image into `out`; returns the image, the binary and the options.
pub async fn build(out: &Path) -> anyhow::Result<(ImageInfo, PathBuf, AgentImageOptions)> {
    let (binary, epoch, revision) = cargo_release("aks-flex-node", "aks-flex-node").await?;
    let mut opts = AgentImageOptions::new(env!("CARGO_PKG_VERSION"), epoch);
    opts.revision = Some(revision);
    let info = build_agent_image(&binary, out, &opts).await?;
    Ok((info, binary, opts))
}

/// `cargo build --release -p <package>` reproducibly; returns the binary `<bin>`, the epoch
/// (HEAD's commit time) and HEAD's revision.
/// `aks-flex-controller` built for this host (release): its path, the commit time and revision.
pub async fn controller_binary() -> anyhow::Result<(PathBuf, u64, String)> {
    cargo_release("aks-flex-controller", "aks-flex-controller").await
}

async fn cargo_release(package: &str, bin: &str) -> anyhow::Result<(PathBuf, u64, String)> {
    let root = crate::project_root();
    let epoch: u64 = git(&root, &["log", "-1", "--format=%ct"])
        .await?
        .parse()
        .context("git log -1 --format=%ct: not a number")?;
    let revision = git(&root, &["rev-parse", "HEAD"]).await?;
    let flags = remap_flags(&root);
    eprintln!("xtask image: cargo build --release -p {package} (SOURCE_DATE_EPOCH={epoch})");
    run_inherited(
        &Cmd::new("cargo")
            .args(["build", "--release", "-p", package, "--locked"])
            .arg("--manifest-path")
            .arg(root.join("Cargo.toml").to_string_lossy())
            .env("SOURCE_DATE_EPOCH", epoch.to_string())
            .env("RUSTFLAGS", flags.join(" "))
            // Takes precedence over RUSTFLAGS and survives paths with spaces.
            .env("CARGO_ENCODED_RUSTFLAGS", flags.join("\u{1f}"))
            .timeout(LONG),
    )
    .await?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|t| if t.is_absolute() { t } else { root.join(t) })
        .unwrap_or_else(|| root.join("target"));
    let binary = target.join("release").join(bin);
    if !binary.is_file() {
        bail!("{} was not built", binary.display());
    }
    Ok((binary, epoch, revision))
}

/// The controller image's repository name.
pub const CONTROLLER_IMAGE: &str = "aks-flex-controller";
/// The controller binary's path in its image (the entrypoint).
pub const CONTROLLER_BINARY: &str = "/usr/local/bin/aks-flex-controller";
/// The user the controller runs as (distroless `nonroot`).
pub const CONTROLLER_UID: u32 = 65532;

/// Builds `aks-flex-controller` and its image into `out` (default `<workspace>/target/image`).
pub async fn run_controller(out: Option<PathBuf>) -> anyhow::Result<()> {
    let out = out.unwrap_or_else(|| crate::project_root().join("target/image"));
    let (binary, epoch, revision) =
        cargo_release("aks-flex-controller", "aks-flex-controller").await?;
    let libraries = flex_image::agent::shared_libraries(&binary).await?;
    let (name, digest, archive) = build_controller_image(
        &binary,
        &libraries,
        Path::new(flex_image::agent::CA_BUNDLE),
        &out,
        epoch,
        Some(&revision),
    )?;
    println!("image     {name}");
    println!("manifest  {digest}");
    println!("archive   {}", archive.display());
    Ok(())
}

/// The controller's layer: binary, libraries, CA bundle, the `nonroot` user, `/tmp`.
pub fn controller_layer(
    binary: &Path,
    libraries: &[PathBuf],
    ca_bundle: &Path,
) -> anyhow::Result<Layer> {
    let mut l = Layer::new();
    l.file_from(CONTROLLER_BINARY, Some(0o755), binary)
        .with_context(|| format!("the controller binary {}", binary.display()))?;
    for lib in libraries {
        let path = lib
            .to_str()
            .filter(|p| p.starts_with('/'))
            .with_context(|| format!("library path {} is not absolute UTF-8", lib.display()))?;
        l.file_from(path, None, lib)?;
    }
    l.file_from(flex_image::agent::CA_BUNDLE, Some(0o644), ca_bundle)
        .with_context(|| {
            format!(
                "the CA bundle {} (Debian package ca-certificates)",
                ca_bundle.display()
            )
        })?;
    l.file(
        "/etc/passwd",
        0o644,
        format!("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:{CONTROLLER_UID}:{CONTROLLER_UID}:nonroot:/home/nonroot:/sbin/nologin\n"),
    )?;
    l.file(
        "/etc/group",
        0o644,
        format!("root:x:0:\nnonroot:x:{CONTROLLER_UID}:\n"),
    )?;
    l.file(
        "/etc/nsswitch.conf",
        0o644,
        flex_image::agent::NSSWITCH_CONF,
    )?;
    l.dir("/tmp", 0o1777)?;
    Ok(l)
}

/// Writes the controller's image (`aks-flex-controller:<version>`) as the OCI layout
/// `<out>/aks-flex-controller/` and the archive `<out>/aks-flex-controller.tar`; returns the
/// reference, the manifest digest and the archive path.
pub fn build_controller_image(
    binary: &Path,
    libraries: &[PathBuf],
    ca_bundle: &Path,
    out: &Path,
    epoch: u64,
    revision: Option<&str>,
) -> anyhow::Result<(String, String, PathBuf)> {
    let version = env!("CARGO_PKG_VERSION");
    let layer = controller_layer(binary, libraries, ca_bundle)?.build(epoch, 9)?;
    let mut labels = std::collections::BTreeMap::from([
        (
            "org.opencontainers.image.title".to_string(),
            CONTROLLER_IMAGE.to_string(),
        ),
        (
            "org.opencontainers.image.description".to_string(),
            "AKS Flex in-cluster machine endpoint (runs as 65532, listens on :8080)".to_string(),
        ),
        (
            "org.opencontainers.image.version".to_string(),
            version.to_string(),
        ),
        (
            "org.opencontainers.image.created".to_string(),
            flex_image::oci::rfc3339(epoch),
        ),
    ]);
    let mut annotations = std::collections::BTreeMap::from([(
        "org.opencontainers.image.version".to_string(),
        version.to_string(),
    )]);
    if let Some(rev) = revision {
        labels.insert("org.opencontainers.image.revision".into(), rev.to_string());
        annotations.insert("org.opencontainers.image.revision".into(), rev.to_string());
    }
    let image = Image {
        name: format!("{CONTROLLER_IMAGE}:{version}"),
        config: ImageConfig {
            architecture: flex_image::oci::host_architecture().to_string(),
            os: "linux".into(),
            created: epoch,
            env: vec![
                "PATH=/usr/local/bin:/usr/bin:/bin".into(),
                format!("SSL_CERT_FILE={}", flex_image::agent::CA_BUNDLE),
            ],
            entrypoint: vec![CONTROLLER_BINARY.into()],
            cmd: Vec::new(),
            working_dir: "/".into(),
            labels,
            created_by: "cargo xtask image --controller".into(),
        },
        layers: vec![layer],
        annotations,
    };
    std::fs::create_dir_all(out).with_context(|| format!("create {}", out.display()))?;
    let layout = out.join(CONTROLLER_IMAGE);
    if layout.exists() {
        std::fs::remove_dir_all(&layout)
            .with_context(|| format!("remove the old layout {}", layout.display()))?;
    }
    let written = write_oci_layout(&layout, std::slice::from_ref(&image))?;
    let w = written
        .into_iter()
        .next()
        .context("the layout holds no image")?;
    let archive = out.join(format!("{CONTROLLER_IMAGE}.tar"));
    write_oci_archive(&layout, &archive, epoch)?;
    Ok((w.name, w.manifest.digest, archive))
}

async fn check(info: &ImageInfo, binary: &Path, opts: &AgentImageOptions) -> anyhow::Result<()> {
    {
        let tmp = tempfile::tempdir().context("create a temporary directory")?;
        let again = build_agent_image(binary, tmp.path(), opts).await?;
        let same_archive = std::fs::read(&info.archive)? == std::fs::read(&again.archive)?;
        if again.manifest_digest != info.manifest_digest || !same_archive {
            bail!(
                "not reproducible: {} then {} (archives {})",
                info.manifest_digest,
                again.manifest_digest,
                if same_archive { "equal" } else { "differ" }
            );
        }
        println!(
            "reproducible: a second build gives the same manifest {} and archive",
            again.manifest_digest
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_controller_image_is_reproducible_and_complete() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("aks-flex-controller");
        std::fs::write(&bin, b"\x7fELF controller").unwrap();
        let ca = dir.path().join("ca.crt");
        std::fs::write(&ca, "-----BEGIN CERTIFICATE-----\n").unwrap();
        let a = build_controller_image(
            &bin,
            &[],
            &ca,
            &dir.path().join("a"),
            1_700_000_000,
            Some("r"),
        )
        .unwrap();
        let b = build_controller_image(
            &bin,
            &[],
            &ca,
            &dir.path().join("b"),
            1_700_000_000,
            Some("r"),
        )
        .unwrap();
        assert_eq!(
            a.0,
            format!("aks-flex-controller:{}", env!("CARGO_PKG_VERSION"))
        );
        assert_eq!(a.1, b.1, "same inputs, same digest");
        assert_eq!(std::fs::read(&a.2).unwrap(), std::fs::read(&b.2).unwrap());
        let paths: Vec<String> = controller_layer(&bin, &[], &ca)
            .unwrap()
            .entries()
            .unwrap()
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        for p in [
            CONTROLLER_BINARY,
            "/etc/passwd",
            "/etc/group",
            "/tmp",
            flex_image::agent::CA_BUNDLE,
        ] {
            assert!(paths.iter().any(|x| x == p), "{p} in {paths:?}");
        }
    }
}
