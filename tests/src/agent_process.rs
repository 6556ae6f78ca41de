//! The agent in a child process of its own, for what an in-process agent cannot show: its
//! real log output (stderr, through the agent's own tracing set-up) and an environment of
//! its own (the standard `OTEL_EXPORTER_OTLP_*` variables).
//!
//! The suites have no `warmpath` binary to run, so the child is the test binary itself: a
//! suite that uses this declares the entry point
//!
//! ```ignore
//! #[test]
//! #[ignore = "entry point of the agent child process (agent_process.rs)"]
//! fn agent_process() {
//!     warmpath_e2e::agent_process::child_main();
//! }
//! ```
//!
//! and the child runs only that, with its flags in [`ARGS_ENV`].

use std::{
    io::{BufRead as _, BufReader},
    net::SocketAddr,
    path::Path,
    process::{Child, Command, Stdio},
    sync::{Arc, mpsc},
    time::{Duration, Instant},
};

use clap::Parser as _;
use parking_lot::Mutex;

/// The child's `warmpath agent` flags (JSON array).
pub const ARGS_ENV: &str = "WARMPATH_E2E_AGENT_ARGS";
/// The line the child prints once its listeners are up.
const READY: &str = "WARMPATH_E2E_AGENT_READY ";
/// Longest a child may take to start.
const START: Duration = Duration::from_secs(30);

/// The child side: run the agent from [`ARGS_ENV`] until killed. Does nothing when the
/// variable is unset (the entry point run as an ordinary ignored test).
pub fn child_main() {
    let Ok(json) = std::env::var(ARGS_ENV) else {
        return;
    };
    let args: Vec<String> = serde_json::from_str(&json).expect("the parent wrote a JSON array");
    warmpath_agent::telemetry::init_tracing();
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    runtime.block_on(async {
        let parsed = warmpath_agent::args::AgentArgs::try_parse_from(
            std::iter::once("agent".to_string()).chain(args),
        );
        // Interception too when the flags or the configuration ask for it (as `warmpath
        // agent` does).
        let started = match parsed {
            Ok(a) => match warmpath_agent::agent::start_routing(&a).await {
                Ok(routing) => warmpath_agent::agent::start_interception(&a, Some(&routing))
                    .map(|interception| (routing, interception))
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            },
            Err(e) => Err(e.to_string()),
        };
        match started {
            Ok((routing, _interception)) => {
                println!(
                    "{READY}{}",
                    serde_json::json!({"admin": routing.admin, "listen": routing.listen})
                );
                std::future::pending::<()>().await;
            }
            Err(e) => {
                eprintln!("agent failed to start: {e}");
                std::process::exit(2);
            }
        }
    });
}

/// A running agent child; killed and reaped on drop, even when the test fails.
#[derive(Debug)]
pub struct AgentProcess {
    child: Child,
    stderr: Arc<Mutex<String>>,
    pub admin: SocketAddr,
    pub listen: SocketAddr,
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How a child that was expected to run ended instead.
#[derive(Debug)]
pub struct Exited {
    pub status: std::process::ExitStatus,
    pub stderr: String,
}

fn command(exe: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(exe);
    cmd.args([
        "--exact",
        "agent_process",
        "--ignored",
        "--nocapture",
        "--test-threads",
        "1",
    ])
    // Nothing of the parent's environment (a developer's OTEL_* variables) leaks in.
    .env_clear()
    .env("NO_COLOR", "1")
    .env(
        ARGS_ENV,
        serde_json::to_string(args).expect("strings serialise"),
    )
    .envs(env.iter().copied())
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    cmd
}

impl AgentProcess {
    /// Starts the agent with `args` (flags of `warmpath agent`) and exactly the variables
    /// `env` (add `RUST_LOG` there); waits until it is listening, or returns how it ended.
    pub fn start(args: &[&str], env: &[(&str, &str)]) -> Result<Self, Exited> {
        let exe = std::env::current_exe().expect("the test binary has a path");
        Self::spawn(command(&exe, args, env))
    }

    /// [`AgentProcess::start`] under user id `uid` (group `nogroup`, no supplementary
    /// groups): a process that routing rules can tell apart (`crate::isolated`). Root only.
    /// `exe` is this test binary or a copy of it that `uid` can execute
    /// ([`crate::isolated::exe`]); the agent runs in `/`, which every user can search. It is
    /// killed with the thread that starts it, even if that one is killed before its cleanup.
    pub fn start_as(
        args: &[&str],
        env: &[(&str, &str)],
        uid: u32,
        exe: &Path,
    ) -> Result<Self, Exited> {
        use std::os::unix::process::CommandExt as _;
        let mut cmd = command(exe, args, env);
        cmd.uid(uid).gid(crate::isolated::NOGROUP).current_dir("/");
        crate::isolated::die_with_parent(&mut cmd);
        Self::spawn(cmd)
    }

    fn spawn(mut cmd: Command) -> Result<Self, Exited> {
        let mut child = cmd.spawn().unwrap_or_else(|e| {
            panic!(
                "spawn the test binary {}: {e}",
                Path::new(cmd.get_program()).display()
            )
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let pipe = child.stderr.take().expect("stderr was piped");
        let sink = stderr.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut s = sink.lock();
                s.push_str(&line);
                s.push('\n');
            }
        });
        let stdout = child.stdout.take().expect("stdout was piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + START;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) => {
                    // libtest writes `test agent_process ... ` before the test's own output.
                    if let Some((_, json)) = line.split_once(READY) {
                        let v: serde_json::Value =
                            serde_json::from_str(json).expect("the ready line is JSON");
                        let addr = |k: &str| {
                            v[k].as_str()
                                .and_then(|s| s.parse().ok())
                                .expect("the ready line has addresses")
                        };
                        return Ok(Self {
                            admin: addr("admin"),
                            listen: addr("listen"),
                            child,
                            stderr,
                        });
                    }
                }
                // Stdout closed (the child exited) or it took too long: report how it ended.
                Err(_) => {
                    let _ = child.kill();
                    let status = child.wait().expect("reap the child");
                    // The reader ends when the pipe closes, which the child's exit does.
                    let _ = reader.join();
                    return Err(Exited {
                        status,
                        stderr: stderr.lock().clone(),
                    });
                }
            }
        }
    }

    /// Everything the agent wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().clone()
    }

    /// Waits up to `timeout` for a stderr line containing every one of `needles`; returns
    /// the line.
    pub async fn wait_for_log(&self, needles: &[&str], timeout: Duration) -> String {
        crate::sim::wait_for(&format!("a log line with {needles:?}"), timeout, || {
            let found = self
                .stderr
                .lock()
                .lines()
                .find(|l| needles.iter().all(|n| l.contains(n)))
                .map(str::to_string);
            async move { found }
        })
        .await
    }
}
