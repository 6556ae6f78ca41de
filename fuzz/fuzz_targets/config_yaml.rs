//! Agent configuration files (`config::load`: YAML to a validated `Config`). The text goes
//! through a file in the temporary directory: `load` is the public entry point (the parser
//! behind it is private to `config`).
//!
//! Properties: no panic and bounded memory on any text (anchors and aliases included); an
//! error names the file and says something; an accepted configuration passes validation again
//! and parses the same way twice.

#![no_main]

use std::{path::PathBuf, sync::LazyLock};

use libfuzzer_sys::fuzz_target;
use warmpath_agent::config::load;

/// This process's scratch file (one per fuzzing process: `-jobs` runs several).
static FILE: LazyLock<PathBuf> = LazyLock::new(|| {
    std::env::temp_dir().join(format!("warmpath-fuzz-config-{}.yaml", std::process::id()))
});

fuzz_target!(|data: &[u8]| {
    if std::str::from_utf8(data).is_err() {
        return;
    }
    let file = FILE.as_path();
    std::fs::write(file, data).expect("the temporary directory is writable");
    let name = file.display().to_string();
    match load(file) {
        Ok(config) => {
            config
                .validate(&name)
                .expect("a loaded configuration is valid");
            let again = load(file).expect("the same text loads again");
            assert_eq!(
                format!("{config:?}"),
                format!("{again:?}"),
                "loading is deterministic"
            );
        }
        Err(err) => {
            let msg = err.to_string();
            assert!(msg.contains(&name), "the error names the file: {msg}");
            assert!(
                msg.len() > name.len() + 2,
                "the error says what is wrong: {msg}"
            );
        }
    }
});
