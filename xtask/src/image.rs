//! `cargo xtask image`: the agent's container image without a container engine.
//!
//! Builds `aks-flex-node` reproducibly (`cargo build --release --locked` with
//! `SOURCE_DATE_EPOCH` = the HEAD commit time and the workspace and cargo home paths remapped),
//! then [`flex_image::build_agent_image`] writes the OCI layout `<out>/aks-flex-node-agent/` and
//! the archive `<out>/aks-flex-node-agent.tar`. `--check-reproducible` assembles the image a
//! second time from the same binary into a temporary directory and fails unless the digests and
//! the archive bytes match.

use std::path::{Path, PathBuf};
use std::time::Duration;

use aks_flex_node::runner::{Cmd, ProcessRunner, Runner, run_inherited};
use anyhow::{Context, bail};
use flex_image::{AgentImageOptions, ImageInfo, build_agent_image};

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
    let root = crate::project_root();
    let epoch: u64 = git(&root, &["log", "-1", "--format=%ct"])
        .await?
        .parse()
        .context("git log -1 --format=%ct: not a number")?;
    let revision = git(&root, &["rev-parse", "HEAD"]).await?;
    let flags = remap_flags(&root);
    eprintln!("xtask image: cargo build --release -p aks-flex-node (SOURCE_DATE_EPOCH={epoch})");
    run_inherited(
        &Cmd::new("cargo")
            .args(["build", "--release", "-p", "aks-flex-node", "--locked"])
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
    let binary = target.join("release/aks-flex-node");
    if !binary.is_file() {
        bail!("{} was not built", binary.display());
    }
    let mut opts = AgentImageOptions::new(env!("CARGO_PKG_VERSION"), epoch);
    opts.revision = Some(revision);
    let info = build_agent_image(&binary, out, &opts).await?;
    Ok((info, binary, opts))
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
