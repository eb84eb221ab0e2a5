//! OCI manifests and indexes (`flex_oci::manifest::parse_manifest`, `select_platform`), with
//! the HTTP `Content-Type` taken from the input's first line: either an error or a document
//! whose serialization parses back to the same kind with the same descriptors.

#![no_main]

use flex_oci::manifest::{Arch, Manifest, parse_manifest, select_platform};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // First line: the Content-Type (empty: none); the rest: the body.
    let (content_type, body) = match data.iter().position(|b| *b == b'\n') {
        Some(i) => (std::str::from_utf8(&data[..i]).ok(), &data[i + 1..]),
        None => (None, data),
    };
    let content_type = content_type.filter(|c| !c.is_empty());
    let Ok(m) = parse_manifest(content_type, body) else {
        return;
    };
    match &m {
        Manifest::Index(ix) => {
            for arch in [Arch::Amd64, Arch::Arm64] {
                let _ = select_platform(ix, arch);
            }
            let json = serde_json::to_vec(ix).expect("serialize index");
            match parse_manifest(None, &json) {
                Ok(Manifest::Index(back)) => assert_eq!(back.manifests, ix.manifests),
                other => panic!("index reparsed as {other:?}"),
            }
        }
        Manifest::Image(im) => {
            let json = serde_json::to_vec(im).expect("serialize manifest");
            match parse_manifest(None, &json) {
                Ok(Manifest::Image(back)) => {
                    assert_eq!(back.config, im.config);
                    assert_eq!(back.layers, im.layers);
                }
                other => panic!("manifest reparsed as {other:?}"),
            }
        }
    }
});
