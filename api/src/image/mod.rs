//! Image references and content digests: the pure parsing and hashing that operation
//! parameters, the goal's machine image and the OCI puller (`flex-oci`) share.
//!
//! - [`reference`]: image references (`registry/repository[:tag][@digest]`, local layouts);
//! - [`digest`]: `sha256:<hex>` digests and their verification.

pub mod digest;
pub mod reference;

pub use digest::Digest;
pub use reference::{ImageRef, ImageSource, LayoutTarget, ReferenceError};
