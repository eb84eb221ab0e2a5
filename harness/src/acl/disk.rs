//! Reading the EFI system partition (ESP) of an OS image without mounting it: the GPT
//! (protective MBR, header, partition entries) parsed here, the ESP's FAT file system read
//! with the `fatfs` crate. A raw image is read in place; a qcow2 image has its first MiB and
//! then its ESP copied out to raw files with `qemu-img dd` (through the runner).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use flex_host::runner::{Cmd, Runner};

/// The ESP's partition type GUID.
pub const ESP_TYPE: &str = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B";

/// How many bytes at the start of an image hold the GPT (header and entries), for 512- and
/// 4096-byte sectors alike.
pub const HEAD_BYTES: u64 = 1 << 20;

/// One GPT partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    /// 1-based number, as Linux names it (`/dev/vda1`).
    pub number: u32,
    /// The type GUID, upper case.
    pub type_guid: String,
    /// First sector.
    pub first_lba: u64,
    /// Last sector (inclusive).
    pub last_lba: u64,
    /// The partition's name (`EFI-SYSTEM`).
    pub name: String,
}

impl Partition {
    /// Whether this is an EFI system partition.
    pub fn is_esp(&self) -> bool {
        self.type_guid == ESP_TYPE
    }
}

/// A parsed GPT.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpt {
    /// Logical sector size: 512 or 4096.
    pub sector_size: u64,
    /// The used entries, in table order.
    pub partitions: Vec<Partition>,
}

impl Gpt {
    /// The (first) EFI system partition.
    pub fn esp(&self) -> Option<&Partition> {
        self.partitions.iter().find(|p| p.is_esp())
    }

    /// Byte offset and length of `p`.
    pub fn bytes(&self, p: &Partition) -> (u64, u64) {
        (
            p.first_lba * self.sector_size,
            (p.last_lba + 1 - p.first_lba) * self.sector_size,
        )
    }
}

fn le_u32(d: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(d.get(off..off + 4)?.try_into().ok()?))
}

fn le_u64(d: &[u8], off: usize) -> Option<u64> {
    Some(u64::from_le_bytes(d.get(off..off + 8)?.try_into().ok()?))
}

/// A GUID in its usual text form (the first three fields are little-endian on disk).
pub fn guid_string(b: &[u8; 16]) -> String {
    format!(
        "{:02X}{:02X}{:02X}{:02X}-{:02X}{:02X}-{:02X}{:02X}-{:02X}{:02X}-{:02X}{:02X}{:02X}{:02X}{:02X}{:02X}",
        b[3],
        b[2],
        b[1],
        b[0],
        b[5],
        b[4],
        b[7],
        b[6],
        b[8],
        b[9],
        b[10],
        b[11],
        b[12],
        b[13],
        b[14],
        b[15]
    )
}

/// Parses the GPT in `head` (the image's first bytes, [`HEAD_BYTES`] is enough): the header at
/// sector 1 for 512-byte sectors, else for 4096-byte sectors.
pub fn parse_gpt(head: &[u8]) -> Result<Gpt> {
    for sector_size in [512u64, 4096] {
        let h = sector_size as usize;
        if head.get(h..h + 8) != Some(b"EFI PART") {
            continue;
        }
        let field = |off: usize| le_u64(head, h + off).context("truncated GPT header");
        let entries_lba = field(72)?;
        let count = le_u32(head, h + 80).context("truncated GPT header")? as usize;
        let entry_size = le_u32(head, h + 84).context("truncated GPT header")? as usize;
        if entry_size < 128 || count > 1024 {
            bail!("implausible GPT: {count} entries of {entry_size} bytes");
        }
        let base = (entries_lba * sector_size) as usize;
        let mut partitions = Vec::new();
        for i in 0..count {
            let e = base + i * entry_size;
            let Some(entry) = head.get(e..e + 128) else {
                bail!(
                    "the GPT's partition entries go past the first {} bytes",
                    head.len()
                );
            };
            let mut type_guid = [0u8; 16];
            type_guid.copy_from_slice(&entry[..16]);
            if type_guid == [0u8; 16] {
                continue;
            }
            let name: Vec<u16> = entry[56..128]
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .take_while(|c| *c != 0)
                .collect();
            partitions.push(Partition {
                number: i as u32 + 1,
                type_guid: guid_string(&type_guid),
                first_lba: le_u64(entry, 32).unwrap_or_default(),
                last_lba: le_u64(entry, 40).unwrap_or_default(),
                name: String::from_utf16_lossy(&name),
            });
        }
        return Ok(Gpt {
            sector_size,
            partitions,
        });
    }
    bail!("no GPT (no \"EFI PART\" header at sector 1 for 512- or 4096-byte sectors)")
}

/// An image's format, from its first bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// qcow2 (`QFI\xfb`).
    Qcow2,
    /// Anything else is taken as raw.
    Raw,
}

impl Format {
    /// qemu-img's name of the format.
    pub fn name(self) -> &'static str {
        match self {
            Format::Qcow2 => "qcow2",
            Format::Raw => "raw",
        }
    }
}

/// The format of the image whose first bytes are `head`.
pub fn sniff(head: &[u8]) -> Format {
    if head.starts_with(b"QFI\xfb") {
        Format::Qcow2
    } else {
        Format::Raw
    }
}

/// The largest `qemu-img dd` block size that divides both `offset` and `len`.
pub fn dd_block(offset: u64, len: u64) -> u64 {
    [1u64 << 20, 1 << 16, 1 << 12, 512, 1]
        .into_iter()
        .find(|b| offset.is_multiple_of(*b) && len.is_multiple_of(*b))
        .unwrap_or(1)
}

/// `qemu-img dd`'s argv copying `len` bytes at `offset` of `image` (in `format`) to the raw
/// file `out`.
pub fn dd_cmd(image: &Path, format: Format, offset: u64, len: u64, out: &Path) -> Cmd {
    let bs = dd_block(offset, len);
    Cmd::new("qemu-img")
        .args(["dd", "-f", format.name(), "-O", "raw"])
        .arg(format!("bs={bs}"))
        .arg(format!("skip={}", offset / bs))
        .arg(format!("count={}", len / bs))
        .arg(format!("if={}", image.display()))
        .arg(format!("of={}", out.display()))
        .timeout(Duration::from_secs(600))
}

/// Where the ESP's bytes are: a file, and the partition's offset and length in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EspLocation {
    /// A raw file: the image itself, or a copy of the partition.
    pub file: PathBuf,
    /// Offset of the partition in `file`.
    pub offset: u64,
    /// Its length.
    pub len: u64,
}

/// Finds the ESP of `image`: a raw image's in place, a qcow2 image's copied into `scratch`
/// with `qemu-img dd`.
pub async fn locate_esp(runner: &dyn Runner, image: &Path, scratch: &Path) -> Result<EspLocation> {
    let mut magic = [0u8; 4];
    File::open(image)
        .and_then(|mut f| f.read_exact(&mut magic))
        .with_context(|| format!("reading {}", image.display()))?;
    let format = sniff(&magic);
    std::fs::create_dir_all(scratch)?;
    let head = match format {
        Format::Raw => {
            let mut head = Vec::new();
            File::open(image)?.take(HEAD_BYTES).read_to_end(&mut head)?;
            head
        }
        Format::Qcow2 => {
            let out = scratch.join("head.raw");
            let _ = std::fs::remove_file(&out);
            runner
                .run(&dd_cmd(image, format, 0, HEAD_BYTES, &out))
                .await?;
            std::fs::read(&out)?
        }
    };
    let gpt = parse_gpt(&head).with_context(|| format!("{}", image.display()))?;
    let esp = gpt
        .esp()
        .with_context(|| format!("{} has no EFI system partition", image.display()))?;
    let (offset, len) = gpt.bytes(esp);
    match format {
        Format::Raw => Ok(EspLocation {
            file: image.to_path_buf(),
            offset,
            len,
        }),
        Format::Qcow2 => {
            let out = scratch.join("esp.raw");
            let _ = std::fs::remove_file(&out);
            runner
                .run(&dd_cmd(image, format, offset, len, &out))
                .await?;
            Ok(EspLocation {
                file: out,
                offset: 0,
                len,
            })
        }
    }
}

/// A read-only byte window of a file, as the FAT reader's disk.
struct Window {
    file: File,
    start: u64,
    len: u64,
    pos: u64,
}

impl Read for Window {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.len.saturating_sub(self.pos);
        let n = (buf.len() as u64).min(left) as usize;
        if n == 0 {
            return Ok(0);
        }
        self.file.seek(SeekFrom::Start(self.start + self.pos))?;
        let got = self.file.read(&mut buf[..n])?;
        self.pos += got as u64;
        Ok(got)
    }
}

impl Seek for Window {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        let target = match to {
            SeekFrom::Start(o) => Some(o),
            SeekFrom::End(d) => self.len.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        match target {
            Some(t) if t <= self.len => {
                self.pos = t;
                Ok(t)
            }
            _ => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "seek outside the partition",
            )),
        }
    }
}

impl Write for Window {
    fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
        Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "the ESP is read only here",
        ))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The ESP's FAT file system, read only.
pub struct Esp {
    fs: fatfs::FileSystem<Window>,
}

impl Esp {
    /// Opens the FAT file system at `loc`.
    pub fn open(loc: &EspLocation) -> Result<Self> {
        let file =
            File::open(&loc.file).with_context(|| format!("opening {}", loc.file.display()))?;
        let window = Window {
            file,
            start: loc.offset,
            len: loc.len,
            pos: 0,
        };
        let fs = fatfs::FileSystem::new(window, fatfs::FsOptions::new())
            .context("the EFI system partition is not a FAT file system")?;
        Ok(Self { fs })
    }

    /// Every regular file, as `/`-separated paths from the root (`EFI/Linux/acl.efi`), sorted.
    pub fn files(&self) -> Result<Vec<String>> {
        fn walk(
            dir: fatfs::Dir<'_, Window>,
            prefix: &str,
            out: &mut Vec<String>,
            depth: usize,
        ) -> Result<()> {
            if depth > 16 {
                bail!("directories nested deeper than 16 levels under {prefix}");
            }
            for e in dir.iter() {
                let e = e?;
                let name = e.file_name();
                if name == "." || name == ".." {
                    continue;
                }
                let path = if prefix.is_empty() {
                    name
                } else {
                    format!("{prefix}/{name}")
                };
                if e.is_dir() {
                    walk(e.to_dir(), &path, out, depth + 1)?;
                } else {
                    out.push(path);
                }
            }
            Ok(())
        }
        let mut out = Vec::new();
        walk(self.fs.root_dir(), "", &mut out, 0)?;
        out.sort();
        Ok(out)
    }

    /// The contents of the file at `path` (as [`Esp::files`] names it).
    pub fn read(&self, path: &str) -> Result<Vec<u8>> {
        let mut f = self
            .fs
            .root_dir()
            .open_file(path)
            .with_context(|| format!("opening {path} on the EFI system partition"))?;
        let mut data = Vec::new();
        f.read_to_end(&mut data)
            .with_context(|| format!("reading {path} on the EFI system partition"))?;
        Ok(data)
    }
}

/// Test images: a GPT disk with a FAT ESP holding given files, made in Rust (always) or with
/// sgdisk, mkfs.vfat and mcopy (when installed).
#[cfg(test)]
pub(crate) mod testimg {
    use super::*;

    /// The ESP's first sector in test images (1 MiB).
    pub const ESP_START: u64 = 2048;
    /// The ESP's size in sectors (64 MiB: enough clusters for FAT32 with 512-byte clusters).
    pub const ESP_SECTORS: u64 = 64 * 2048;
    /// The whole disk (80 MiB).
    pub const DISK_BYTES: u64 = 80 << 20;

    fn guid_bytes(s: &str) -> [u8; 16] {
        let h: Vec<u8> = (0..32)
            .map(|i| {
                let hex: String = s.chars().filter(|c| *c != '-').collect();
                u8::from_str_radix(&hex[i * 2..i * 2 + 2], 16).unwrap()
            })
            .take(16)
            .collect();
        [
            h[3], h[2], h[1], h[0], h[5], h[4], h[7], h[6], h[8], h[9], h[10], h[11], h[12], h[13],
            h[14], h[15],
        ]
    }

    /// Writes a GPT with one partition of `type_guid` named `name` at [`ESP_START`] (no CRCs:
    /// the reader does not check them).
    pub fn write_gpt(disk: &mut File, type_guid: &str, name: &str) {
        let mut head = vec![0u8; 34 * 512];
        head[510] = 0x55;
        head[511] = 0xaa;
        let h = 512;
        head[h..h + 8].copy_from_slice(b"EFI PART");
        head[h + 72..h + 80].copy_from_slice(&2u64.to_le_bytes());
        head[h + 80..h + 84].copy_from_slice(&128u32.to_le_bytes());
        head[h + 84..h + 88].copy_from_slice(&128u32.to_le_bytes());
        let e = 1024;
        head[e..e + 16].copy_from_slice(&guid_bytes(type_guid));
        head[e + 16] = 1;
        head[e + 32..e + 40].copy_from_slice(&ESP_START.to_le_bytes());
        head[e + 40..e + 48].copy_from_slice(&(ESP_START + ESP_SECTORS - 1).to_le_bytes());
        for (i, c) in name.encode_utf16().enumerate() {
            head[e + 56 + i * 2..e + 58 + i * 2].copy_from_slice(&c.to_le_bytes());
        }
        disk.seek(SeekFrom::Start(0)).unwrap();
        disk.write_all(&head).unwrap();
    }

    /// A raw disk at `path` with a GPT and a FAT ESP holding `files`, all made in Rust.
    pub fn rust_image(path: &Path, files: &[(&str, Vec<u8>)]) {
        let mut disk = File::options()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        disk.set_len(DISK_BYTES).unwrap();
        write_gpt(&mut disk, ESP_TYPE, "EFI-SYSTEM");
        let part = fscommon_slice(&disk);
        fatfs::format_volume(
            part,
            fatfs::FormatVolumeOptions::new().volume_label(*b"EFI-SYSTEM "),
        )
        .unwrap();
        let fs = fatfs::FileSystem::new(fscommon_slice(&disk), fatfs::FsOptions::new()).unwrap();
        for (p, data) in files {
            let root = fs.root_dir();
            let mut dir = root.clone();
            let parts: Vec<&str> = p.split('/').collect();
            for d in &parts[..parts.len() - 1] {
                dir = match dir.open_dir(d) {
                    Ok(x) => x,
                    Err(_) => dir.create_dir(d).unwrap(),
                };
            }
            let mut f = dir.create_file(parts[parts.len() - 1]).unwrap();
            f.truncate().unwrap();
            f.write_all(data).unwrap();
        }
        fs.unmount().unwrap();
    }

    /// A writable window over the test ESP.
    pub struct RwSlice {
        file: File,
        pos: u64,
    }

    const OFF: u64 = ESP_START * 512;
    const LEN: u64 = ESP_SECTORS * 512;

    fn fscommon_slice(f: &File) -> RwSlice {
        RwSlice {
            file: f.try_clone().unwrap(),
            pos: 0,
        }
    }

    impl Read for RwSlice {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = (buf.len() as u64).min(LEN - self.pos) as usize;
            self.file.seek(SeekFrom::Start(OFF + self.pos))?;
            let got = self.file.read(&mut buf[..n])?;
            self.pos += got as u64;
            Ok(got)
        }
    }

    impl Write for RwSlice {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let n = (buf.len() as u64).min(LEN - self.pos) as usize;
            self.file.seek(SeekFrom::Start(OFF + self.pos))?;
            let put = self.file.write(&buf[..n])?;
            self.pos += put as u64;
            Ok(put)
        }

        fn flush(&mut self) -> std::io::Result<()> {
            self.file.flush()
        }
    }

    impl Seek for RwSlice {
        fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
            self.pos = match to {
                SeekFrom::Start(o) => o,
                SeekFrom::End(d) => LEN.checked_add_signed(d).unwrap(),
                SeekFrom::Current(d) => self.pos.checked_add_signed(d).unwrap(),
            };
            Ok(self.pos)
        }
    }

    /// A tool [`tools_image`] needs is not installed (the test that needs it is skipped).
    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    pub struct ToolMissing(pub &'static str);

    /// The tools [`tools_image`] needs, or the first one missing.
    pub fn tools() -> Result<(), ToolMissing> {
        for t in ["sgdisk", "mkfs.vfat", "mcopy", "mmd"] {
            if flex_host::runner::which_on(t, std::env::var_os("PATH").as_deref()).is_none()
                && !Path::new("/usr/sbin").join(t).exists()
            {
                return Err(ToolMissing(t));
            }
        }
        Ok(())
    }

    fn tool(name: &str) -> String {
        match flex_host::runner::which_on(name, std::env::var_os("PATH").as_deref()) {
            Some(p) => p.display().to_string(),
            None => format!("/usr/sbin/{name}"),
        }
    }

    /// The same disk made as a person would: truncate, sgdisk, mkfs.vfat on a separate file,
    /// mmd and mcopy into it, then the file copied into the disk at the partition's offset.
    pub async fn tools_image(path: &Path, scratch: &Path, files: &[(&str, Vec<u8>)]) {
        use flex_host::runner::ProcessRunner;
        let r = ProcessRunner::new();
        File::create(path).unwrap().set_len(DISK_BYTES).unwrap();
        r.run(&Cmd::new(tool("sgdisk")).args([
            "--new".to_string(),
            format!("1:{ESP_START}:{}", ESP_START + ESP_SECTORS - 1),
            "--typecode=1:ef00".into(),
            "--change-name=1:EFI-SYSTEM".into(),
            path.display().to_string(),
        ]))
        .await
        .unwrap();
        let part = scratch.join("esp.vfat");
        File::create(&part).unwrap().set_len(LEN).unwrap();
        r.run(
            &Cmd::new(tool("mkfs.vfat"))
                .args(["-F", "32", "-s", "1", "-n", "EFI-SYSTEM"])
                .arg(part.display().to_string()),
        )
        .await
        .unwrap();
        let img = format!("{}", part.display());
        let mut made = std::collections::BTreeSet::new();
        for (p, data) in files {
            let parts: Vec<&str> = p.split('/').collect();
            for i in 1..parts.len() {
                let d = parts[..i].join("/");
                if made.insert(d.clone()) {
                    r.run(&Cmd::new(tool("mmd")).args(["-i", &img, &format!("::{d}")]))
                        .await
                        .unwrap();
                }
            }
            let src = scratch.join("payload");
            std::fs::write(&src, data).unwrap();
            r.run(&Cmd::new(tool("mcopy")).args([
                "-i",
                &img,
                &src.display().to_string(),
                &format!("::{p}"),
            ]))
            .await
            .unwrap();
        }
        let bytes = std::fs::read(&part).unwrap();
        let mut disk = File::options().write(true).open(path).unwrap();
        disk.seek(SeekFrom::Start(OFF)).unwrap();
        disk.write_all(&bytes).unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::testimg::*;
    use super::*;
    use flex_testkit::FakeRunner;

    fn files() -> Vec<(&'static str, Vec<u8>)> {
        vec![
            ("EFI/BOOT/grub.cfg", b"set oem_id=\"azure\"\n".to_vec()),
            ("flatcar/vmlinuz-a", vec![7u8; 300_000]),
        ]
    }

    #[test]
    fn guid_text_is_mixed_endian() {
        let b = [
            0x28, 0x73, 0x2a, 0xc1, 0x1f, 0xf8, 0xd2, 0x11, 0xba, 0x4b, 0x00, 0xa0, 0xc9, 0x3e,
            0xc9, 0x3b,
        ];
        assert_eq!(guid_string(&b), ESP_TYPE);
    }

    #[test]
    fn gpt_and_fat_of_a_rust_made_image() {
        let d = tempfile::tempdir().unwrap();
        let img = d.path().join("disk.raw");
        rust_image(&img, &files());
        let head = std::fs::read(&img).unwrap()[..HEAD_BYTES as usize].to_vec();
        let gpt = parse_gpt(&head).unwrap();
        assert_eq!(gpt.sector_size, 512);
        let esp = gpt.esp().unwrap();
        assert_eq!((esp.number, esp.name.as_str()), (1, "EFI-SYSTEM"));
        assert_eq!(gpt.bytes(esp), (ESP_START * 512, ESP_SECTORS * 512));
        let (offset, len) = gpt.bytes(esp);
        let fs = Esp::open(&EspLocation {
            file: img,
            offset,
            len,
        })
        .unwrap();
        assert_eq!(
            fs.files().unwrap(),
            ["EFI/BOOT/grub.cfg", "flatcar/vmlinuz-a"]
        );
        assert_eq!(fs.read("flatcar/vmlinuz-a").unwrap(), vec![7u8; 300_000]);
    }

    #[test]
    fn no_gpt_is_an_error() {
        let err = parse_gpt(&[0u8; 8192]).unwrap_err().to_string();
        assert!(err.contains("no GPT"), "{err}");
    }

    #[test]
    fn dd_blocks_and_argv() {
        assert_eq!(dd_block(1 << 20, 256 << 20), 1 << 20);
        assert_eq!(dd_block(2048 * 512, 3 * 512), 512);
        let c = dd_cmd(
            Path::new("/c/acl.qcow2"),
            Format::Qcow2,
            1 << 20,
            256 << 20,
            Path::new("/w/esp.raw"),
        );
        assert_eq!(
            c.display_argv(),
            "qemu-img dd -f qcow2 -O raw bs=1048576 skip=1 count=256 if=/c/acl.qcow2 of=/w/esp.raw"
        );
        assert_eq!(sniff(b"QFI\xfb\0\0\0\x03"), Format::Qcow2);
        assert_eq!(sniff(&[0u8; 8]), Format::Raw);
    }

    #[tokio::test]
    async fn raw_images_are_read_in_place() {
        let d = tempfile::tempdir().unwrap();
        let img = d.path().join("disk.img");
        rust_image(&img, &files());
        let r = FakeRunner::new();
        let loc = locate_esp(&r, &img, &d.path().join("scratch"))
            .await
            .unwrap();
        assert_eq!(loc.file, img);
        assert_eq!(loc.offset, ESP_START * 512);
        assert!(r.calls().is_empty(), "{:?}", r.calls());
    }

    /// The reader agrees with the real tools: sgdisk's GPT and mkfs.vfat's FAT32 with long
    /// names written by mcopy; and a qcow2 copy of it is read through `qemu-img dd`.
    #[tokio::test]
    async fn images_made_by_the_real_tools() {
        if let Err(t) = tools() {
            println!("skipped: {t} is not installed (Debian: gdisk, dosfstools, mtools)");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let img = d.path().join("disk.img");
        tools_image(&img, d.path(), &files()).await;
        let r = flex_host::runner::ProcessRunner::new();
        let loc = locate_esp(&r, &img, &d.path().join("s1")).await.unwrap();
        let fs = Esp::open(&loc).unwrap();
        assert_eq!(
            fs.files().unwrap(),
            ["EFI/BOOT/grub.cfg", "flatcar/vmlinuz-a"]
        );
        assert_eq!(
            fs.read("EFI/BOOT/grub.cfg").unwrap(),
            b"set oem_id=\"azure\"\n"
        );
        if r.which("qemu-img").is_none() {
            println!("skipped the qcow2 half: qemu-img is not installed (Debian: qemu-utils)");
            return;
        }
        let q = d.path().join("disk.qcow2");
        r.run(
            &Cmd::new("qemu-img")
                .args(["convert", "-f", "raw", "-O", "qcow2"])
                .arg(img.display().to_string())
                .arg(q.display().to_string()),
        )
        .await
        .unwrap();
        let loc = locate_esp(&r, &q, &d.path().join("s2")).await.unwrap();
        assert_eq!((loc.offset, loc.len), (0, ESP_SECTORS * 512));
        let fs = Esp::open(&loc).unwrap();
        assert_eq!(fs.read("flatcar/vmlinuz-a").unwrap(), vec![7u8; 300_000]);
    }
}
