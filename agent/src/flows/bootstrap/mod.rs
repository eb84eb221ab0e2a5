//! Bootstrap: turn a host into a node from a small set of `AKS_FLEX_NODE_*` inputs.
//!
//! `scripts/bootstrap.sh` installs the agent (or, with `--use-installed-agent`, uses the one in
//! `--install-dir`) and then runs `aks-flex-node bootstrap-node`; in the agent's image
//! `aks-flex-node-bootstrap` runs the same flow on `/etc/aks-flex-node/bootstrap.env`. So the
//! rendering, preflight and `start` logic exists once, here (see `docs/bootstrap.md`):
//!
//! - the `bootstrap.env` format, read as data, never evaluated, is `flex_api::bootstrap_env`;
//! - [`inputs`]: the input names ([`INPUTS`]) and [`Inputs`], from the file and the
//!   environment;
//! - [`render`](mod@render): inputs → `config.json`, validated by the agent's own config parser;
//! - [`flow`]: config, preflight, then `start` once ([`main_entry`], [`run`]);
//! - [`dry_run`]: what the bootstrap would write, rendered and validated, the host unchanged
//!   (`bootstrap-node --dry-run`).

pub mod dry_run;
pub mod flow;
pub mod inputs;
pub mod render;

pub use flow::{BOOTSTRAP_ENV_PATH, Outcome, RunStart, StartRunner, main_entry, run};
pub use inputs::{INPUTS, InputSpec, Inputs, Kind};
pub use render::{RenderError, Rendered, render};
