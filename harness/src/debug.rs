//! The debugging verbs, as kola's `spawn` gives its users: `cargo xtask ssh [-- CMD]` (a root
//! shell in the VM, or CMD run there as root), `cargo xtask console` (the serial console,
//! followed as `tail -F` does) and `cargo xtask journal [UNIT...]` (the guest's journal, the
//! agent's units by default). The commands are built by pure functions ([`ssh_cmd`],
//! [`journal_script`]) and run with the caller's terminal; the console is read by
//! [`ConsoleTail`], which survives QEMU starting a new log.

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use flex_host::runner::Cmd;

use crate::ssh::{Ssh, USER, shell_quote};

/// How long an interactive session or a followed journal may last.
pub const SESSION: Duration = Duration::from_secs(24 * 3600);

/// The `ssh` command of `cargo xtask ssh`: with no `cmd`, a root login shell (`sudo -i`); else
/// `cmd`'s words joined with spaces (as ssh joins them) run by `sh -c` as root. `tty` asks for
/// a terminal (`-t`), for an interactive shell or a command run from one.
pub fn ssh_cmd(ssh: &Ssh, cmd: &[String], tty: bool) -> Cmd {
    let mut c = ssh.base();
    if tty {
        c = c.arg("-t");
    }
    let c = c.arg(format!("{USER}@127.0.0.1"));
    let c = if cmd.is_empty() {
        c.args(["--", "sudo", "-i"])
    } else {
        c.args(["--", "sudo", "-n", "sh", "-c"])
            .arg(shell_quote(&cmd.join(" ")))
    };
    c.timeout(SESSION)
}

/// The guest command of `cargo xtask journal`: the last `lines` lines of `units` (the agent's
/// units, the machines and containerd when none are named; every unit with `all`), of every
/// boot the journal keeps, optionally followed.
pub fn journal_script(units: &[String], lines: u32, follow: bool, all: bool) -> String {
    let mut s = format!("journalctl --no-pager -o short-iso-precise -n {lines}");
    if follow {
        s.push_str(" -f");
    }
    if !all {
        let default: Vec<String>;
        let units = if units.is_empty() {
            default = crate::artefacts::AGENT_UNITS
                .iter()
                .map(|u| u.to_string())
                .collect();
            &default
        } else {
            units
        };
        for u in units {
            s.push_str(" -u ");
            s.push_str(&shell_quote(u));
        }
    }
    s
}

/// Follows a log file as `tail -F` does: from the start of its last `n` lines, then whatever is
/// appended; when the file is replaced (QEMU restarted: a new inode) or shrinks, from the start
/// of the new one, with a marker line.
pub struct ConsoleTail {
    path: PathBuf,
    offset: u64,
    inode: Option<u64>,
}

/// The marker printed where the console log was replaced.
pub const RESTARTED: &str = "\n--- console log restarted (QEMU started again) ---\n";

/// The offset in `bytes` where its last `n` lines begin (a last line without a newline counts).
pub fn last_lines_start(bytes: &[u8], n: usize) -> usize {
    if n == 0 {
        return bytes.len();
    }
    let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    let mut seen = 0;
    for (i, b) in body.iter().enumerate().rev() {
        if *b == b'\n' {
            seen += 1;
            if seen == n {
                return i + 1;
            }
        }
    }
    0
}

impl ConsoleTail {
    /// A follower of `path`, which need not exist yet, starting at its last `lines` lines.
    pub fn new(path: &Path, lines: usize) -> Self {
        let bytes = std::fs::read(path).unwrap_or_default();
        Self {
            path: path.to_path_buf(),
            offset: last_lines_start(&bytes, lines) as u64,
            inode: std::fs::metadata(path).ok().map(|m| m.ino()),
        }
    }

    /// What is new since the last poll (empty when nothing is, or the file is gone for now).
    pub fn poll(&mut self) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut f = match std::fs::File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(e),
        };
        let meta = f.metadata()?;
        let replaced = self.inode.is_some_and(|i| i != meta.ino()) || meta.len() < self.offset;
        if replaced {
            out.extend_from_slice(RESTARTED.as_bytes());
            self.offset = 0;
        }
        self.inode = Some(meta.ino());
        f.seek(SeekFrom::Start(self.offset))?;
        let before = out.len();
        f.read_to_end(&mut out)?;
        self.offset += (out.len() - before) as u64;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ssh() -> Ssh {
        Ssh {
            port: 2222,
            key: "/w/id".into(),
        }
    }

    #[test]
    fn ssh_without_a_command_is_a_root_login_shell_on_a_terminal() {
        let argv = ssh_cmd(&ssh(), &[], true).display_argv();
        assert!(argv.starts_with("ssh -i /w/id -p 2222 "), "{argv}");
        assert!(argv.ends_with(" -t flexadm@127.0.0.1 -- sudo -i"), "{argv}");
    }

    /// The command's words are joined as ssh joins them and quoted once for the remote shell, so
    /// a pipe or quote in them reaches `sh -c` intact.
    #[test]
    fn ssh_with_a_command_runs_it_as_root() {
        let cmd: Vec<String> = ["journalctl", "-u", "kubelet | tail -n 3", "it's"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let c = ssh_cmd(&ssh(), &cmd, false);
        let argv = c.display_argv();
        assert!(!argv.contains(" -t "), "{argv}");
        let args: Vec<&str> = c.arg_list().iter().map(|a| a.value()).collect();
        let n = args.len();
        assert_eq!(
            &args[n - 6..],
            [
                "--",
                "sudo",
                "-n",
                "sh",
                "-c",
                "'journalctl -u kubelet | tail -n 3 it'\\''s'"
            ]
        );
        assert_eq!(c.timeout_value(), SESSION);
    }

    #[test]
    fn journal_defaults_to_the_agents_units() {
        assert_eq!(
            journal_script(&[], 200, false, false),
            "journalctl --no-pager -o short-iso-precise -n 200 -u 'aks-flex-node-*' -u 'systemd-nspawn@*' -u 'containerd.service'"
        );
        assert_eq!(
            journal_script(&["kubelet.service".into()], 5, true, false),
            "journalctl --no-pager -o short-iso-precise -n 5 -f -u 'kubelet.service'"
        );
        assert_eq!(
            journal_script(&[], 10, false, true),
            "journalctl --no-pager -o short-iso-precise -n 10"
        );
    }

    #[test]
    fn last_lines() {
        assert_eq!(last_lines_start(b"a\nb\nc\n", 2), 2);
        assert_eq!(last_lines_start(b"a\nb\nc", 2), 2);
        assert_eq!(last_lines_start(b"a\nb\n", 5), 0);
        assert_eq!(last_lines_start(b"a\nb\n", 0), 4);
        assert_eq!(last_lines_start(b"", 3), 0);
    }

    /// Real files in a temporary directory: appended bytes come once; a replaced log (new
    /// inode, as when QEMU starts again) is read from its start after the marker.
    #[test]
    fn console_tail_follows_appends_and_replacement() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("serial.log");
        let mut t = ConsoleTail::new(&p, 2);
        assert!(t.poll().unwrap().is_empty(), "no log yet");
        std::fs::write(&p, "one\ntwo\nthree\n").unwrap();
        assert_eq!(
            t.poll().unwrap(),
            b"one\ntwo\nthree\n",
            "a log that appeared"
        );
        let mut t = ConsoleTail::new(&p, 2);
        assert_eq!(t.poll().unwrap(), b"two\nthree\n");
        assert!(t.poll().unwrap().is_empty());
        {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
            f.write_all(b"four\n").unwrap();
        }
        assert_eq!(t.poll().unwrap(), b"four\n");
        std::fs::remove_file(&p).unwrap();
        assert!(t.poll().unwrap().is_empty(), "between two QEMUs");
        std::fs::write(&p, "boot\n").unwrap();
        let got = String::from_utf8(t.poll().unwrap()).unwrap();
        assert_eq!(got, format!("{RESTARTED}boot\n"));
    }
}
