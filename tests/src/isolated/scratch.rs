//! The parent's side of [`super::run`] on disk: a scratch directory every user id can read,
//! and a test binary that the child's user ids can execute.

use std::{
    ops::RangeInclusive,
    os::unix::{fs::PermissionsExt as _, process::CommandExt as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use super::NOGROUP;

/// A directory for one [`super::run`], mode 0755 whatever the umask; removed on drop.
#[derive(Debug)]
pub(super) struct Scratch(PathBuf);

/// Scratch directories are `PREFIX<pid>-<entry>`.
const PREFIX: &str = "warmpath-isolated-";

impl Scratch {
    pub(super) fn new(entry: &str) -> Result<Self, String> {
        remove_orphans();
        let name = entry.replace(|c: char| !c.is_ascii_alphanumeric(), "_");
        let path = std::env::temp_dir().join(format!("{PREFIX}{}-{name}", std::process::id()));
        // Left by an earlier process with this pid.
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path)
            .and_then(|()| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)))
            .map_err(|e| format!("scratch directory {}: {e}", path.display()))?;
        Ok(Self(path))
    }

    pub(super) fn path(&self) -> &Path {
        &self.0
    }
}

/// Removes the scratch directories of test processes that no longer run (killed before
/// their cleanup: each may hold a copy of a test binary, hundreds of MB).
fn remove_orphans() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let pid = name
            .to_str()
            .and_then(|n| n.strip_prefix(PREFIX))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok());
        if let Some(pid) = pid
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// This test binary if every one of `uids` can run it, or else a copy of it in `dir`
/// that they can; or why neither works.
pub(super) fn runnable_exe(
    entry: &str,
    dir: &Path,
    uids: RangeInclusive<u32>,
) -> Result<PathBuf, String> {
    let own = std::env::current_exe().map_err(|e| format!("the test binary's path: {e}"))?;
    let Err(why) = runs_as(entry, &own, uids.clone()) else {
        return Ok(own);
    };
    let copy = dir.join(own.file_name().unwrap_or("test-binary".as_ref()));
    std::fs::copy(&own, &copy)
        .and_then(|_| std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)))
        .map_err(|e| format!("copying the test binary to {}: {e}", copy.display()))?;
    match runs_as(entry, &copy, uids) {
        Ok(()) => Ok(copy),
        Err(why_copy) => Err(format!(
            "the test binary cannot be run by the test's user ids: {why}; nor its copy: \
             {why_copy} (set TMPDIR to a directory every user can search)"
        )),
    }
}

/// Whether each of `uids` (group [`NOGROUP`]) can execute `exe`: it lists the test
/// `entry` as that user.
fn runs_as(entry: &str, exe: &Path, uids: RangeInclusive<u32>) -> Result<(), String> {
    for uid in uids {
        let out = Command::new(exe)
            .args(["--list", "--exact", entry])
            .env_clear()
            .current_dir("/")
            .uid(uid)
            .gid(NOGROUP)
            .stdin(Stdio::null())
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => {
                return Err(format!(
                    "{} as uid {uid}: {} ({})",
                    exe.display(),
                    o.status,
                    String::from_utf8_lossy(&o.stderr).trim()
                ));
            }
            Err(e) => return Err(format!("{} as uid {uid}: {e}", exe.display())),
        }
    }
    Ok(())
}
