//! The shared kit of the check groups: what more than one group uses, so that a group module
//! (`groups::<name>`) imports only the kit and the harness's other helper modules, never
//! another group. [`agent`]: where the agent runs, the host's bootstrap inputs and reset;
//! [`cluster`]: the cluster groups' environment, shared checks and steps; [`candidates`]: the
//! upgrade candidate images; [`upgrade_status`]: what the upgrade checks read from the host.

pub mod agent;
pub mod candidates;
pub mod cluster;
pub mod upgrade_status;
