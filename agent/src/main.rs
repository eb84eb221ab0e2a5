//! `aks-flex-node`: parses the command line and runs it; all logic is in the library.

use std::process::ExitCode;

fn main() -> ExitCode {
    aks_flex_node::cli::main_with_args(std::env::args_os().collect())
}
