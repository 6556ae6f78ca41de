//! Making sure a BPF filesystem is mounted, so maps and links can be pinned.

use std::{fs, path::Path};

use nix::mount::{MsFlags, mount};

use super::Error;

/// The conventional bpffs mount point.
pub const DEFAULT_BPFFS: &str = "/sys/fs/bpf";

/// `statfs` magic number of bpffs (`BPF_FS_MAGIC` in linux/magic.h).
const BPF_FS_MAGIC: nix::sys::statfs::FsType = nix::sys::statfs::FsType(0xcafe_4a11);

/// Mounts bpffs at `path` unless one is mounted there already. Returns whether it mounted.
pub fn ensure_bpffs(path: &Path) -> Result<bool, Error> {
    if is_bpffs(path) {
        return Ok(false);
    }
    fs::create_dir_all(path).map_err(|source| Error::Io {
        what: format!("create {}", path.display()),
        source,
    })?;
    mount(
        Some("bpf"),
        path,
        Some("bpf"),
        MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|errno| Error::Io {
        what: format!("mount bpffs at {}", path.display()),
        source: errno.into(),
    })?;
    Ok(true)
}

/// Whether `path` is the root of a mounted bpffs.
pub fn is_bpffs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .map(|s| s.filesystem_type() == BPF_FS_MAGIC)
        .unwrap_or(false)
}
