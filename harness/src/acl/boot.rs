//! How `up` boots an ACL image: from its UEFI firmware as the image would on any machine, or
//! directly from its kernel when the image's own boot configuration would make Ignition take
//! the Azure platform.
//!
//! An ACL image for Azure (the gallery's, the Marketplace VHD) carries a UKI add-on that puts
//! `flatcar.oem.id=azure` on the kernel command line. Booted as it is under QEMU, Ignition
//! then waits for Azure's metadata service (`ignition-fetch.service` has no timeout) and never
//! reads the config on fw_cfg. So the harness reads the image's EFI system partition (the UKI,
//! its add-ons, or a GRUB config), decides with a pure function over what it read, and when
//! Azure would be selected boots `-kernel`/`-initrd` taken from the image with the image's own
//! command line, the platform set to `qemu` (`flatcar.oem.id=qemu ignition.platform.id=qemu`).
//! The first boot adds `flatcar.first_boot=1` (the add-on that says `detected` is not read on
//! this path); `up` then restarts QEMU with the later boots' command line, without it, so a
//! reboot in the guest does not run Ignition again.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use flex_host::runner::Runner;

use super::disk::{self, Esp};
use super::pe;

/// How to boot an ACL image (`ACL_BOOT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BootMode {
    /// Read the image and decide (the default).
    Auto,
    /// Always UEFI firmware.
    Uefi,
    /// Always the image's kernel, with the `qemu` platform.
    Kernel,
}

impl BootMode {
    /// Parses `ACL_BOOT` (`auto`, `uefi`, `kernel`; unset or empty is `auto`).
    pub fn parse(value: Option<&str>) -> Result<Self> {
        match value.map(str::trim).unwrap_or("") {
            "" | "auto" => Ok(Self::Auto),
            "uefi" | "firmware" => Ok(Self::Uefi),
            "kernel" | "direct" => Ok(Self::Kernel),
            other => bail!("ACL_BOOT={other:?}: expected auto, uefi or kernel"),
        }
    }

    /// From the `ACL_BOOT` environment variable.
    pub fn from_env() -> Result<Self> {
        Self::parse(std::env::var("ACL_BOOT").ok().as_deref())
    }
}

/// The boot files an ESP holds, by path (as [`Esp::files`] names them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    /// systemd-boot with a UKI (what ACL uses) and the add-ons systemd-stub would load for it,
    /// in the order it applies them.
    Uki {
        /// The UKI (`EFI/Linux/*.efi`; of several, the last by name, as systemd-boot's
        /// default sorts newest first).
        uki: String,
        /// Global add-ons (`loader/addons/*.addon.efi`), then the UKI's own
        /// (`EFI/Linux/<uki>.efi.extra.d/*.addon.efi`), each sorted by name.
        addons: Vec<String>,
    },
    /// GRUB configs (`grub.cfg` anywhere on the ESP), sorted.
    Grub {
        /// The configs.
        configs: Vec<String>,
    },
    /// Neither.
    Unknown,
}

/// Finds the boot files among `files` (pure).
pub fn layout(files: &[String]) -> Layout {
    let lower = |s: &str| s.to_ascii_lowercase();
    let mut ukis: Vec<&String> = files
        .iter()
        .filter(|f| {
            let l = lower(f);
            l.starts_with("efi/linux/") && l.ends_with(".efi") && l.matches('/').count() == 2
        })
        .collect();
    ukis.sort();
    if let Some(uki) = ukis.last() {
        let own = format!("{}.extra.d/", lower(uki));
        let mut global: Vec<&String> = files
            .iter()
            .filter(|f| {
                let l = lower(f);
                l.starts_with("loader/addons/") && l.ends_with(".addon.efi")
            })
            .collect();
        let mut mine: Vec<&String> = files
            .iter()
            .filter(|f| {
                let l = lower(f);
                l.starts_with(&own) && l.ends_with(".addon.efi")
            })
            .collect();
        global.sort();
        mine.sort();
        return Layout::Uki {
            uki: (*uki).clone(),
            addons: global.into_iter().chain(mine).cloned().collect(),
        };
    }
    let mut configs: Vec<String> = files
        .iter()
        .filter(|f| lower(f).ends_with("grub.cfg"))
        .cloned()
        .collect();
    configs.sort();
    if configs.is_empty() {
        Layout::Unknown
    } else {
        Layout::Grub { configs }
    }
}

/// Where the kernel and initrd are on the ESP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelSource {
    /// Sections `.linux` and `.initrd` of a UKI.
    Uki {
        /// The UKI's path.
        path: String,
    },
    /// Files (GRUB's `linux` and `initrd`).
    Files {
        /// The kernel's path.
        kernel: String,
        /// The initrd's path, if there is one.
        initrd: Option<String>,
    },
}

/// What the image would boot: the kernel, and its command line in pieces with their origin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageBoot {
    /// The kernel.
    pub kernel: KernelSource,
    /// `(where from, command line)`, in the order the boot loader joins them.
    pub cmdlines: Vec<(String, String)>,
}

impl ImageBoot {
    /// The image's whole command line, as tokens.
    pub fn tokens(&self) -> Vec<String> {
        self.cmdlines
            .iter()
            .flat_map(|(_, c)| c.split_whitespace().map(str::to_string))
            .collect()
    }

    /// The platform Ignition would take, and the piece that says so: the last
    /// `flatcar.oem.id=`, else the last `coreos.oem.id=` (as bootengine's generator reads
    /// them), else the last `ignition.platform.id=`. `None`: nothing selects one (bootengine
    /// then picks `qemu` under QEMU).
    pub fn platform(&self) -> Option<(String, String)> {
        for key in ["flatcar.oem.id", "coreos.oem.id", "ignition.platform.id"] {
            let mut found = None;
            for (origin, line) in &self.cmdlines {
                for t in line.split_whitespace() {
                    if let Some(v) = t.strip_prefix(key).and_then(|r| r.strip_prefix('=')) {
                        found = Some((v.to_string(), format!("{t} in {origin}")));
                    }
                }
            }
            if found.is_some() {
                return found;
            }
        }
        None
    }
}

/// Command-line keys the harness sets itself on a direct kernel boot.
const REPLACED: &[&str] = &[
    "flatcar.oem.id",
    "coreos.oem.id",
    "ignition.platform.id",
    "flatcar.first_boot",
    "coreos.first_boot",
    "ignition.firstboot",
    "initrd",
    "BOOT_IMAGE",
];

/// The direct kernel boot's command line: the image's own, with the platform set to `qemu`,
/// a serial console if it has none, and on the first boot `flatcar.first_boot=1` (pure).
pub fn qemu_append(image_tokens: &[String], first_boot: bool) -> String {
    let mut out: Vec<String> = image_tokens
        .iter()
        .filter(|t| {
            let key = t.split('=').next().unwrap_or(t);
            !REPLACED.contains(&key)
        })
        .cloned()
        .collect();
    if !out.iter().any(|t| t.starts_with("console=ttyS0")) {
        out.push("console=ttyS0,115200n8".into());
    }
    out.push("flatcar.oem.id=qemu".into());
    out.push("ignition.platform.id=qemu".into());
    if first_boot {
        out.push("flatcar.first_boot=1".into());
    }
    out.join(" ")
}

/// The decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    /// UEFI firmware, as the image boots anywhere.
    Uefi {
        /// Why.
        why: String,
    },
    /// The image's kernel, directly.
    Kernel {
        /// Why.
        why: String,
    },
}

/// Decides how to boot from the mode and what the image would boot (pure). `image` is `None`
/// when the harness could not read it (the reason in `unread`).
pub fn decide(mode: BootMode, image: Option<&ImageBoot>, unread: &str) -> Choice {
    match (mode, image) {
        (BootMode::Uefi, _) => Choice::Uefi {
            why: "ACL_BOOT=uefi".into(),
        },
        (BootMode::Kernel, Some(_)) => Choice::Kernel {
            why: "ACL_BOOT=kernel".into(),
        },
        (BootMode::Kernel, None) | (BootMode::Auto, None) => Choice::Uefi {
            why: format!("the image's boot files could not be read ({unread}); UEFI boot"),
        },
        (BootMode::Auto, Some(img)) => match img.platform() {
            Some((id, origin)) if id == "azure" => Choice::Kernel {
                why: format!(
                    "the image selects the Azure platform ({origin}), whose Ignition would wait for Azure's metadata service: direct kernel boot with the qemu platform"
                ),
            },
            Some((id, origin)) => Choice::Uefi {
                why: format!("the image selects the {id} platform ({origin}): UEFI boot"),
            },
            None => Choice::Uefi {
                why: "the image selects no platform (Ignition takes qemu under QEMU): UEFI boot"
                    .into(),
            },
        },
    }
}

/// A GRUB config's boot entry, with `set` variables expanded (pure, best effort: the first
/// `linux` line and the first `initrd` line; conditions are not evaluated, every `set` applies
/// in order; `oem_id`, as Flatcar's OEM config sets it, adds `flatcar.oem.id=`).
pub fn grub_boot(configs: &[(String, String)]) -> Option<ImageBoot> {
    let mut vars: std::collections::BTreeMap<String, String> = Default::default();
    let expand = |s: &str, vars: &std::collections::BTreeMap<String, String>| -> String {
        let mut out = String::new();
        let mut rest = s;
        while let Some(i) = rest.find('$') {
            out.push_str(&rest[..i]);
            let after = &rest[i + 1..];
            let (name, tail) = if let Some(b) = after.strip_prefix('{') {
                match b.find('}') {
                    Some(j) => (&b[..j], &b[j + 1..]),
                    None => (b, ""),
                }
            } else {
                let j = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                (&after[..j], &after[j..])
            };
            out.push_str(vars.get(name).map(String::as_str).unwrap_or(""));
            rest = tail;
        }
        out.push_str(rest);
        out
    };
    let unquote = |s: &str| s.trim().trim_matches('"').trim_matches('\'').to_string();
    let mut linux: Option<(String, Vec<String>, String)> = None;
    let mut initrd: Option<String> = None;
    for (origin, text) in configs {
        for raw in text.lines() {
            let line = raw.trim();
            let mut words = line.split_whitespace();
            let Some(cmd) = words.next() else { continue };
            if cmd == "set" {
                if let Some((k, v)) = line["set".len()..].trim().split_once('=') {
                    let v = expand(&unquote(v), &vars);
                    vars.insert(k.trim().to_string(), v);
                }
            } else if linux.is_none() && matches!(cmd, "linux" | "linuxefi" | "linux16") {
                let args: Vec<String> = words
                    .map(|w| expand(&unquote(w), &vars))
                    .flat_map(|w| w.split_whitespace().map(str::to_string).collect::<Vec<_>>())
                    .collect();
                if let Some((k, rest)) = args.split_first() {
                    linux = Some((k.clone(), rest.to_vec(), origin.clone()));
                }
            } else if initrd.is_none() && matches!(cmd, "initrd" | "initrdefi" | "initrd16") {
                initrd = words.next().map(|w| expand(&unquote(w), &vars));
            }
        }
    }
    let (kernel, mut args, origin) = linux?;
    let has_oem = args
        .iter()
        .any(|a| a.starts_with("flatcar.oem.id=") || a.starts_with("coreos.oem.id="));
    if let Some(oem) = vars.get("oem_id").filter(|v| !v.is_empty())
        && !has_oem
    {
        args.push(format!("flatcar.oem.id={oem}"));
    }
    Some(ImageBoot {
        kernel: KernelSource::Files {
            kernel: grub_path(&kernel),
            initrd: initrd.as_deref().map(grub_path),
        },
        cmdlines: vec![(origin, args.join(" "))],
    })
}

/// A GRUB path as an ESP path: no `(device)` prefix, no leading `/`.
fn grub_path(p: &str) -> String {
    let p = match p.strip_prefix('(') {
        Some(rest) => rest.split_once(')').map_or(rest, |(_, r)| r),
        None => p,
    };
    p.trim_start_matches('/').to_string()
}

/// Finds `path` among `files` ignoring ASCII case (FAT is case-insensitive).
fn find<'a>(files: &'a [String], path: &str) -> Option<&'a String> {
    files.iter().find(|f| f.eq_ignore_ascii_case(path))
}

/// Reads what the ESP would boot.
pub fn read_image_boot(esp: &Esp) -> Result<ImageBoot> {
    let files = esp.files()?;
    match layout(&files) {
        Layout::Uki { uki, addons } => {
            let data = esp.read(&uki)?;
            let own = pe::section(&data, ".cmdline")
                .with_context(|| format!("{uki} is not a UKI"))?
                .map(pe::cmdline_text)
                .unwrap_or_default();
            let mut cmdlines = vec![(uki.clone(), own)];
            for a in addons {
                let bytes = esp.read(&a)?;
                if let Some(c) = pe::section(&bytes, ".cmdline")
                    .with_context(|| format!("{a} is not a PE add-on"))?
                {
                    cmdlines.push((a.clone(), pe::cmdline_text(c)));
                }
            }
            Ok(ImageBoot {
                kernel: KernelSource::Uki { path: uki },
                cmdlines,
            })
        }
        Layout::Grub { configs } => {
            let mut texts = Vec::new();
            for c in &configs {
                texts.push((
                    c.clone(),
                    String::from_utf8_lossy(&esp.read(c)?).into_owned(),
                ));
            }
            let mut boot = grub_boot(&texts)
                .with_context(|| format!("no linux line in {}", configs.join(", ")))?;
            if let KernelSource::Files { kernel, initrd } = &mut boot.kernel {
                *kernel = find(&files, kernel)
                    .with_context(|| format!("GRUB's kernel {kernel} is not on the ESP"))?
                    .clone();
                if let Some(i) = initrd {
                    *i = find(&files, i)
                        .with_context(|| format!("GRUB's initrd {i} is not on the ESP"))?
                        .clone();
                }
            }
            Ok(boot)
        }
        Layout::Unknown => bail!(
            "no UKI (EFI/Linux/*.efi) and no grub.cfg on the EFI system partition ({} files)",
            files.len()
        ),
    }
}

/// How `up` boots the ACL image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AclBoot {
    /// UEFI firmware.
    Uefi {
        /// Why.
        why: String,
    },
    /// Direct kernel boot.
    Kernel {
        /// The kernel, extracted from the image.
        kernel: PathBuf,
        /// The initrd, if the image has one.
        initrd: Option<PathBuf>,
        /// The first boot's command line (runs Ignition).
        first_boot_append: String,
        /// Every later boot's command line.
        append: String,
        /// Why.
        why: String,
    },
}

/// Reads `image` (raw or qcow2), decides, and for a direct kernel boot writes the kernel and
/// initrd to `out` (`vmlinuz`, `initrd`). Copies of a qcow2 image's ESP go to `out` too and are
/// removed afterwards.
pub async fn prepare(
    runner: &dyn Runner,
    image: &Path,
    out: &Path,
    mode: BootMode,
) -> Result<AclBoot> {
    if mode == BootMode::Uefi {
        return Ok(AclBoot::Uefi {
            why: "ACL_BOOT=uefi".into(),
        });
    }
    std::fs::create_dir_all(out)?;
    let read = async {
        let loc = disk::locate_esp(runner, image, out).await?;
        let esp = Esp::open(&loc)?;
        let boot = read_image_boot(&esp)?;
        Ok::<_, anyhow::Error>((esp, boot))
    }
    .await;
    let result = match read {
        Err(e) if mode == BootMode::Kernel => Err(e.context(format!(
            "ACL_BOOT=kernel: reading the boot files of {}",
            image.display()
        ))),
        Err(e) => Ok(AclBoot::Uefi {
            why: match decide(mode, None, &format!("{e:#}")) {
                Choice::Uefi { why } | Choice::Kernel { why } => why,
            },
        }),
        Ok((esp, boot)) => match decide(mode, Some(&boot), "") {
            Choice::Uefi { why } => Ok(AclBoot::Uefi { why }),
            Choice::Kernel { why } => extract(&esp, &boot, out).map(|(kernel, initrd)| {
                let tokens = boot.tokens();
                AclBoot::Kernel {
                    kernel,
                    initrd,
                    first_boot_append: qemu_append(&tokens, true),
                    append: qemu_append(&tokens, false),
                    why,
                }
            }),
        },
    };
    for f in ["head.raw", "esp.raw"] {
        let _ = std::fs::remove_file(out.join(f));
    }
    result
}

/// Writes the kernel (and initrd) of `boot` into `out`.
fn extract(esp: &Esp, boot: &ImageBoot, out: &Path) -> Result<(PathBuf, Option<PathBuf>)> {
    let kernel = out.join("vmlinuz");
    let initrd = out.join("initrd");
    let _ = std::fs::remove_file(&initrd);
    match &boot.kernel {
        KernelSource::Uki { path } => {
            let data = esp.read(path)?;
            let linux = pe::section(&data, ".linux")?
                .with_context(|| format!("{path} has no .linux section"))?;
            std::fs::write(&kernel, linux)?;
            match pe::section(&data, ".initrd")? {
                Some(i) => {
                    std::fs::write(&initrd, i)?;
                    Ok((kernel, Some(initrd)))
                }
                None => Ok((kernel, None)),
            }
        }
        KernelSource::Files {
            kernel: k,
            initrd: i,
        } => {
            std::fs::write(&kernel, esp.read(k)?)?;
            match i {
                Some(i) => {
                    std::fs::write(&initrd, esp.read(i)?)?;
                    Ok((kernel, Some(initrd)))
                }
                None => Ok((kernel, None)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::disk::testimg;
    use super::*;
    use flex_testkit::FakeRunner;

    const UKI_CMDLINE: &str = "mount.usr=/dev/mapper/usr verity.usr=PARTUUID=7130c94a-213a-4e5a-8e26-6cce9662f132 rootflags=rw mount.usrflags=ro root=LABEL=ROOT console=tty1 console=ttyS0,115200n8 earlyprintk=ttyS0,115200";

    fn uki_files(oem: &str) -> Vec<(&'static str, Vec<u8>)> {
        let d = "EFI/Linux/acl_3.20261019.3.efi.extra.d";
        vec![
            ("EFI/BOOT/BOOTX64.EFI", b"systemd-boot".to_vec()),
            ("loader/loader.conf", b"timeout 0\n".to_vec()),
            (
                "EFI/Linux/acl_3.20261019.3.efi",
                pe::build(&[
                    (".osrel", b"ID=acl\n"),
                    (".cmdline", UKI_CMDLINE.as_bytes()),
                    (".linux", b"MZ-fake-kernel"),
                    (".initrd", b"fake-initrd"),
                ]),
            ),
            (
                Box::leak(format!("{d}/firstboot.addon.efi").into_boxed_str()),
                pe::build(&[(".cmdline", b"flatcar.first_boot=detected\n")]),
            ),
            (
                Box::leak(format!("{d}/oem.addon.efi").into_boxed_str()),
                pe::build(&[(".cmdline", format!("flatcar.oem.id={oem}").as_bytes())]),
            ),
        ]
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn layouts() {
        let files = strings(&[
            "EFI/BOOT/BOOTX64.EFI",
            "EFI/Linux/acl_1.efi",
            "EFI/Linux/acl_2.efi",
            "EFI/Linux/acl_2.efi.extra.d/oem.addon.efi",
            "EFI/Linux/acl_2.efi.extra.d/firstboot.addon.efi",
            "EFI/Linux/acl_1.efi.extra.d/oem.addon.efi",
            "loader/addons/global.addon.efi",
        ]);
        assert_eq!(
            layout(&files),
            Layout::Uki {
                uki: "EFI/Linux/acl_2.efi".into(),
                addons: strings(&[
                    "loader/addons/global.addon.efi",
                    "EFI/Linux/acl_2.efi.extra.d/firstboot.addon.efi",
                    "EFI/Linux/acl_2.efi.extra.d/oem.addon.efi",
                ]),
            }
        );
        assert_eq!(
            layout(&strings(&["flatcar/vmlinuz-a", "EFI/boot/grub.cfg"])),
            Layout::Grub {
                configs: strings(&["EFI/boot/grub.cfg"])
            }
        );
        assert_eq!(layout(&strings(&["EFI/BOOT/BOOTX64.EFI"])), Layout::Unknown);
    }

    fn image(cmdlines: &[(&str, &str)]) -> ImageBoot {
        ImageBoot {
            kernel: KernelSource::Uki {
                path: "EFI/Linux/a.efi".into(),
            },
            cmdlines: cmdlines
                .iter()
                .map(|(o, c)| (o.to_string(), c.to_string()))
                .collect(),
        }
    }

    /// The decision table.
    #[test]
    fn decisions() {
        let azure = image(&[
            ("uki", "root=LABEL=ROOT"),
            ("oem.addon.efi", "flatcar.oem.id=azure"),
        ]);
        let qemu = image(&[
            ("uki", "flatcar.oem.id=azure"),
            ("oem", "flatcar.oem.id=qemu"),
        ]);
        let coreos = image(&[("uki", "coreos.oem.id=azure")]);
        let platform_only = image(&[("uki", "ignition.platform.id=azure")]);
        let flatcar_wins = image(&[("uki", "flatcar.oem.id=qemu coreos.oem.id=azure")]);
        let none = image(&[("uki", "root=LABEL=ROOT")]);
        let kernel = |c: Choice| matches!(c, Choice::Kernel { .. });
        assert!(kernel(decide(BootMode::Auto, Some(&azure), "")));
        assert!(kernel(decide(BootMode::Auto, Some(&coreos), "")));
        assert!(kernel(decide(BootMode::Auto, Some(&platform_only), "")));
        assert!(!kernel(decide(BootMode::Auto, Some(&qemu), "")));
        assert!(!kernel(decide(BootMode::Auto, Some(&flatcar_wins), "")));
        assert!(!kernel(decide(BootMode::Auto, Some(&none), "")));
        assert!(!kernel(decide(BootMode::Uefi, Some(&azure), "")));
        assert!(kernel(decide(BootMode::Kernel, Some(&none), "")));
        assert!(!kernel(decide(BootMode::Kernel, None, "x")));
        let Choice::Kernel { why } = decide(BootMode::Auto, Some(&azure), "") else {
            panic!()
        };
        assert!(
            why.contains("flatcar.oem.id=azure in oem.addon.efi"),
            "{why}"
        );
        let Choice::Uefi { why } = decide(BootMode::Auto, None, "no GPT") else {
            panic!()
        };
        assert!(why.contains("no GPT"), "{why}");
    }

    #[test]
    fn qemu_command_lines() {
        let tokens = strings(&[
            "root=LABEL=ROOT",
            "console=ttyS0,115200n8",
            "flatcar.first_boot=detected",
            "flatcar.oem.id=azure",
            "ignition.platform.id=azure",
            "BOOT_IMAGE=/x",
        ]);
        assert_eq!(
            qemu_append(&tokens, true),
            "root=LABEL=ROOT console=ttyS0,115200n8 flatcar.oem.id=qemu ignition.platform.id=qemu flatcar.first_boot=1"
        );
        assert_eq!(
            qemu_append(&strings(&["root=LABEL=ROOT"]), false),
            "root=LABEL=ROOT console=ttyS0,115200n8 flatcar.oem.id=qemu ignition.platform.id=qemu"
        );
    }

    #[test]
    fn grub_entries() {
        let oem = (
            "oem/grub.cfg".to_string(),
            "set oem_id=\"azure\"\nset linux_append=\"flatcar.autologin\"\n".to_string(),
        );
        let main = (
            "EFI/boot/grub.cfg".to_string(),
            "set linux_console=\"console=ttyS0,115200n8\"\nmenuentry \"Flatcar\" {\n  linux /flatcar/vmlinuz-a $linux_console ${linux_append} root=LABEL=ROOT\n  initrd /flatcar/initrd-a\n}\n"
                .to_string(),
        );
        let b = grub_boot(&[main.clone(), oem.clone()]).unwrap();
        assert_eq!(
            b.kernel,
            KernelSource::Files {
                kernel: "flatcar/vmlinuz-a".into(),
                initrd: Some("flatcar/initrd-a".into())
            }
        );
        // The OEM config's variables are set after main's linux line here, so only oem_id
        // reaches it (as an added flatcar.oem.id).
        assert_eq!(
            b.tokens(),
            strings(&[
                "console=ttyS0,115200n8",
                "root=LABEL=ROOT",
                "flatcar.oem.id=azure"
            ])
        );
        let b = grub_boot(&[oem, main]).unwrap();
        assert!(b.tokens().contains(&"flatcar.autologin".to_string()));
        assert_eq!(b.platform().unwrap().0, "azure");
        assert!(grub_boot(&[("g".into(), "set a=b\n".into())]).is_none());
        assert_eq!(grub_path("($root)/boot/vmlinuz"), "boot/vmlinuz");
    }

    /// A synthetic disk with the ACL layout: the decision and the extraction.
    #[tokio::test]
    async fn azure_uki_image_boots_its_kernel_directly() {
        let d = tempfile::tempdir().unwrap();
        let img = d.path().join("acl.raw");
        testimg::rust_image(&img, &uki_files("azure"));
        let out = d.path().join("boot");
        let r = FakeRunner::new();
        let b = prepare(&r, &img, &out, BootMode::Auto).await.unwrap();
        let AclBoot::Kernel {
            kernel,
            initrd,
            first_boot_append,
            append,
            why,
        } = b
        else {
            panic!("{b:?}")
        };
        assert_eq!(std::fs::read(&kernel).unwrap(), b"MZ-fake-kernel");
        assert_eq!(std::fs::read(initrd.unwrap()).unwrap(), b"fake-initrd");
        assert_eq!(
            first_boot_append,
            format!(
                "{UKI_CMDLINE} flatcar.oem.id=qemu ignition.platform.id=qemu flatcar.first_boot=1"
            )
        );
        assert_eq!(
            append,
            format!("{UKI_CMDLINE} flatcar.oem.id=qemu ignition.platform.id=qemu")
        );
        assert!(why.contains("oem.addon.efi"), "{why}");
    }

    #[tokio::test]
    async fn qemu_uki_image_boots_with_uefi() {
        let d = tempfile::tempdir().unwrap();
        let img = d.path().join("acl.raw");
        testimg::rust_image(&img, &uki_files("qemu"));
        let r = FakeRunner::new();
        let b = prepare(&r, &img, &d.path().join("boot"), BootMode::Auto)
            .await
            .unwrap();
        assert!(
            matches!(&b, AclBoot::Uefi { why } if why.contains("qemu platform")),
            "{b:?}"
        );
        let b = prepare(&r, &img, &d.path().join("boot"), BootMode::Kernel)
            .await
            .unwrap();
        assert!(matches!(b, AclBoot::Kernel { .. }), "{b:?}");
    }

    #[tokio::test]
    async fn unreadable_images_boot_with_uefi_unless_kernel_is_forced() {
        let d = tempfile::tempdir().unwrap();
        let img = d.path().join("blank.raw");
        std::fs::write(&img, vec![0u8; 1 << 20]).unwrap();
        let r = FakeRunner::new();
        let out = d.path().join("boot");
        let b = prepare(&r, &img, &out, BootMode::Auto).await.unwrap();
        assert!(
            matches!(&b, AclBoot::Uefi { why } if why.contains("no GPT")),
            "{b:?}"
        );
        let e = prepare(&r, &img, &out, BootMode::Kernel).await.unwrap_err();
        assert!(format!("{e:#}").contains("ACL_BOOT=kernel"), "{e:#}");
        let b = prepare(&r, Path::new("/nonexistent"), &out, BootMode::Uefi)
            .await
            .unwrap();
        assert_eq!(
            b,
            AclBoot::Uefi {
                why: "ACL_BOOT=uefi".into()
            }
        );
    }

    /// The brief's synthetic disk made with the real tools (sgdisk, mkfs.vfat, mcopy): a GRUB
    /// config and a vmlinuz; then the same as qcow2 (through `qemu-img dd`).
    #[tokio::test]
    async fn grub_image_made_by_the_real_tools() {
        if let Err(t) = testimg::tools() {
            println!("skipped: {t} is not installed (Debian: gdisk, dosfstools, mtools)");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let img = d.path().join("flatcar.img");
        let files = vec![
            (
                "EFI/boot/grub.cfg",
                b"set oem_id=\"azure\"\nmenuentry \"Flatcar default\" {\n    linux /flatcar/vmlinuz-a console=ttyS0,115200n8 root=LABEL=ROOT flatcar.first_boot=detected\n}\n"
                    .to_vec(),
            ),
            ("flatcar/vmlinuz-a", b"bzImage".repeat(5000)),
        ];
        testimg::tools_image(&img, d.path(), &files).await;
        let r = flex_host::runner::ProcessRunner::new();
        let out = d.path().join("boot");
        let b = prepare(&r, &img, &out, BootMode::Auto).await.unwrap();
        let AclBoot::Kernel {
            kernel,
            initrd,
            first_boot_append,
            ..
        } = b
        else {
            panic!("{b:?}")
        };
        assert_eq!(std::fs::read(&kernel).unwrap(), b"bzImage".repeat(5000));
        assert_eq!(initrd, None);
        assert_eq!(
            first_boot_append,
            "console=ttyS0,115200n8 root=LABEL=ROOT flatcar.oem.id=qemu ignition.platform.id=qemu flatcar.first_boot=1"
        );
        if r.which("qemu-img").is_none() {
            println!("skipped the qcow2 half: qemu-img is not installed (Debian: qemu-utils)");
            return;
        }
        let q = d.path().join("flatcar.qcow2");
        r.run(
            &flex_host::runner::Cmd::new("qemu-img")
                .args(["convert", "-f", "raw", "-O", "qcow2"])
                .arg(img.display().to_string())
                .arg(q.display().to_string()),
        )
        .await
        .unwrap();
        let b = prepare(&r, &q, &out, BootMode::Auto).await.unwrap();
        assert!(matches!(b, AclBoot::Kernel { .. }), "{b:?}");
        assert!(!out.join("esp.raw").exists(), "the ESP copy is left behind");
    }
}
