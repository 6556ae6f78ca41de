//! Scratch resources for the multi-agent suites: a temporary directory removed on drop (a
//! policy directory, a cluster key) and loopback ports free now.

use std::path::{Path, PathBuf};

/// A temporary directory `warmpath-NAME-PID`, emptied when made, removed on drop.
#[derive(Debug)]
pub struct Dir(PathBuf);

impl Dir {
    pub fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("warmpath-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("a scratch directory");
        Self(p)
    }

    /// Writes `text` to `file` in the directory; its path.
    pub fn write(&self, file: &str, text: &str) -> PathBuf {
        let path = self.0.join(file);
        std::fs::write(&path, text).expect("a scratch file");
        path
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A loopback UDP port free now (gossip needs its advertised port before it binds), from
/// below the kernel's ephemeral range ([`unclaimed_port`]).
pub fn free_udp_port() -> u16 {
    unclaimed_port(|p| std::net::UdpSocket::bind(("127.0.0.1", p)).is_ok())
}

/// A loopback TCP port free now, from below the kernel's ephemeral range
/// ([`unclaimed_port`]).
pub fn free_tcp_port() -> u16 {
    unclaimed_port(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
}

/// A loopback port for a child process to bind later, or to stay dead: one `free` says is
/// free now, taken from below the kernel's ephemeral range
/// (`/proc/sys/net/ipv4/ip_local_port_range`) and never handed out twice by this process.
/// A port bound at 0 and released is in that range, where the next listener bound at 0 or
/// the next outgoing connection can be given it before the child binds it (an agent's admin
/// listener took a peer's IndexSync port that way: "Address already in use"). Below the
/// range only an explicit bind takes a port. Each process starts at its own offset, so test
/// binaries running side by side walk different ports.
pub fn unclaimed_port(free: impl Fn(u16) -> bool) -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const LOW: u32 = 10_000;
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768)
        .clamp(LOW + 1_000, 65_535);
    let span = ephemeral_low - LOW;
    let start = std::process::id().wrapping_mul(7_919) % span;
    for _ in 0..span {
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = LOW + (start + k) % span;
        let port = u16::try_from(port).expect("below 65536");
        if free(port) {
            return port;
        }
    }
    panic!("no free loopback port in {LOW}..{ephemeral_low}");
}

/// `warmpath agent` flags for agent `k` of a loopback cluster `cluster_id`: listeners on
/// port 0, one worker, gossip every 100 ms on `ports[k].0` seeded by agent 0's, gRPC on
/// `ports[k].1`, `key` as the cluster key and `policy` as the policy directory. The caller
/// adds the endpoints and its own flags.
pub fn cluster_agent_args(
    cluster_id: &str,
    k: usize,
    ports: &[(u16, u16)],
    key: &Path,
    policy: &Path,
) -> Vec<String> {
    let mut args: Vec<String> = [
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--workers",
        "1",
        "--gossip-interval-ms",
        "100",
    ]
    .map(String::from)
    .to_vec();
    args.extend(["--cluster-id".into(), cluster_id.into()]);
    args.extend(["--node-id".into(), format!("agent-{k}")]);
    let at = |port: u16| format!("127.0.0.1:{port}");
    args.extend(["--gossip-listen".into(), at(ports[k].0)]);
    args.extend(["--seed".into(), at(ports[0].0)]);
    args.extend(["--grpc-listen".into(), at(ports[k].1)]);
    args.extend(["--cluster-key-file".into(), key.display().to_string()]);
    args.extend(["--policy-dir".into(), policy.display().to_string()]);
    args
}
