//! Builds the eBPF programs and places the object at `$OUT_DIR/warmpath-ebpf`, where
//! `src/ebpf/object.rs` embeds it.
//!
//! With the `bpf` feature (default): if `WARMPATH_BPF_OBJECT` names a file (what
//! `cargo xtask build-ebpf` produced), that object is embedded as is; otherwise the
//! `warmpath-ebpf` crate is built here with aya-build (nightly, `-Z build-std=core`,
//! BTF on). Without the feature nothing is built and the agent reports that its kernel
//! data path is unavailable.

fn main() {
    #[cfg(feature = "bpf")]
    if let Err(err) = bpf::build() {
        println!("cargo:warning=eBPF build failed: {err:#}");
        println!(
            "cargo:warning=run `cargo xtask setup` (installs rust-src and bpf-linker), or build \
             without the BPF object: `cargo build --no-default-features`"
        );
        std::process::exit(1);
    }
}

#[cfg(feature = "bpf")]
mod bpf {
    use std::{env, fs, path::PathBuf};

    const OBJECT_ENV: &str = "WARMPATH_BPF_OBJECT";
    const PACKAGE: &str = "warmpath-ebpf";

    pub fn build() -> aya_build::Result<()> {
        println!("cargo:rerun-if-env-changed={OBJECT_ENV}");
        let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
        if let Some(prebuilt) = env::var_os(OBJECT_ENV).filter(|p| !p.is_empty()) {
            let prebuilt = PathBuf::from(prebuilt);
            println!("cargo:rerun-if-changed={}", prebuilt.display());
            fs::copy(&prebuilt, out_dir.join(PACKAGE)).map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("{OBJECT_ENV}={}: {e}", prebuilt.display()),
                )
            })?;
            return Ok(());
        }
        let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
        let root = manifest_dir.join("../agent-ebpf");
        let common = manifest_dir.join("../agent-common");
        println!("cargo:rerun-if-changed={}", common.display());
        let root = root.to_str().expect("workspace path is UTF-8");
        aya_build::build_ebpf(
            [aya_build::Package {
                name: PACKAGE,
                root_dir: root,
                ..Default::default()
            }],
            aya_build::Toolchain::Nightly,
        )
    }
}
