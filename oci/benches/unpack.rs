//! Unpack throughput: `flex_oci::unpack` against `tar -xzf` on the same gzip layers.
//!
//! Generates three layers in a temporary directory — 2000 small files, four 10 MiB files, and
//! a mix of both — then, three times over, unpacks them into a fresh directory with our
//! unpacker and with `tar -xzf` (run through `ProcessRunner`, one `tar` per layer), and prints
//! the throughput of each in MB/s of uncompressed tar and the ratio ours/tar (writes are
//! flushed with `syncfs` before each timed run, not within it). No assertions.
//! Run with `cargo bench -p aks-flex-node --bench unpack`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark: a panic is a failure

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use flex_host::runner::{Cmd, ProcessRunner, Runner};
use flex_oci::manifest::media_type;
use flex_oci::{LayerFile, UnpackOptions, unpack};
use flex_testkit::layer_builder::{LayerBuilder, gzip};

const REPEATS: usize = 3;

/// Deterministic bytes: text-like (compressible) or xorshift noise (incompressible).
fn content(seed: u64, len: usize, noise: bool) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len);
    const WORDS: [&[u8]; 8] = [
        b"kubelet ",
        b"node ",
        b"flex ",
        b"container ",
        b"runtime ",
        b"config\n",
        b"pod ",
        b"cgroup ",
    ];
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if noise {
            out.extend_from_slice(&x.to_le_bytes());
        } else {
            out.extend_from_slice(WORDS[(x % 8) as usize]);
        }
    }
    out.truncate(len);
    out
}

fn small_files(b: &mut LayerBuilder, prefix: &str, count: usize) {
    for d in 0..count.div_ceil(50) {
        b.dir(&format!("{prefix}/d{d:03}"), 0o755).unwrap();
    }
    for i in 0..count {
        let len = 512 + (i * 7919) % 7680;
        let data = content(i as u64, len, i % 4 == 0);
        b.file(&format!("{prefix}/d{:03}/f{i:05}", i / 50), &data, 0o644)
            .unwrap();
    }
}

fn big_files(b: &mut LayerBuilder, prefix: &str, count: usize) {
    b.dir(prefix, 0o755).unwrap();
    for i in 0..count {
        // Half noise, half text: about what binaries compress like.
        let mut data = content(1000 + i as u64, 5 << 20, true);
        data.extend(content(2000 + i as u64, 5 << 20, false));
        b.file(&format!("{prefix}/big{i}"), &data, 0o755).unwrap();
    }
}

/// Adds a layer's entries.
type Build = Box<dyn Fn(&mut LayerBuilder)>;

struct Layer {
    path: PathBuf,
    tar_bytes: u64,
}

fn write_layers(dir: &Path) -> Vec<Layer> {
    let mut layers = Vec::new();
    let builds: [(&str, Build); 3] = [
        (
            "small",
            Box::new(|b| small_files(b, "usr/share/small", 2000)),
        ),
        ("big", Box::new(|b| big_files(b, "usr/lib/big", 4))),
        (
            "mixed",
            Box::new(|b| {
                small_files(b, "opt/mixed", 1000);
                big_files(b, "opt/mixed/big", 2);
            }),
        ),
    ];
    for (name, build) in builds {
        let mut b = LayerBuilder::new();
        build(&mut b);
        let tar = b.finish().unwrap();
        let path = dir.join(format!("{name}.tar.gz"));
        std::fs::write(&path, gzip(&tar).unwrap()).unwrap();
        layers.push(Layer {
            path,
            tar_bytes: tar.len() as u64,
        });
    }
    layers
}

/// Flushes the previous run's writes so they are not charged to the next one.
fn settle(dir: &Path) {
    let d = std::fs::File::open(dir).unwrap();
    rustix::fs::syncfs(&d).unwrap();
}

fn mbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / 1e6 / d.as_secs_f64()
}

fn main() {
    let work = tempfile::tempdir().unwrap();
    let layers = write_layers(work.path());
    let total: u64 = layers.iter().map(|l| l.tar_bytes).sum();
    let compressed: u64 = layers
        .iter()
        .map(|l| std::fs::metadata(&l.path).unwrap().len())
        .sum();
    println!(
        "unpack bench: {} gzip layers, {:.1} MB uncompressed ({:.1} MB compressed), {REPEATS} repeats",
        layers.len(),
        total as f64 / 1e6,
        compressed as f64 / 1e6
    );
    let files: Vec<LayerFile> = layers
        .iter()
        .map(|l| LayerFile {
            path: l.path.clone(),
            media_type: media_type::OCI_LAYER_GZIP.into(),
            name: l.path.display().to_string(),
            diff_id: None,
        })
        .collect();
    let opts = UnpackOptions::default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let runner = ProcessRunner::new();
    let (mut ours_best, mut tar_best) = (f64::MAX, f64::MAX);
    for rep in 1..=REPEATS {
        let ours_dir = work.path().join(format!("ours{rep}"));
        std::fs::create_dir(&ours_dir).unwrap();
        settle(work.path());
        let t = Instant::now();
        unpack(&ours_dir, &files, &opts).unwrap();
        let ours = t.elapsed();

        let tar_dir = work.path().join(format!("tar{rep}"));
        std::fs::create_dir(&tar_dir).unwrap();
        settle(work.path());
        let t = Instant::now();
        runtime.block_on(async {
            for l in &layers {
                let cmd = Cmd::new("tar")
                    .arg("-xzf")
                    .arg(l.path.display().to_string())
                    .arg("-C")
                    .arg(tar_dir.display().to_string());
                runner.run(&cmd).await.unwrap();
            }
        });
        let tar = t.elapsed();
        println!(
            "run {rep}: ours {:7.1} MB/s ({:6.3} s)   tar -xzf {:7.1} MB/s ({:6.3} s)   ours/tar {:.2}",
            mbps(total, ours),
            ours.as_secs_f64(),
            mbps(total, tar),
            tar.as_secs_f64(),
            tar.as_secs_f64() / ours.as_secs_f64()
        );
        ours_best = ours_best.min(ours.as_secs_f64());
        tar_best = tar_best.min(tar.as_secs_f64());
        std::fs::remove_dir_all(&ours_dir).unwrap();
        std::fs::remove_dir_all(&tar_dir).unwrap();
    }
    println!(
        "best: ours {:.1} MB/s, tar -xzf {:.1} MB/s, ours/tar {:.2} (throughput ratio; >1 means ours is faster)",
        total as f64 / 1e6 / ours_best,
        total as f64 / 1e6 / tar_best,
        tar_best / ours_best
    );
}
