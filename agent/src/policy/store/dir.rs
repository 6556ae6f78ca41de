//! Listing and reading the policy directory, bounded: at most [`MAX_FILES`] files of at most
//! [`documents::MAX_FILE_BYTES`] each, at most [`MAX_OBJECTS`] objects in all.

use std::{
    collections::BinaryHeap,
    fs,
    io::{ErrorKind, Read as _},
    path::{Path, PathBuf},
};

use super::{Resource, documents};

/// Most policy files read from one directory (the first by name); the others are reported.
pub const MAX_FILES: usize = 1000;
/// Most objects read from one directory: far above any cluster's policy set.
pub const MAX_OBJECTS: usize = 10_000;

/// The policy files of a directory.
#[derive(Debug)]
pub(super) struct Listing {
    pub files: Vec<FileRead>,
    /// True when the directory held more than [`MAX_FILES`] policy files.
    pub truncated: bool,
    /// A problem with the directory as a whole (not with one file).
    pub error: Option<String>,
}

/// One policy file: its resources, or why it cannot be used.
#[derive(Debug)]
pub(super) struct FileRead {
    pub path: PathBuf,
    pub outcome: Result<Vec<Resource>, String>,
}

/// A name `load` reads: `*.yaml`, `*.yml` or `*.json`, not hidden (`.x`, ConfigMap's
/// `..data`, Emacs' `.#x`, Vim's `.x.swp`) nor an editor's backup or autosave (`x~`, `#x#`).
pub(super) fn is_policy_file(name: &str) -> bool {
    !name.starts_with('.')
        && !name.starts_with('#')
        && !name.ends_with('~')
        && [".yaml", ".yml", ".json"]
            .iter()
            .any(|ext| name.len() > ext.len() && name.ends_with(ext))
}

/// Lists and reads `dir`. `Err`: the directory itself cannot be read.
pub(super) fn read(dir: &Path) -> Result<Listing, String> {
    let entries = fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    // The MAX_FILES smallest names, in a max-heap: memory stays bounded however many
    // files the directory holds.
    let mut names = BinaryHeap::new();
    let mut total = 0usize;
    let mut odd = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            let lossy = name.to_string_lossy().into_owned();
            if is_policy_file(&lossy) && odd.len() < MAX_FILES {
                odd.push(lossy);
            }
            continue;
        };
        if !is_policy_file(name) {
            continue;
        }
        total += 1;
        names.push(name.to_string());
        if names.len() > MAX_FILES {
            names.pop();
        }
    }
    let names = names.into_sorted_vec();
    let truncated = total > MAX_FILES;
    let error = truncated.then(|| {
        format!(
            "{total} policy files, more than the {MAX_FILES} read: only the first {MAX_FILES} by \
             name are read; the objects of the others keep their previous state"
        )
    });
    let mut files = Vec::with_capacity(names.len() + odd.len());
    let mut objects = 0usize;
    for name in names {
        let path = dir.join(&name);
        let Some(text) = read_file(&path) else {
            continue;
        };
        let outcome = text.and_then(|text| {
            let resources =
                documents::parse(&path.display().to_string(), &text).map_err(|e| e.to_string())?;
            if objects + resources.len() > MAX_OBJECTS {
                return Err(format!(
                    "{}: its {} objects would exceed the limit of {MAX_OBJECTS} objects in a \
                     policy directory",
                    path.display(),
                    resources.len()
                ));
            }
            objects += resources.len();
            Ok(resources)
        });
        files.push(FileRead { path, outcome });
    }
    for name in odd {
        files.push(FileRead {
            path: dir.join(&name),
            outcome: Err(format!("{name}: the file name is not UTF-8: rename it")),
        });
    }
    Ok(Listing {
        files,
        truncated,
        error,
    })
}

/// The text of a regular file (symbolic links followed). `None`: there is no such file any
/// more (removed since the listing, a dangling link, or not a regular file).
fn read_file(path: &Path) -> Option<Result<String, String>> {
    let shown = path.display();
    // Checked before opening: opening a FIFO would block.
    match fs::metadata(path) {
        Ok(m) if m.is_file() => {}
        Ok(_) => return None,
        Err(e) if e.kind() == ErrorKind::NotFound => return None,
        Err(e) => return Some(Err(format!("{shown}: cannot read: {e}"))),
    }
    let file = match fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return None,
        Err(e) => return Some(Err(format!("{shown}: cannot read: {e}"))),
    };
    let limit = documents::MAX_FILE_BYTES;
    let mut bytes = Vec::new();
    if let Err(e) = file.take(limit as u64 + 1).read_to_end(&mut bytes) {
        return Some(Err(format!("{shown}: cannot read: {e}")));
    }
    if bytes.len() > limit {
        return Some(Err(format!(
            "{shown}: larger than the {limit}-byte limit for a policy file"
        )));
    }
    Some(String::from_utf8(bytes).map_err(|e| {
        format!(
            "{shown}: not UTF-8 text (invalid byte at offset {})",
            e.utf8_error().valid_up_to()
        )
    }))
}
