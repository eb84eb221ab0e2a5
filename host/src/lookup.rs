//! Program lookup on a `PATH`, as `execvp` does it. Shared by the runner and host-exec (which
//! both resolve programs), so neither imports the other for it.

use std::path::PathBuf;

/// Resolves `program` against a `PATH` value, as `execvp` would.
pub fn which_on(program: &str, path: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    if program.contains('/') {
        let p = PathBuf::from(program);
        return is_executable(&p).then_some(p);
    }
    let path = path?;
    std::env::split_paths(path)
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(p: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}
