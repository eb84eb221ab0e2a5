//! Image references (`flex_api::image::reference`) and digests: a string either fails to
//! parse or parses to a value whose `Display` (the canonical form) parses back to the same
//! value, for registry references and `oci-layout://` sources alike.

#![no_main]

use flex_api::image::digest::Digest;
use flex_api::image::reference::{ImageRef, ImageSource};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(r) = ImageRef::parse(s) {
        let shown = r.to_string();
        assert_eq!(
            ImageRef::parse(&shown).as_ref(),
            Ok(&r),
            "{s:?} -> {shown:?}"
        );
        let _ = (r.api_host(), r.reference());
    }
    if let Ok(src) = ImageSource::parse(s) {
        let shown = src.to_string();
        assert_eq!(
            ImageSource::parse(&shown).as_ref(),
            Ok(&src),
            "{s:?} -> {shown:?}"
        );
    }
    if let Ok(d) = Digest::parse(s) {
        assert_eq!(Digest::parse(&d.to_string()).as_ref(), Ok(&d));
    }
});
