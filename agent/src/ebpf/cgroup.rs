//! Finding the cgroup v2 hierarchy and managing child cgroups in it.
//!
//! cgroup programs attach to a cgroup v2 directory. Hosts mount the v2 hierarchy at
//! `/sys/fs/cgroup` (unified) or `/sys/fs/cgroup/unified` (hybrid), so the mount is read from
//! `/proc/self/mounts` instead of assumed.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use super::Error;

/// Where the kernel lists this process's mounts.
const MOUNTS: &str = "/proc/self/mounts";

/// The cgroup v2 directory this process belongs to (`/proc/self/cgroup`'s `0::` line under
/// the cgroup v2 mount).
pub fn own_cgroup() -> Result<PathBuf, Error> {
    let root = cgroup2_root()?;
    let text = fs::read_to_string("/proc/self/cgroup").map_err(|source| Error::Io {
        what: "/proc/self/cgroup".into(),
        source,
    })?;
    let rel = text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or(Error::NoCgroup2)?;
    Ok(root.join(rel.trim_start_matches('/')))
}

/// The cgroup v2 id of the cgroup directory `dir`: its inode number, what
/// `bpf_get_current_cgroup_id()` returns for processes in it.
pub fn cgroup_id(dir: &Path) -> Result<u64, Error> {
    use std::os::unix::fs::MetadataExt as _;
    fs::metadata(dir)
        .map(|m| m.ino())
        .map_err(|source| Error::Io {
            what: format!("stat cgroup {}", dir.display()),
            source,
        })
}

/// Finds the cgroup v2 mount point on this host.
pub fn cgroup2_root() -> Result<PathBuf, Error> {
    let mounts = fs::read_to_string(MOUNTS).map_err(|source| Error::Io {
        what: MOUNTS.into(),
        source,
    })?;
    find_cgroup2_mount(&mounts).ok_or(Error::NoCgroup2)
}

/// Returns the first `cgroup2` mount point in a `/proc/mounts`-format table.
///
/// Mount points with spaces are octal-escaped by the kernel (`\040`); they are unescaped.
pub fn find_cgroup2_mount(mounts: &str) -> Option<PathBuf> {
    mounts.lines().find_map(|line| {
        let mut fields = line.split_ascii_whitespace();
        let (_source, target, fstype) = (fields.next()?, fields.next()?, fields.next()?);
        (fstype == "cgroup2").then(|| PathBuf::from(unescape_mount_path(target)))
    })
}

/// Undoes the kernel's octal escaping of space, tab, newline and backslash in mount paths.
fn unescape_mount_path(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                let value =
                    (d[0] - b'0') as u32 * 64 + (d[1] - b'0') as u32 * 8 + (d[2] - b'0') as u32;
                out.push(u8::try_from(value).unwrap_or(b'?'));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A child cgroup that this process created and removes when dropped.
///
/// Drop moves any member processes back to the parent first (a cgroup with members cannot be
/// removed), so cleanup also works after a failed assertion.
#[derive(Debug)]
pub struct ChildCgroup {
    path: PathBuf,
    parent: PathBuf,
}

impl ChildCgroup {
    /// Creates `parent/name`. Fails if it exists already: it may belong to someone else.
    pub fn create(parent: &Path, name: &str) -> Result<Self, Error> {
        let path = parent.join(name);
        fs::create_dir(&path).map_err(|source| Error::Io {
            what: format!("create cgroup {}", path.display()),
            source,
        })?;
        Ok(Self {
            path,
            parent: parent.to_path_buf(),
        })
    }

    /// The cgroup's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Moves a process (all its threads) into this cgroup.
    pub fn add_process(&self, pid: u32) -> Result<(), Error> {
        write_procs(&self.path, pid).map_err(|source| Error::Io {
            what: format!("move pid {pid} into {}", self.path.display()),
            source,
        })
    }

    /// Processes currently in the cgroup.
    pub fn processes(&self) -> Vec<u32> {
        fs::read_to_string(self.path.join("cgroup.procs"))
            .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }
}

impl Drop for ChildCgroup {
    fn drop(&mut self) {
        for pid in self.processes() {
            if let Err(err) = write_procs(&self.parent, pid) {
                tracing::warn!(pid, %err, cgroup = %self.path.display(), "could not move process out");
            }
        }
        if let Err(err) = fs::remove_dir(&self.path) {
            tracing::warn!(%err, cgroup = %self.path.display(), "could not remove cgroup");
        }
    }
}

fn write_procs(cgroup: &Path, pid: u32) -> io::Result<()> {
    fs::write(cgroup.join("cgroup.procs"), pid.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_hybrid_unified_mount() {
        let table = "tmpfs /sys/fs/cgroup tmpfs rw 0 0\n\
                     cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n\
                     cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n";
        assert_eq!(
            find_cgroup2_mount(table),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
    }

    #[test]
    fn finds_pure_v2_mount_and_unescapes() {
        let table = "cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n";
        assert_eq!(
            find_cgroup2_mount(table),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        let odd = "none /mnt/my\\040cg cgroup2 rw 0 0\n";
        assert_eq!(find_cgroup2_mount(odd), Some(PathBuf::from("/mnt/my cg")));
    }

    #[test]
    fn no_v2_mount_and_garbage_lines() {
        assert_eq!(
            find_cgroup2_mount("cgroup /sys/fs/cgroup/cpu cgroup rw 0 0\n"),
            None
        );
        assert_eq!(find_cgroup2_mount("\n  \nonlyone\ntwo fields\n"), None);
        assert_eq!(unescape_mount_path("a\\0"), "a\\0");
    }
}
