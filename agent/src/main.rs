//! `aks-flex-node`: a multi-call binary. Run as `entrypoint`, `host-exec` or a host tool's name
//! (in the agent's image, links to this binary), it is the image's entrypoint or runs a host
//! tool; as `aks-flex-node-bootstrap`, the bootstrap; otherwise the CLI. All logic is in the
//! library.

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    let argv0 = args.first().cloned().unwrap_or_default();
    let name = Path::new(&argv0)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let rest = args.get(1..).map(<[OsString]>::to_vec).unwrap_or_default();
    match name.as_str() {
        // Both must stay single-threaded until they exec (mount namespaces, chroot).
        "entrypoint" => fail(aks_flex_node::entrypoint::main(rest).map(|_| ())),
        n if n == "host-exec" || flex_host::hostexec::mode_of(n).is_some() => {
            match flex_host::hostexec::parse(&argv0, &rest) {
                Ok(inv) => fail(
                    flex_host::hostexec::exec(&inv)
                        .map(|_| ())
                        .map_err(Into::into),
                ),
                Err(e) => fail(Err(e.into())),
            }
        }
        "aks-flex-node-bootstrap" => aks_flex_node::cli::bootstrap_main(rest),
        _ => aks_flex_node::cli::main_with_args(args),
    }
}

/// Reports a failed exec-style entry point (they only return on failure).
fn fail(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e:#}");
            ExitCode::from(127)
        }
    }
}
