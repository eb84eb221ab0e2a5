//! Azure Container Linux images for the harness: where the image comes from and how it boots.
//!
//! - [`gallery`]: the image from the Azure compute gallery, exported with the Azure CLI
//!   through a temporary managed disk and its SAS URL ([`download`]) to a cached qcow2.
//! - [`boot`]: UEFI firmware, or a direct kernel boot when the image's own boot configuration
//!   would select the Azure platform; the decision is a pure function over what [`disk`]
//!   (GPT and the FAT EFI system partition) and [`pe`] (UKI sections) read from the image.

pub mod boot;
pub mod disk;
pub mod download;
pub mod gallery;
pub mod pe;

pub use boot::{AclBoot, BootMode};
