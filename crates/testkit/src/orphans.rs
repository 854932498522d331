//! What the stores a test starts itself (`OwnBroker`, `OwnPostgres`) share for cleaning up
//! after test processes that died before dropping them: each store keeps its files in a
//! directory named `<prefix><owner pid>-<n>`, and a later start sweeps the directories
//! whose owner is gone.

use std::fs::{self, DirEntry};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The directories under `bases` named `<prefix><pid>-…` whose owning process is gone,
/// each with its id (the name without the prefix). An owner still alive (or a pid reused
/// since) keeps its directory, which is the safe mistake.
pub(crate) fn orphaned(bases: &[PathBuf], prefix: &str) -> Vec<(DirEntry, String)> {
    bases
        .iter()
        .filter_map(|base| fs::read_dir(base).ok())
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let id = entry
                .file_name()
                .to_str()?
                .strip_prefix(prefix)?
                .to_string();
            let owner = id.split('-').next()?.parse::<u32>().ok()?;
            (!Path::new(&format!("/proc/{owner}")).exists()).then_some((entry, id))
        })
        .collect()
}

/// Sends SIGname to pid through the shell's `kill` builtin: this crate forbids unsafe code
/// (so no libc::kill), and the builtin is there even where procps is not.
pub(crate) fn signal(pid: u32, name: &str) {
    let _ = Command::new("sh")
        .args([
            "-c",
            "kill -s \"$1\" \"$2\" 2>/dev/null",
            "sh",
            name,
            &pid.to_string(),
        ])
        .status();
}
