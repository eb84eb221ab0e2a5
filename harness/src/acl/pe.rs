//! The sections of a PE image, enough to take a unified kernel image (UKI) apart: its
//! `.linux` (the kernel), `.initrd` and `.cmdline` sections, and the `.cmdline` of a UKI
//! add-on (`*.addon.efi`). This is what `objcopy -O binary --only-section=…` extracts.

use std::ops::Range;

/// One section: its name and where its data is in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Section {
    /// The name (`.linux`), without the NUL padding.
    pub name: String,
    /// The section's bytes in the file: the virtual size, bounded by the raw size (the raw
    /// size is rounded up to the file alignment; the virtual size is what the section holds).
    pub range: Range<usize>,
}

/// Why a file is not a PE image this module can read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PeError {
    /// No `MZ` or `PE\0\0` signature.
    #[error("not a PE image ({0})")]
    NotPe(&'static str),
    /// A header or section points past the end of the file.
    #[error("truncated PE image ({0})")]
    Truncated(&'static str),
}

fn u16_at(d: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_le_bytes(d.get(off..off + 2)?.try_into().ok()?))
}

fn u32_at(d: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(d.get(off..off + 4)?.try_into().ok()?))
}

/// The sections of the PE image `data`.
pub fn sections(data: &[u8]) -> Result<Vec<Section>, PeError> {
    if data.get(..2) != Some(b"MZ") {
        return Err(PeError::NotPe("no MZ header"));
    }
    let pe = u32_at(data, 0x3c).ok_or(PeError::Truncated("DOS header"))? as usize;
    if data.get(pe..pe + 4) != Some(b"PE\0\0") {
        return Err(PeError::NotPe("no PE signature"));
    }
    let coff = pe + 4;
    let count = u16_at(data, coff + 2).ok_or(PeError::Truncated("COFF header"))? as usize;
    let optional = u16_at(data, coff + 16).ok_or(PeError::Truncated("COFF header"))? as usize;
    let table = coff + 20 + optional;
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let h = table + i * 40;
        let raw_name = data
            .get(h..h + 8)
            .ok_or(PeError::Truncated("section table"))?;
        let name_len = raw_name.iter().position(|b| *b == 0).unwrap_or(8);
        let name = String::from_utf8_lossy(&raw_name[..name_len]).into_owned();
        let virtual_size = u32_at(data, h + 8).ok_or(PeError::Truncated("section table"))?;
        let raw_size = u32_at(data, h + 16).ok_or(PeError::Truncated("section table"))?;
        let raw_ptr = u32_at(data, h + 20).ok_or(PeError::Truncated("section table"))? as usize;
        let len = if virtual_size == 0 {
            raw_size
        } else {
            virtual_size.min(raw_size)
        } as usize;
        let end = raw_ptr
            .checked_add(len)
            .filter(|e| *e <= data.len())
            .ok_or(PeError::Truncated("section data"))?;
        out.push(Section {
            name,
            range: raw_ptr..end,
        });
    }
    Ok(out)
}

/// The data of section `name` of `data`, if the image has it.
pub fn section<'a>(data: &'a [u8], name: &str) -> Result<Option<&'a [u8]>, PeError> {
    Ok(sections(data)?
        .into_iter()
        .find(|s| s.name == name)
        .map(|s| &data[s.range]))
}

/// A `.cmdline` section as text: UTF-8 (lossy), without trailing NULs and white space.
pub fn cmdline_text(raw: &[u8]) -> String {
    String::from_utf8_lossy(raw)
        .trim_end_matches(['\0', '\n', '\r', ' '])
        .trim()
        .to_string()
}

/// Builds a minimal PE image with `sections` (name, data), as `ukify` lays them out: headers,
/// then each section's data at a 512-byte aligned offset, raw sizes rounded up. For tests.
#[cfg(test)]
pub(crate) fn build(sections: &[(&str, &[u8])]) -> Vec<u8> {
    let pe = 0x80usize;
    let optional = 0xf0usize; // PE32+ optional header size
    let table = pe + 24 + optional;
    let headers = table + sections.len() * 40;
    let align = |n: usize| n.div_ceil(512) * 512;
    let mut data = vec![0u8; align(headers)];
    data[..2].copy_from_slice(b"MZ");
    data[0x3c..0x40].copy_from_slice(&(pe as u32).to_le_bytes());
    data[pe..pe + 4].copy_from_slice(b"PE\0\0");
    data[pe + 4..pe + 6].copy_from_slice(&0x8664u16.to_le_bytes());
    data[pe + 6..pe + 8].copy_from_slice(&(sections.len() as u16).to_le_bytes());
    data[pe + 20..pe + 22].copy_from_slice(&(optional as u16).to_le_bytes());
    data[pe + 24..pe + 26].copy_from_slice(&0x20bu16.to_le_bytes());
    for (i, (name, bytes)) in sections.iter().enumerate() {
        let h = table + i * 40;
        let ptr = data.len();
        let raw = align(bytes.len().max(1));
        let mut n = [0u8; 8];
        n[..name.len()].copy_from_slice(name.as_bytes());
        data[h..h + 8].copy_from_slice(&n);
        data[h + 8..h + 12].copy_from_slice(&(bytes.len() as u32).to_le_bytes());
        data[h + 12..h + 16].copy_from_slice(&((i as u32 + 1) * 0x10_0000).to_le_bytes());
        data[h + 16..h + 20].copy_from_slice(&(raw as u32).to_le_bytes());
        data[h + 20..h + 24].copy_from_slice(&(ptr as u32).to_le_bytes());
        data.extend_from_slice(bytes);
        data.resize(ptr + raw, 0);
    }
    data
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_uki_sections() {
        let img = build(&[
            (".osrel", b"ID=acl\n"),
            (".cmdline", b"console=ttyS0 flatcar.oem.id=azure\0"),
            (".linux", b"KERNEL"),
            (".initrd", b"INITRD-DATA"),
        ]);
        let names: Vec<String> = sections(&img)
            .unwrap()
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(names, [".osrel", ".cmdline", ".linux", ".initrd"]);
        assert_eq!(section(&img, ".linux").unwrap(), Some(&b"KERNEL"[..]));
        assert_eq!(section(&img, ".initrd").unwrap(), Some(&b"INITRD-DATA"[..]));
        assert_eq!(section(&img, ".dtb").unwrap(), None);
        let cmd = section(&img, ".cmdline").unwrap().unwrap();
        assert_eq!(cmdline_text(cmd), "console=ttyS0 flatcar.oem.id=azure");
    }

    #[test]
    fn rejects_what_is_not_pe() {
        assert_eq!(sections(b"ELF"), Err(PeError::NotPe("no MZ header")));
        let mut img = build(&[(".linux", b"K")]);
        img[0x80] = b'X';
        assert_eq!(sections(&img), Err(PeError::NotPe("no PE signature")));
        let img = build(&[(".linux", &[1u8; 600])]);
        assert!(matches!(
            sections(&img[..img.len() - 600]),
            Err(PeError::Truncated(_))
        ));
    }
}
