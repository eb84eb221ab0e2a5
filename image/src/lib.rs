//! Container images without a container engine: deterministic layers, OCI image layouts and
//! OCI archives, and the agent's image built from them.
//!
//! - [`layer`]: [`Layer`], a file-system layer assembled in memory and written as a sorted tar
//!   with fixed metadata, gzip-compressed with a fixed header ([`LayerBlob`]);
//! - [`oci`]: the config, manifest and index documents, [`write_oci_layout`] and
//!   [`write_oci_archive`] (what `ctr images import` and `podman load` take);
//! - [`agent`]: the agent's image ([`build_agent_image`]): the multi-call binary, its links, its
//!   shared libraries, a CA bundle and a minimal `/etc`, with `entrypoint` as the entrypoint;
//! - [`derive`]: images derived from another by appending a layer (documents or layouts).
//!
//! Beside the crate: `image/agent-container.bu` is the ACL host provisioning (generated from the
//! agent's own units by `cargo xtask codegen`), `image/label-containerd.bu` the SELinux relabel
//! of containerd's directory (`up --label-containerd`).
//!
//! Given the same inputs and epoch (`SOURCE_DATE_EPOCH`) every function here writes the same
//! bytes, so an image's digest identifies its sources. `image/Containerfile` builds the same
//! image with podman or docker; a unit test keeps the two in sync.

pub mod agent;
pub mod derive;
pub mod layer;
pub mod oci;

pub use agent::{AgentImageOptions, ImageInfo, Libraries, build_agent_image};
pub use layer::{Content, Entry, Layer, LayerBlob};
pub use oci::{Descriptor, Image, ImageConfig, WrittenImage, write_oci_archive, write_oci_layout};

#[cfg(test)]
mod containerfile_tests {
    //! `image/Containerfile` must describe the image [`crate::agent`] builds.

    use crate::agent;

    /// The Containerfile's instructions, continuation lines joined, comments dropped.
    fn instructions(text: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut current = String::new();
        for line in text.lines() {
            let t = line.trim();
            if current.is_empty() && (t.is_empty() || t.starts_with('#')) {
                continue;
            }
            if t.starts_with('#') {
                continue;
            }
            if let Some(body) = t.strip_suffix('\\') {
                current.push_str(body);
                current.push(' ');
                continue;
            }
            current.push_str(t);
            let (kw, rest) = current
                .split_once(char::is_whitespace)
                .unwrap_or((current.as_str(), ""));
            out.push((kw.to_uppercase(), rest.trim().to_string()));
            current.clear();
        }
        out
    }

    /// `ENV K=V K2=V2` (values may be double-quoted) → pairs.
    fn env_pairs(args: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut cur = String::new();
        let mut quoted = false;
        for c in args.chars() {
            match c {
                '"' => quoted = !quoted,
                c if c.is_whitespace() && !quoted => {
                    if !cur.is_empty() {
                        out.push(std::mem::take(&mut cur));
                    }
                }
                c => cur.push(c),
            }
        }
        if !cur.is_empty() {
            out.push(cur);
        }
        out
    }

    #[tokio::test]
    async fn containerfile_matches_the_rust_builder() {
        let text =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Containerfile")).unwrap();
        let ins = instructions(&text);
        let froms: Vec<usize> = ins
            .iter()
            .enumerate()
            .filter(|(_, (k, _))| k == "FROM")
            .map(|(i, _)| i)
            .collect();
        assert!(froms.len() >= 2, "multi-stage: {froms:?}");
        assert!(ins[froms[0]].1.contains("bookworm"), "{:?}", ins[froms[0]]);
        let last = *froms.last().unwrap();
        assert_eq!(ins[last].1, "scratch");
        let builder: String = ins[..last]
            .iter()
            .map(|(k, v)| format!("{k} {v}\n"))
            .collect();
        assert!(builder.contains("protobuf-compiler"), "{builder}");
        assert!(
            builder.contains("cargo build --release -p aks-flex-node --locked"),
            "{builder}"
        );
        assert!(
            builder.contains("ldd"),
            "libraries come from ldd: {builder}"
        );
        assert!(builder.contains("SOURCE_DATE_EPOCH"), "{builder}");
        assert!(builder.contains("--remap-path-prefix"), "{builder}");

        let final_stage = &ins[last + 1..];
        let get = |kw: &str| -> Vec<&String> {
            final_stage
                .iter()
                .filter(|(k, _)| k == kw)
                .map(|(_, v)| v)
                .collect()
        };
        let env: Vec<String> = get("ENV").iter().flat_map(|v| env_pairs(v)).collect();
        assert_eq!(env, agent::image_env());
        let entrypoint: Vec<String> = serde_json::from_str(get("ENTRYPOINT")[0]).unwrap();
        assert_eq!(entrypoint, [agent::ENTRYPOINT]);
        let cmd: Vec<String> = serde_json::from_str(get("CMD")[0]).unwrap();
        assert_eq!(cmd, agent::CMD);
        for kw in ["RUN", "SHELL"] {
            assert!(get(kw).is_empty(), "no {kw} in a scratch stage");
        }

        // Every file, link and directory of the Rust-built layer (bar the libraries, which the
        // builder stage finds with ldd) is named in the Containerfile.
        let d = tempfile::tempdir().unwrap();
        let bin = d.path().join("bin");
        let ca = d.path().join("ca");
        std::fs::write(&bin, "x").unwrap();
        std::fs::write(&ca, "x").unwrap();
        let layer = agent::agent_layer(&bin, &[], &ca).unwrap();
        let words: Vec<&str> = text
            .split(|c: char| c.is_whitespace() || "\"',;()[]{}".contains(c))
            .collect();
        let mut missing = Vec::new();
        for (path, entry) in layer.entries().unwrap() {
            let name = path.rsplit('/').next().unwrap();
            let named = words.iter().any(|w| {
                w.trim_end_matches('/') == path
                    || w.ends_with(&path)
                    || w.contains(&format!("{path}/"))
                    || (path.starts_with("/opt/aks-flex-node/bin/") && *w == name)
            });
            if !named {
                missing.push(format!("{path} ({entry:?})"));
            }
        }
        assert!(
            missing.is_empty(),
            "the Containerfile does not name: {missing:#?}"
        );
        for content in [agent::NSSWITCH_CONF, agent::PASSWD, agent::GROUP] {
            for line in content.lines() {
                assert!(text.contains(line), "the Containerfile lacks {line:?}");
            }
        }
        assert!(text.contains("1777"), "/tmp must be 1777");
    }
}
