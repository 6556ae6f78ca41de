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
/// below the kernel's ephemeral range, as the benchmarks take theirs
/// ([`warmpath_bench::free_port`]: a port released from `bind(0)` can be handed to the next
/// `bind(0)` before the child binds it; an agent's admin listener took a peer's IndexSync
/// port that way).
pub fn free_udp_port() -> u16 {
    warmpath_bench::free_port_where(|p| std::net::UdpSocket::bind(("127.0.0.1", p)).is_ok())
        .expect("a free loopback UDP port")
}

/// A loopback TCP port free now, for a child process to bind later or to stay dead, from
/// below the kernel's ephemeral range ([`warmpath_bench::free_port`]).
pub fn free_tcp_port() -> u16 {
    warmpath_bench::free_port().expect("a free loopback TCP port")
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
