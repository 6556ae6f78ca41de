//! What the soak reads of the agent process from /proc: resident memory, and its open file
//! descriptors sorted into client connections, engine connections and the rest.

use std::collections::HashMap;

/// Resident set size of `pid` in KiB (`VmRSS` of /proc/PID/status), or None once it is gone.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    vm_rss(&status)
}

fn vm_rss(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_ascii_whitespace().next())
        .and_then(|kib| kib.parse().ok())
}

/// A process's open file descriptors, by what they are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Fds {
    pub total: usize,
    /// TCP connections accepted on the proxy's listener.
    pub clients: usize,
    /// TCP connections to the engines' HTTP ports (in use or pooled idle).
    pub engines: usize,
}

impl Fds {
    /// Everything that is neither a client nor an engine connection: listeners, event
    /// sockets, the runtime's own descriptors. Constant in a process that leaks none.
    pub fn other(&self) -> usize {
        self.total - self.clients - self.engines
    }
}

/// Counts `pid`'s descriptors; `listen_port` is the proxy's, `engine_ports` the engines' HTTP
/// ports (all on loopback). None once the process is gone.
pub fn fds(pid: u32, listen_port: u16, engine_ports: &[u16]) -> Option<Fds> {
    let sockets = tcp_sockets();
    let mut out = Fds::default();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd")).ok()? {
        let Ok(entry) = entry else { continue };
        out.total += 1;
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        let inode = target
            .to_str()
            .and_then(|t| t.strip_prefix("socket:["))
            .and_then(|t| t.strip_suffix(']'))
            .and_then(|t| t.parse::<u64>().ok());
        match inode.and_then(|i| sockets.get(&i)) {
            Some(&(local, remote)) if local == listen_port && remote != 0 => out.clients += 1,
            Some(&(_, remote)) if engine_ports.contains(&remote) => out.engines += 1,
            _ => {}
        }
    }
    Some(out)
}

/// Every TCP socket of this network namespace: inode -> (local port, remote port).
fn tcp_sockets() -> HashMap<u64, (u16, u16)> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .flat_map(|table| {
            table
                .lines()
                .skip(1)
                .filter_map(socket_line)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// One line of /proc/net/tcp: `sl local_address rem_address st tx:rx tr:when retrnsmt uid
/// timeout inode ...`, addresses as `HEXIP:HEXPORT`.
fn socket_line(line: &str) -> Option<(u64, (u16, u16))> {
    let fields: Vec<&str> = line.split_ascii_whitespace().collect();
    let port = |addr: &str| u16::from_str_radix(addr.rsplit_once(':')?.1, 16).ok();
    let local = port(fields.get(1)?)?;
    let remote = port(fields.get(2)?)?;
    let inode = fields.get(9)?.parse().ok()?;
    Some((inode, (local, remote)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vm_rss_in_kib() {
        let status = "Name:\twarmpath\nVmPeak:\t  90000 kB\nVmRSS:\t   54321 kB\nThreads:\t4\n";
        assert_eq!(vm_rss(status), Some(54_321));
        assert_eq!(vm_rss("Name:\tx\n"), None);
        assert!(rss_kib(std::process::id()).is_some_and(|kib| kib > 0));
    }

    #[test]
    fn parses_a_proc_net_tcp_line() {
        // 127.0.0.1:8080 <- 127.0.0.1:41202, established, inode 987654.
        let line = "   3: 0100007F:1F90 0100007F:A0F2 01 00000000:00000000 00:00000000 00000000     0        0 987654 1 0000000000000000 20 4 30 10 -1";
        assert_eq!(socket_line(line), Some((987_654, (8080, 41_202))));
        assert_eq!(socket_line("garbage"), None);
    }

    #[test]
    fn counts_this_process_client_and_engine_connections() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let engine = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let engine_port = engine.local_addr().unwrap().port();
        let before = fds(std::process::id(), port, &[engine_port]).unwrap();
        let _client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (_accepted, _) = listener.accept().unwrap();
        let _upstream = std::net::TcpStream::connect(("127.0.0.1", engine_port)).unwrap();
        let after = fds(std::process::id(), port, &[engine_port]).unwrap();
        // The accepted socket is a client connection, the connect to the engine an engine
        // one; the client's own end (remote port = the listener's) is neither.
        assert_eq!(after.clients - before.clients, 1);
        assert_eq!(after.engines - before.engines, 1);
    }
}
