//! The profile-guided release build (`cargo xtask build --release --pgo`).
//!
//! 1. Build `warmpath` instrumented (`-Cprofile-generate`) into `target/pgo/generate/`.
//! 2. Train it on the data path: a simulator, an agent in front of it, and the agent's own
//!    load generator (`bench run`): small non-streaming completions from 32 closed-loop
//!    clients, then a streamed shared-prefix workload with real prompts, then non-streaming
//!    again through an agent with HTTP/2 engine connections. Then the 8k-token chat routing
//!    decision (`bench proxy --decision-only`, in process). The agent, the simulator
//!    and the decision run write profiles; the load generator's are kept apart and dropped.
//! 3. Merge the profiles with `llvm-profdata` of rustc's LLVM major version.
//! 4. Build again with `-Cprofile-use` into `target/pgo/use/`; the binary is copied to
//!    `target/pgo/warmpath`.
//!
//! Flags go through `CARGO_TARGET_<HOST>_RUSTFLAGS` with an explicit `--target`, so they
//! reach warmpath's own crates and dependencies but not build scripts or the eBPF build.

use std::{
    io::{BufRead, BufReader},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, ChildStdout, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::{ebpf, shell};

/// How long each main load phase runs (seconds).
const PHASE_SECONDS: &str = "12";
/// How long the h2-upstream phase runs (seconds).
const H2_SECONDS: &str = "6";

/// Builds the profile-guided binary; returns its path.
pub fn build() -> Result<PathBuf> {
    let object = ebpf::build()?;
    let (host, llvm_major) = rustc_host_and_llvm()?;
    let profdata = llvm_profdata(&llvm_major)?;
    let root = shell::target_dir().join("pgo");
    let profiles = root.join("profiles");
    let clients = root.join("client-profiles");
    for dir in [&profiles, &clients] {
        if dir.exists() {
            std::fs::remove_dir_all(dir)?;
        }
        std::fs::create_dir_all(dir)?;
    }
    let generate = cargo_build(
        &host,
        &root.join("generate"),
        &format!("-Cprofile-generate={}", profiles.display()),
        &object,
    )?;
    train(&generate, &profiles, &clients)?;
    let merged = root.join("merged.profdata");
    let raw: Vec<PathBuf> = std::fs::read_dir(&profiles)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "profraw"))
        .collect();
    if raw.is_empty() {
        bail!("training wrote no profiles into {}", profiles.display());
    }
    shell::run(
        Command::new(&profdata)
            .args(["merge", "-o"])
            .arg(&merged)
            .args(&raw),
    )?;
    // Cargo does not fingerprint the profile's contents: a cfg naming their hash makes a new
    // profile rebuild everything it guides (and an unchanged one rebuild nothing).
    let optimized = cargo_build(
        &host,
        &root.join("use"),
        &format!(
            "-Cprofile-use={} --cfg=warmpath_pgo_{:016x}",
            merged.display(),
            file_hash(&merged)?
        ),
        &object,
    )?;
    let out = root.join("warmpath");
    std::fs::copy(&optimized, &out)
        .with_context(|| format!("copy {} to {}", optimized.display(), out.display()))?;
    eprintln!("profile-guided build: {}", out.display());
    Ok(out)
}

/// A hash of a file's bytes (to tell profiles apart, not for security).
fn file_hash(path: &Path) -> Result<u64> {
    use std::hash::Hasher;
    let bytes = std::fs::read(path).with_context(|| format!("read {}", path.display()))?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    h.write(&bytes);
    Ok(h.finish())
}

/// `(host triple, LLVM major version)` of the rustc that builds.
fn rustc_host_and_llvm() -> Result<(String, String)> {
    let out = Command::new(std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()))
        .arg("-vV")
        .output()
        .context("run rustc -vV")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
    };
    let host = field("host:").context("rustc -vV names no host")?;
    let llvm = field("LLVM version:").context("rustc -vV names no LLVM version")?;
    let major = llvm.split('.').next().unwrap_or_default().to_string();
    Ok((host, major))
}

/// `llvm-profdata` of LLVM `major`, installed from Debian's `llvm-N` (as root) when none is
/// found.
fn llvm_profdata(major: &str) -> Result<PathBuf> {
    if let Some(found) = find_llvm_profdata(major)? {
        return Ok(found);
    }
    if crate::setup::apt_install(&[&format!("llvm-{major}")])?
        && let Some(found) = find_llvm_profdata(major)?
    {
        return Ok(found);
    }
    bail!(
        "no llvm-profdata for LLVM {major} (rustc's): `apt-get install llvm-{major}` or \
         `rustup component add llvm-tools`"
    )
}

/// `llvm-profdata` of LLVM `major`: Debian's `llvm-profdata-N`, rustup's `llvm-tools`, or
/// a plain `llvm-profdata` that reports that version.
fn find_llvm_profdata(major: &str) -> Result<Option<PathBuf>> {
    let versioned = format!("llvm-profdata-{major}");
    if shell::on_path(&versioned) {
        return Ok(Some(versioned.into()));
    }
    let prefixed = PathBuf::from(format!("/usr/lib/llvm-{major}/bin/llvm-profdata"));
    if prefixed.is_file() {
        return Ok(Some(prefixed));
    }
    let sysroot = Command::new(std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()))
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    if let Some(found) = sysroot.and_then(|root| {
        std::fs::read_dir(root.join("lib/rustlib"))
            .ok()?
            .filter_map(|e| e.ok())
            .map(|e| e.path().join("bin/llvm-profdata"))
            .find(|p| p.is_file())
    }) {
        return Ok(Some(found));
    }
    if shell::on_path("llvm-profdata") {
        let out = Command::new("llvm-profdata").arg("--version").output()?;
        if String::from_utf8_lossy(&out.stdout).contains(&format!("version {major}.")) {
            return Ok(Some("llvm-profdata".into()));
        }
    }
    Ok(None)
}

/// Builds `warmpath` for `host` into `target_dir` with `flags`; returns the binary.
fn cargo_build(host: &str, target_dir: &Path, flags: &str, object: &Path) -> Result<PathBuf> {
    let var = format!(
        "CARGO_TARGET_{}_RUSTFLAGS",
        host.to_uppercase().replace(['-', '.'], "_")
    );
    shell::run(
        crate::build_warmpath(true, object)
            .args(["--target", host])
            .arg("--target-dir")
            .arg(target_dir)
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .env(var, flags),
    )?;
    Ok(target_dir.join(host).join("release").join("warmpath"))
}

/// Runs the training workload on the instrumented binary.
fn train(bin: &Path, profiles: &Path, clients: &Path) -> Result<()> {
    let sim_port = free_port()?;
    let mut sim = start_one_worker(
        instrumented(bin, profiles)
            .args(["sim", "--port", &sim_port.to_string(), "--profile", "tiny"])
            .args(["--time-scale", "0.00001", "--max-num-seqs", "1024"]),
        Stdio::piped(),
        "simulator",
    )?;
    // Kept open until the simulator stops: it may write more.
    let _sim_stdout = ready_line(&mut sim)?;
    let (agent, target) = start_agent(bin, sim_port, &[], profiles)?;
    // Small non-streaming completions, closed loop (what `bench proxy` measures).
    small_requests(bin, &target, PHASE_SECONDS, clients)?;
    // Streamed shared-prefix requests with real prompts: tokenization, prefix scoring, the
    // SSE tap.
    shell::run(
        instrumented(bin, clients)
            .args(["bench", "run", "--target", &target, "--rounds", "20"])
            .args(["--concurrency", "16", "--max-seconds", PHASE_SECONDS]),
    )?;
    agent.stop()?;
    // The same small requests through an agent with HTTP/2 engine connections.
    let (h2, target) = start_agent(bin, sim_port, &["--upstream-protocol", "h2"], profiles)?;
    small_requests(bin, &target, H2_SECONDS, clients)?;
    h2.stop()?;
    sim.stop()?;
    // The routing decision for long chat prompts, in process.
    shell::run(instrumented(bin, profiles).args(["bench", "proxy", "--decision-only"]))
}

/// `bin` as an instrumented process that writes its profiles into `profiles`.
fn instrumented(bin: &Path, profiles: &Path) -> Command {
    let mut cmd = Command::new(bin);
    cmd.env("LLVM_PROFILE_FILE", profile_file(profiles));
    cmd
}

/// Starts `cmd` with one tokio worker (the data path the profile is for) and stderr dropped.
fn start_one_worker(cmd: &mut Command, stdout: Stdio, what: &str) -> Result<Stopped> {
    let child = cmd
        .env("TOKIO_WORKER_THREADS", "1")
        .stdout(stdout)
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("start the instrumented {what}"))?;
    Ok(Stopped(child))
}

/// Where instrumented processes writing into `dir` put their profiles.
fn profile_file(dir: &Path) -> PathBuf {
    dir.join("warmpath-%p-%m.profraw")
}

/// An instrumented agent (one data-path worker, `extra` flags) in front of the simulator on
/// `sim_port`, once it accepts: the process and its base URL.
fn start_agent(
    bin: &Path,
    sim_port: u16,
    extra: &[&str],
    profiles: &Path,
) -> Result<(Stopped, String)> {
    let (listen, admin) = (free_port()?, free_port()?);
    let agent = start_one_worker(
        instrumented(bin, profiles)
            .args(["agent", "--listen", &format!("127.0.0.1:{listen}")])
            .args(["--admin", &format!("127.0.0.1:{admin}")])
            .args(["--endpoint", &format!("http://127.0.0.1:{sim_port}")])
            .args(["--workers", "1"])
            .args(extra),
        Stdio::null(),
        "agent",
    )?;
    wait_for_port(listen)?;
    Ok((agent, format!("http://127.0.0.1:{listen}")))
}

/// Small non-streaming completions from 32 closed-loop clients for `seconds`; the load
/// generator's own profile goes to `clients`.
fn small_requests(bin: &Path, target: &str, seconds: &str, clients: &Path) -> Result<()> {
    shell::run(
        instrumented(bin, clients)
            .args(["bench", "run", "--no-stream", "--target", target])
            .args(["--groups", "4", "--users", "64", "--rounds", "1000"])
            .args(["--system-tokens", "16", "--question-tokens", "4"])
            .args(["--output-tokens", "1", "--concurrency", "32"])
            .args(["--max-requests", "1000000", "--max-seconds", seconds]),
    )
}

/// A child stopped with SIGTERM (so it writes its profile), killed if still there after 10 s.
struct Stopped(Child);

impl Stopped {
    fn stop(mut self) -> Result<()> {
        shell::run(Command::new("kill").args(["-TERM", &self.0.id().to_string()]))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(status) = self.0.try_wait()? {
                if !status.success() {
                    bail!("an instrumented process exited with {status}");
                }
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("an instrumented process did not stop within 10 s of SIGTERM")
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // Only reached on an error path: make sure nothing is left running.
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Waits for the child's first stdout line (its ready line); returns the rest of stdout.
fn ready_line(child: &mut Stopped) -> Result<BufReader<ChildStdout>> {
    let stdout = child.0.stdout.take().context("stdout is piped")?;
    let mut reader = BufReader::new(stdout);
    let mut line = String::new();
    reader
        .read_line(&mut line)
        .context("read the simulator's ready line")?;
    if line.trim().is_empty() {
        bail!("the simulator ended before it was ready");
    }
    Ok(reader)
}

/// Waits until something accepts on the loopback `port` (20 s at most).
fn wait_for_port(port: u16) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!("nothing listens on 127.0.0.1:{port} after 20 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// A free loopback port (bound, then released).
fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
