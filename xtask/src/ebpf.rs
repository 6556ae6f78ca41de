//! Building the eBPF object.
//!
//! The same command line aya-build uses from `agent/build.rs`: nightly cargo, target
//! `bpfel-unknown-none`, `-Z build-std=core`, release, with debug info and `--btf` so the
//! object carries BTF. The agent's build script embeds the result when `WARMPATH_BPF_OBJECT`
//! points at it, so the object is built once per `cargo xtask test`.

use std::path::PathBuf;

use anyhow::{Result, ensure};

use crate::{setup, shell};

/// Tells `agent/build.rs` to embed this object instead of building its own.
pub const OBJECT_ENV: &str = "WARMPATH_BPF_OBJECT";
const TARGET: &str = "bpfel-unknown-none";
const PACKAGE: &str = "warmpath-ebpf";

/// Builds the object and returns its path.
pub fn build() -> Result<PathBuf> {
    setup::bpf_toolchain()?;
    let target_dir = shell::target_dir();
    // Separate from the host build's directory: a different toolchain must not evict the
    // host artefacts' fingerprints.
    let bpf_target_dir = target_dir.join("bpf");
    let mut cmd = std::process::Command::new("rustup");
    cmd.args([
        "run",
        "nightly",
        "cargo",
        "build",
        "--package",
        PACKAGE,
        "--release",
    ])
    .args(["--target", TARGET, "-Z", "build-std=core"])
    .arg("--target-dir")
    .arg(&bpf_target_dir)
    .env(
        "CARGO_ENCODED_RUSTFLAGS",
        [
            format!("--cfg=bpf_target_arch=\"{}\"", std::env::consts::ARCH),
            "-Cdebuginfo=2".into(),
            "-Clink-arg=--btf".into(),
        ]
        .join("\x1f"),
    )
    // The workspace's release LTO is the host binary's; bpf-linker links the BPF bitcode.
    .env("CARGO_PROFILE_RELEASE_LTO", "false")
    .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "16")
    .env_remove("RUSTC")
    .env_remove("RUSTC_WORKSPACE_WRAPPER")
    .current_dir(shell::workspace_root());
    shell::run(&mut cmd)?;
    let object = bpf_target_dir.join(TARGET).join("release").join(PACKAGE);
    ensure!(
        object.is_file(),
        "build succeeded but {} is missing",
        object.display()
    );
    Ok(object)
}
