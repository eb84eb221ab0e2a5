//! The upgrade group's candidate images, derived from the agent image `up` pushed by one
//! recipe ([`RECIPE`]) and pushed into the same repository of the local registry:
//!
//! - `good`: the agent image plus a layer with `/opt/aks-flex-node/candidate` (`good <recipe>`),
//!   so its digest differs and it runs as the agent does;
//! - `broken`: the agent image plus a layer that also replaces `/opt/aks-flex-node/bin/entrypoint`,
//!   which the agent's unit runs, with a tiny static x86-64 program that exits 1
//!   ([`exit_1_elf`]). `aks-flex-node version` still works in it, so it passes the agent's
//!   check before the switch and fails only when its daemon starts: recovery must catch it.
//!
//! What was pushed is recorded in `<work>/candidates.json` ([`Record`]) and reused while it was
//! built from the same agent image by the same recipe for the same registry address and the
//! registry still has both manifests ([`plan`], then a look at the registry); `up` and `down`
//! replace the registry, after which they are built again. The layers are built with a fixed
//! epoch and compression, so a rebuild gives the same digests.

use std::path::{Path, PathBuf};

use flex_image::{Layer, LayerBlob};
use flex_oci::RegistryClient;

use crate::check::Ctx;
use crate::images;

/// The recipe's version: change it whenever what the candidates contain changes.
pub const RECIPE: u32 = 1;
/// The marker file both candidates add.
pub const MARKER: &str = "/opt/aks-flex-node/candidate";
/// What the agent's unit runs in its container (the broken candidate replaces it).
pub const ENTRYPOINT: &str = flex_image::agent::ENTRYPOINT;
/// The mtime of every entry of the candidates' layers.
const EPOCH: u64 = 0;
/// gzip level of the candidates' layers.
const LEVEL: u32 = 9;

/// A static x86-64 Linux ELF executable that exits with status 1 and does nothing else: an ELF64
/// header, one `PT_LOAD` program header mapping the whole file read+execute at `0x400000`, and
/// the code `mov edi, 1; mov eax, 60 (exit); syscall`. 132 bytes.
pub fn exit_1_elf() -> Vec<u8> {
    const BASE: u64 = 0x40_0000;
    const EHDR: u16 = 64;
    const PHDR: u16 = 56;
    let code: [u8; 12] = [
        0xbf, 0x01, 0x00, 0x00, 0x00, // mov edi, 1
        0xb8, 0x3c, 0x00, 0x00, 0x00, // mov eax, 60 (SYS_exit)
        0x0f, 0x05, // syscall
    ];
    let code_off = u64::from(EHDR + PHDR);
    let total = code_off + code.len() as u64;
    let mut b = Vec::with_capacity(total as usize);
    // e_ident: magic, ELFCLASS64, ELFDATA2LSB, EV_CURRENT, ELFOSABI_SYSV, padding.
    b.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0]);
    b.extend_from_slice(&[0; 8]);
    b.extend_from_slice(&2u16.to_le_bytes()); // e_type: ET_EXEC
    b.extend_from_slice(&0x3eu16.to_le_bytes()); // e_machine: EM_X86_64
    b.extend_from_slice(&1u32.to_le_bytes()); // e_version
    b.extend_from_slice(&(BASE + code_off).to_le_bytes()); // e_entry
    b.extend_from_slice(&u64::from(EHDR).to_le_bytes()); // e_phoff
    b.extend_from_slice(&0u64.to_le_bytes()); // e_shoff
    b.extend_from_slice(&0u32.to_le_bytes()); // e_flags
    b.extend_from_slice(&EHDR.to_le_bytes()); // e_ehsize
    b.extend_from_slice(&PHDR.to_le_bytes()); // e_phentsize
    b.extend_from_slice(&1u16.to_le_bytes()); // e_phnum
    b.extend_from_slice(&0u16.to_le_bytes()); // e_shentsize
    b.extend_from_slice(&0u16.to_le_bytes()); // e_shnum
    b.extend_from_slice(&0u16.to_le_bytes()); // e_shstrndx
    // Program header: PT_LOAD, PF_R | PF_X, the whole file at BASE.
    b.extend_from_slice(&1u32.to_le_bytes()); // p_type
    b.extend_from_slice(&5u32.to_le_bytes()); // p_flags
    b.extend_from_slice(&0u64.to_le_bytes()); // p_offset
    b.extend_from_slice(&BASE.to_le_bytes()); // p_vaddr
    b.extend_from_slice(&BASE.to_le_bytes()); // p_paddr
    b.extend_from_slice(&total.to_le_bytes()); // p_filesz
    b.extend_from_slice(&total.to_le_bytes()); // p_memsz
    b.extend_from_slice(&0x1000u64.to_le_bytes()); // p_align
    b.extend_from_slice(&code);
    b
}

/// Which candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Runs normally.
    Good,
    /// Its daemon exits 1 at once.
    Broken,
}

impl Kind {
    /// `good` or `broken`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Good => "good",
            Kind::Broken => "broken",
        }
    }

    /// The registry tag it is pushed with.
    pub fn tag(self) -> String {
        format!("candidate-{}-r{RECIPE}", self.name())
    }

    /// The history line of its layer.
    pub fn created_by(self) -> String {
        format!(
            "cargo xtask check: upgrade candidate {} (recipe {RECIPE})",
            self.name()
        )
    }
}

/// The layer a candidate adds to the agent image.
pub fn layer(kind: Kind) -> anyhow::Result<LayerBlob> {
    let mut l = Layer::new();
    l.file(MARKER, 0o644, format!("{} {RECIPE}\n", kind.name()))?;
    if kind == Kind::Broken {
        l.file(ENTRYPOINT, 0o755, exit_1_elf())?;
    }
    l.build(EPOCH, LEVEL)
}

/// `<work>/candidates.json`: what was pushed, for reuse.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Record {
    /// The agent image's manifest digest they derive from.
    pub agent_digest: String,
    /// [`RECIPE`] when they were built.
    pub recipe: u32,
    /// The registry as the guest reaches it (`10.0.2.2:<port>`).
    pub registry: String,
    /// The good candidate, pinned, as the guest pulls it.
    pub good: String,
    /// The broken candidate, pinned, as the guest pulls it.
    pub broken: String,
}

impl Record {
    /// Its file in `work`.
    pub fn path(work: &Path) -> PathBuf {
        work.join("candidates.json")
    }

    /// Loads it (`None` when missing or unreadable: then the candidates are built).
    pub fn load(work: &Path) -> Option<Self> {
        serde_json::from_slice(&std::fs::read(Self::path(work)).ok()?).ok()
    }

    /// Saves it.
    pub fn save(&self, work: &Path) -> anyhow::Result<()> {
        let tmp = work.join(".candidates.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(self)?)?;
        std::fs::rename(tmp, Self::path(work))?;
        Ok(())
    }

    /// The candidate of `kind`.
    pub fn reference(&self, kind: Kind) -> &str {
        match kind {
            Kind::Good => &self.good,
            Kind::Broken => &self.broken,
        }
    }
}

/// What to do about the candidates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// The record fits: reuse it if the registry still has both manifests.
    Reuse(Record),
    /// Build and push, for this reason.
    Build(String),
}

/// Whether `record` was built from the agent image `agent_digest` by this [`RECIPE`] for the
/// registry at `registry` (as the guest reaches it).
pub fn plan(record: Option<&Record>, agent_digest: &str, registry: &str) -> Plan {
    let Some(r) = record else {
        return Plan::Build("none recorded".into());
    };
    if r.agent_digest != agent_digest {
        return Plan::Build(format!(
            "recorded for agent image {}, this one is {}",
            r.agent_digest, agent_digest
        ));
    }
    if r.recipe != RECIPE {
        return Plan::Build(format!("recorded by recipe {}, this is {RECIPE}", r.recipe));
    }
    if r.registry != registry {
        return Plan::Build(format!(
            "recorded for the registry at {}, this one is at {registry}",
            r.registry
        ));
    }
    Plan::Reuse(r.clone())
}

/// The agent image as `up` recorded it (`<guest registry>/<repository>@<digest>`), split into
/// its repository path and digest.
pub fn agent_parts<'a>(
    agent_image: &'a str,
    guest_registry: &str,
) -> anyhow::Result<(&'a str, &'a str)> {
    let rest = agent_image
        .strip_prefix(guest_registry)
        .and_then(|r| r.strip_prefix('/'))
        .ok_or_else(|| {
            anyhow::anyhow!(
                "the agent image {agent_image} is not in the harness's registry {guest_registry}"
            )
        })?;
    let (repo, digest) = rest
        .split_once('@')
        .ok_or_else(|| anyhow::anyhow!("the agent image {agent_image} is not pinned by digest"))?;
    if repo.is_empty() || !digest.starts_with("sha256:") {
        anyhow::bail!("the agent image {agent_image} is not `<registry>/<repository>@sha256:…`");
    }
    Ok((repo, digest))
}

/// The candidates, built and pushed or reused; the second value says which and why.
pub async fn ensure(
    client: &RegistryClient,
    work: &Path,
    host_registry: &str,
    guest_registry: &str,
    agent_image: &str,
) -> anyhow::Result<(Record, String)> {
    let (repo, agent_digest) = agent_parts(agent_image, guest_registry)?;
    let why = match plan(Record::load(work).as_ref(), agent_digest, guest_registry) {
        Plan::Reuse(r) => {
            let mut missing = Vec::new();
            for kind in [Kind::Good, Kind::Broken] {
                let on_host = r.reference(kind).replacen(guest_registry, host_registry, 1);
                if !images::manifest_present(client, &on_host).await? {
                    missing.push(kind.name());
                }
            }
            if missing.is_empty() {
                return Ok((
                    r,
                    format!("reused: built earlier from this agent image by recipe {RECIPE}"),
                ));
            }
            format!(
                "the registry no longer has the {} candidate",
                missing.join(" and ")
            )
        }
        Plan::Build(why) => why,
    };
    let base = format!("{host_registry}/{repo}@{agent_digest}");
    let tmp = tempfile::tempdir_in(work)?;
    let mut refs = Vec::new();
    for kind in [Kind::Good, Kind::Broken] {
        let digest = images::push_appended(
            client,
            &base,
            &kind.tag(),
            &layer(kind)?,
            &kind.created_by(),
            tmp.path(),
        )
        .await?;
        refs.push(images::pinned(&format!("{guest_registry}/{repo}"), &digest));
    }
    let [good, broken] =
        <[String; 2]>::try_from(refs).map_err(|_| anyhow::anyhow!("expected two candidates"))?;
    let record = Record {
        agent_digest: agent_digest.to_string(),
        recipe: RECIPE,
        registry: guest_registry.to_string(),
        good,
        broken,
    };
    record.save(work)?;
    Ok((record, format!("built and pushed ({why})")))
}

/// The candidate images in the registry `up` started (built and pushed when missing), and why
/// they were (re)built or reused.
pub async fn in_registry(c: &Ctx<'_>) -> anyhow::Result<(Record, String)> {
    let reg = c
        .state
        .registry
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("up recorded no registry"))?;
    let client = crate::vm::registry_client(&reg.host_addr())?;
    ensure(
        &client,
        &c.state.work,
        &reg.host_addr(),
        &reg.guest_addr(),
        &c.state.agent_image,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u16_at(b: &[u8], o: usize) -> u16 {
        u16::from_le_bytes(b[o..o + 2].try_into().unwrap())
    }
    fn u32_at(b: &[u8], o: usize) -> u32 {
        u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
    }
    fn u64_at(b: &[u8], o: usize) -> u64 {
        u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
    }

    #[test]
    fn the_elf_is_a_valid_static_x86_64_executable() {
        let b = exit_1_elf();
        assert_eq!(b.len(), 132);
        assert_eq!(&b[..4], b"\x7fELF");
        assert_eq!((b[4], b[5], b[6]), (2, 1, 1), "64-bit, little-endian, v1");
        assert_eq!(u16_at(&b, 16), 2, "ET_EXEC");
        assert_eq!(u16_at(&b, 18), 0x3e, "EM_X86_64");
        assert_eq!(u32_at(&b, 20), 1);
        let (entry, phoff) = (u64_at(&b, 24), u64_at(&b, 32));
        assert_eq!(phoff, 64);
        assert_eq!(
            (u16_at(&b, 52), u16_at(&b, 54), u16_at(&b, 56)),
            (64, 56, 1)
        );
        // The one PT_LOAD maps the whole file, R+X, page-aligned, and holds the entry point.
        let ph = phoff as usize;
        assert_eq!(u32_at(&b, ph), 1, "PT_LOAD");
        assert_eq!(u32_at(&b, ph + 4), 5, "PF_R|PF_X");
        assert_eq!(u64_at(&b, ph + 8), 0);
        let vaddr = u64_at(&b, ph + 16);
        assert_eq!(vaddr % 0x1000, 0);
        assert_eq!(u64_at(&b, ph + 32), b.len() as u64);
        assert_eq!(u64_at(&b, ph + 40), b.len() as u64);
        let code = (entry - vaddr) as usize;
        assert_eq!(
            &b[code..],
            [0xbf, 1, 0, 0, 0, 0xb8, 60, 0, 0, 0, 0x0f, 0x05],
            "mov edi,1; mov eax,60; syscall"
        );
    }

    /// The bytes run here (x86-64 Linux) and exit 1.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    #[tokio::test]
    async fn the_elf_runs_and_exits_1() {
        use flex_host::runner::{Cmd, ProcessRunner, Runner};
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("exit1");
        std::fs::write(&p, exit_1_elf()).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        let out = ProcessRunner::new()
            .output(&Cmd::new(p.display().to_string()))
            .await
            .unwrap();
        assert_eq!(out.code, Some(1), "{out:?}");
        assert_eq!(out.stdout, "");
    }

    #[test]
    fn layers_are_reproducible_and_differ() {
        let good = layer(Kind::Good).unwrap();
        assert_eq!(good, layer(Kind::Good).unwrap());
        let broken = layer(Kind::Broken).unwrap();
        assert_ne!(good.digest, broken.digest);
        let names = |l: &LayerBlob| -> Vec<(String, Vec<u8>)> {
            let mut a = tar::Archive::new(flate2::read::GzDecoder::new(l.data.as_slice()));
            a.entries()
                .unwrap()
                .map(|e| {
                    let mut e = e.unwrap();
                    let name = e.path().unwrap().display().to_string();
                    let mut v = Vec::new();
                    std::io::Read::read_to_end(&mut e, &mut v).unwrap();
                    (name, v)
                })
                .filter(|(_, v)| !v.is_empty())
                .collect()
        };
        assert_eq!(
            names(&good),
            [(
                "opt/aks-flex-node/candidate".to_string(),
                b"good 1\n".to_vec()
            )]
        );
        let b = names(&broken);
        assert!(
            b.contains(&("opt/aks-flex-node/bin/entrypoint".to_string(), exit_1_elf())),
            "{b:?}"
        );
        assert!(b.contains(&(
            "opt/aks-flex-node/candidate".to_string(),
            b"broken 1\n".to_vec()
        )));
        assert_eq!(Kind::Broken.tag(), "candidate-broken-r1");
    }

    fn record() -> Record {
        Record {
            agent_digest: "sha256:aa".into(),
            recipe: RECIPE,
            registry: "10.0.2.2:5000".into(),
            good: "10.0.2.2:5000/aks-flex/agent@sha256:01".into(),
            broken: "10.0.2.2:5000/aks-flex/agent@sha256:02".into(),
        }
    }

    #[test]
    fn reuse_decision() {
        let r = record();
        assert_eq!(
            plan(Some(&r), "sha256:aa", "10.0.2.2:5000"),
            Plan::Reuse(r.clone())
        );
        let table: &[(Option<Record>, &str, &str, &str)] = &[
            (None, "sha256:aa", "10.0.2.2:5000", "none recorded"),
            (
                Some(r.clone()),
                "sha256:bb",
                "10.0.2.2:5000",
                "recorded for agent image sha256:aa",
            ),
            (
                Some(Record {
                    recipe: RECIPE + 1,
                    ..r.clone()
                }),
                "sha256:aa",
                "10.0.2.2:5000",
                "recorded by recipe",
            ),
            (
                Some(r.clone()),
                "sha256:aa",
                "10.0.2.2:6000",
                "registry at 10.0.2.2:5000",
            ),
        ];
        for (rec, agent, reg, why) in table {
            match plan(rec.as_ref(), agent, reg) {
                Plan::Build(w) => assert!(w.contains(why), "{w}"),
                other => panic!("{rec:?} {agent} {reg}: {other:?}"),
            }
        }
    }

    #[test]
    fn record_roundtrip_and_agent_parts() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(Record::load(d.path()), None);
        record().save(d.path()).unwrap();
        assert_eq!(Record::load(d.path()), Some(record()));
        std::fs::write(Record::path(d.path()), "not json").unwrap();
        assert_eq!(Record::load(d.path()), None);

        assert_eq!(
            agent_parts("10.0.2.2:5000/aks-flex/agent@sha256:ab", "10.0.2.2:5000").unwrap(),
            ("aks-flex/agent", "sha256:ab")
        );
        assert!(agent_parts("10.0.2.2:5000/aks-flex/agent:dev", "10.0.2.2:5000").is_err());
        assert!(agent_parts("ghcr.io/x/agent@sha256:ab", "10.0.2.2:5000").is_err());
    }

    /// A real registry: the candidates are pushed once, then reused; a new registry (as after
    /// `up`) has none, and they are pushed again with the same digests.
    #[tokio::test]
    async fn pushed_then_reused_then_rebuilt() {
        let d = tempfile::tempdir().unwrap();
        let runner = flex_host::runner::ProcessRunner::new();
        let reg = crate::registry::start(&runner, &d.path().join("registry"))
            .await
            .unwrap();
        let client = crate::vm::registry_client(&reg.host_addr()).unwrap();
        let host = reg.host_addr();
        // A small base image in aks-flex/agent, as `up` pushes the agent's.
        let mut base_layer = Layer::new();
        base_layer
            .file("/opt/aks-flex-node/bin/aks-flex-node", 0o755, "agent")
            .unwrap()
            .symlink(ENTRYPOINT, "aks-flex-node")
            .unwrap();
        let written = flex_image::write_oci_layout(
            &d.path().join("layout"),
            &[flex_image::Image {
                name: "aks-flex-node-agent:test".into(),
                config: flex_image::ImageConfig {
                    architecture: flex_image::oci::host_architecture().into(),
                    os: "linux".into(),
                    created: 1,
                    entrypoint: vec![ENTRYPOINT.into()],
                    created_by: "test".into(),
                    ..Default::default()
                },
                layers: vec![base_layer.build(1, 6).unwrap()],
                annotations: Default::default(),
            }],
        )
        .unwrap();
        let digest = images::push_layout(
            &client,
            &d.path().join("layout"),
            &format!("{host}/aks-flex/agent:dev"),
        )
        .await
        .unwrap();
        assert_eq!(digest, written[0].manifest.digest);
        // The guest would see the registry elsewhere; here its name is only rewritten.
        let guest = "10.0.2.2:1234";
        let agent = format!("{guest}/aks-flex/agent@{digest}");
        let work = d.path().join("work");
        std::fs::create_dir(&work).unwrap();

        let (first, why) = ensure(&client, &work, &host, guest, &agent).await.unwrap();
        assert!(why.starts_with("built and pushed (none recorded)"), "{why}");
        assert_ne!(first.good, first.broken);
        assert!(
            first
                .good
                .starts_with("10.0.2.2:1234/aks-flex/agent@sha256:")
        );
        for r in [&first.good, &first.broken] {
            let on_host = r.replacen(guest, &host, 1);
            assert!(images::manifest_present(&client, &on_host).await.unwrap());
        }
        let (again, why) = ensure(&client, &work, &host, guest, &agent).await.unwrap();
        assert_eq!(again, first);
        assert!(why.starts_with("reused"), "{why}");

        // The pushed broken candidate: the base's layer, then the entrypoint replaced.
        let image = flex_oci::ImageRef::parse(&first.broken.replacen(guest, &host, 1)).unwrap();
        let fetched = client
            .fetch_manifest(&image, image.digest.as_ref().unwrap().as_str(), None)
            .await
            .unwrap();
        let flex_oci::manifest::Manifest::Image(m) = fetched.manifest else {
            panic!("not an image manifest");
        };
        assert_eq!(m.layers.len(), 2);
        assert_eq!(m.layers[0].digest.to_string(), written[0].layers[0].digest);
        assert_eq!(
            m.layers[1].digest.to_string(),
            layer(Kind::Broken).unwrap().digest
        );

        // A new registry (as after `up`): missing there, so pushed again, same digests.
        crate::registry::stop(&runner, &reg).await.unwrap();
        let reg2 = crate::registry::start(&runner, &d.path().join("registry2"))
            .await
            .unwrap();
        let host2 = reg2.host_addr();
        let client = crate::vm::registry_client(&host2).unwrap();
        images::push_layout(
            &client,
            &d.path().join("layout"),
            &format!("{host2}/aks-flex/agent:dev"),
        )
        .await
        .unwrap();
        let (third, why) = ensure(&client, &work, &host2, guest, &agent).await.unwrap();
        assert!(
            why.contains("the registry no longer has the good and broken candidate"),
            "{why}"
        );
        assert_eq!(third, first, "the same recipe gives the same digests");
        assert!(
            !images::manifest_present(
                &client,
                &format!("{host2}/aks-flex/agent@sha256:{}", "0".repeat(64))
            )
            .await
            .unwrap()
        );
        crate::registry::stop(&runner, &reg2).await.unwrap();
    }
}
