//! connect() latency and connections/s with no interception, iptables `REDIRECT` (nat
//! OUTPUT, the sidecar method) and warmpath's connect4.
//!
//! Two namespaces of this run's own: `<tag>a` (no nat table: the baseline and connect4) and
//! `<tag>b` (the iptables rule, so conntrack runs there and only there). In each a listener
//! on `0.0.0.0:7000` accepts, takes the connection's origin as the agent does on accept
//! (`Origins::take`: a map lookup, and a delete when the programs recorded one), and closes. One client thread, moved into the namespace of the
//! variant it measures, times each `connect()` to loopback (socket creation and the close
//! are outside the timed span; the close is a reset, so no TIME_WAIT piles up) and the
//! variant's whole loop for its rate. The process sits in cgroup `plain` (nothing attached)
//! or `bpf` (warmpath's programs, `Redirector::load`, nothing pinned). Variants take turns
//! within each round, in an order that rotates every round, so machine noise hits all.
//!
//! Each round ends with connect4's loop once more with BPF run-time stats on
//! ([`super::kernel_cost`]): the kernel's own count and time of every warmpath program over
//! those connects; and once more from the same cgroup straight to the listener (no VIP): what
//! the programs cost a connection they do not intercept, which also bounds the accounting's
//! own share of each run. Only these passes pay the stats' clock reads; the rows above never
//! do.

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    os::fd::{AsRawFd, OwnedFd},
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use hdrhistogram::Histogram;
use nix::sys::socket::{
    AddressFamily, Backlog, Shutdown, SockFlag, SockType, SockaddrIn, bind, connect, listen,
    setsockopt, shutdown, socket, sockopt,
};
use warmpath_agent::ebpf::Origins;

use super::{
    kernel_cost::{self, KernelCost, Runs},
    report::{ConnectRow, Spread},
    setup::{Cgroups, Moved, Netns, iptables_installed},
};
use crate::Error;

/// The listener's port inside each namespace.
const PORT: u16 = 7000;
/// iptables' VIP in `<tag>b`, REDIRECTed to the listener.
const IPTABLES_VIP: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(127, 0, 10, 1), 80);
/// connect4's VIP in `<tag>a`, rewritten to the listener (loopback: a failed rewrite is
/// refused, never sent anywhere).
const BPF_VIP: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(127, 0, 10, 2), 80);
const LISTENER: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::LOCALHOST, PORT);

/// One variant: where it connects from and to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Plain,
    Iptables,
    Connect4,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Self::Plain => "no interception",
            Self::Iptables => "iptables REDIRECT",
            Self::Connect4 => "warmpath connect4",
        }
    }
}

/// Settings of this part.
#[derive(Debug, Clone)]
pub struct Settings {
    pub tag: String,
    pub rounds: usize,
    pub connects: usize,
    /// Longest one variant's loop in one round may take.
    pub max_round: Duration,
}

/// What one variant measured.
struct Measured {
    all: Histogram<u64>,
    /// Per round: median connect (ns) and connections/s.
    medians: Vec<f64>,
    rates: Vec<f64>,
}

/// What the part measured: the rows, connect4's cost as the difference of median connects
/// per round (us), and as the kernel accounts it.
pub struct Measurement {
    pub rows: Vec<ConnectRow>,
    pub difference_us: Spread,
    pub kernel: KernelCost,
    /// The same for connects from the intercepted cgroup to an address that is no VIP.
    pub kernel_passing: KernelCost,
}

/// Runs the part (blocking: call it on a thread of its own).
pub fn measure(s: &Settings, stop: &Arc<AtomicBool>) -> Result<Measurement, Error> {
    let with_iptables = iptables_installed();
    let plain_ns = Netns::create(&format!("{}a", s.tag))?;
    let ipt_ns = Netns::create(&format!("{}b", s.tag))?;
    if with_iptables {
        let vip = IPTABLES_VIP.ip().to_string();
        let (port, to) = (IPTABLES_VIP.port().to_string(), PORT.to_string());
        ipt_ns.nat(&[
            "-A",
            "OUTPUT",
            "-p",
            "tcp",
            "-d",
            &vip,
            "--dport",
            &port,
            "-j",
            "REDIRECT",
            "--to-ports",
            &to,
        ])?;
    }
    let cgroups = Cgroups::create(&s.tag, &["plain", "bpf"])?;
    let fail = |e: warmpath_agent::ebpf::Error| Error::Setup(format!("connect4: {e}"));
    warmpath_agent::ebpf::ensure_bpffs(Path::new(warmpath_agent::ebpf::DEFAULT_BPFFS))
        .map_err(fail)?;
    let mut redirector = warmpath_agent::ebpf::Redirector::load().map_err(fail)?;
    redirector.set_redirect(BPF_VIP, LISTENER).map_err(fail)?;
    let origins = redirector.origins();
    let _listeners = [
        Listener::start(&plain_ns, origins.clone())?,
        Listener::start(&ipt_ns, origins)?,
    ];
    redirector
        .attach(cgroups.children[1].path())
        .map_err(fail)?;

    let mut variants = vec![Variant::Plain, Variant::Connect4];
    if with_iptables {
        variants.insert(1, Variant::Iptables);
    }
    let mut measured: Vec<Measured> = variants
        .iter()
        .map(|_| Measured {
            all: histogram(),
            medians: Vec::new(),
            rates: Vec::new(),
        })
        .collect();
    let (mut kernel, mut passing) = (Kernel::default(), Kernel::default());
    for round in 0..s.rounds {
        for k in 0..variants.len() {
            let i = (k + round) % variants.len();
            if stop.load(Ordering::Relaxed) {
                return Err(Error::Setup("interrupted".into()));
            }
            let (ns, cgroup, to) = match variants[i] {
                Variant::Plain => (&plain_ns, cgroups.children[0].path(), LISTENER),
                Variant::Iptables => (&ipt_ns, cgroups.children[0].path(), IPTABLES_VIP),
                Variant::Connect4 => (&plain_ns, cgroups.children[1].path(), BPF_VIP),
            };
            let (h, rate) = connect_from(ns, cgroup, to, s, stop)
                .map_err(|e| Error::Setup(format!("{}: {e}", variants[i].name())))?;
            let m = &mut measured[i];
            m.medians.push(h.value_at_quantile(0.5) as f64);
            m.rates.push(rate);
            m.all
                .add(&h)
                .map_err(|e| Error::Setup(format!("histogram: {e}")))?;
        }
        let bpf = (&plain_ns, cgroups.children[1].path());
        for (k, to) in [(&mut kernel, BPF_VIP), (&mut passing, LISTENER)] {
            if k.missing.is_empty()
                && let Err(why) = k.pass(&redirector, bpf, to, s, stop)
            {
                k.missing = why.to_string();
            }
        }
    }
    drop(redirector);
    let mut rows: Vec<ConnectRow> = variants
        .iter()
        .zip(&measured)
        .map(|(v, m)| ConnectRow::measured(v.name(), &m.all, &m.rates))
        .collect();
    if !with_iptables {
        rows.insert(
            1,
            ConnectRow::absent(Variant::Iptables.name(), "iptables not installed"),
        );
    }
    let base = &measured[0].medians;
    let bpf = &measured[variants.len() - 1].medians;
    let difference_us = Spread::of(base.iter().zip(bpf).map(|(b, c)| (c - b) / 1000.0));
    Ok(Measurement {
        rows,
        difference_us,
        kernel: kernel.cost(),
        kernel_passing: passing.cost(),
    })
}

/// The in-kernel passes so far: connects, each program's totals, each round's ns per
/// connect; or why stats could not be had.
#[derive(Default)]
struct Kernel {
    connects: u64,
    totals: Vec<Runs>,
    rounds: Vec<f64>,
    missing: String,
}

impl Kernel {
    /// The connect loop to `to` with run-time stats on, from `ns` and `cgroup`: each
    /// program's runs and time over it.
    fn pass(
        &mut self,
        redirector: &warmpath_agent::ebpf::Redirector,
        (ns, cgroup): (&Netns, &Path),
        to: SocketAddrV4,
        s: &Settings,
        stop: &AtomicBool,
    ) -> Result<(), Error> {
        let fail = |e: warmpath_agent::ebpf::Error| Error::Setup(format!("BPF stats: {e}"));
        let runs = || -> Result<Vec<Runs>, Error> {
            Ok(redirector
                .program_runs()
                .map_err(fail)?
                .into_iter()
                .map(|p| Runs {
                    program: p.name.into(),
                    runs: p.run_count,
                    run_time_ns: p.run_time_ns,
                })
                .collect())
        };
        let stats = warmpath_agent::ebpf::RunTimeStats::enable().map_err(fail)?;
        let before = runs()?;
        let looped = connect_from(ns, cgroup, to, s, stop);
        let after = runs()?;
        drop(stats);
        let connects = looped?.0.len();
        let d = kernel_cost::delta(&before, &after);
        self.rounds.push(kernel_cost::ns_per_connect(connects, &d));
        self.connects += connects;
        kernel_cost::accumulate(&mut self.totals, &d);
        Ok(())
    }

    fn cost(self) -> KernelCost {
        if self.missing.is_empty() {
            KernelCost::of(self.connects, &self.totals, &self.rounds)
        } else {
            KernelCost::missing(&self.missing)
        }
    }
}

fn histogram() -> Histogram<u64> {
    // 1 ns .. 10 s, 3 significant digits: bounded whatever a connect takes.
    Histogram::new_with_bounds(1, 10_000_000_000, 3).expect("constant, valid bounds")
}

/// `count` connects to `to` (or as many as fit in `within`): each one's latency in ns, and
/// connections per second over the loop.
/// [`connect_loop`] on a thread in `ns`, this process moved into `cgroup` meanwhile.
fn connect_from(
    ns: &Netns,
    cgroup: &Path,
    to: SocketAddrV4,
    s: &Settings,
    stop: &AtomicBool,
) -> Result<(Histogram<u64>, f64), Error> {
    let moved = Moved::into(cgroup)?;
    let looped = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                ns.enter_thread()?;
                connect_loop(to, s.connects, s.max_round, stop)
            })
            .join()
            .map_err(|_| Error::Setup("the connect loop panicked".into()))?
    });
    drop(moved);
    looped
}

fn connect_loop(
    to: SocketAddrV4,
    count: usize,
    within: Duration,
    stop: &AtomicBool,
) -> Result<(Histogram<u64>, f64), Error> {
    let mut h = histogram();
    let addr = SockaddrIn::from(to);
    let start = Instant::now();
    let mut done = 0usize;
    while done < count && start.elapsed() < within && !stop.load(Ordering::Relaxed) {
        let fd = tcp_socket()?;
        let t0 = Instant::now();
        connect(fd.as_raw_fd(), &addr).map_err(|e| Error::Setup(format!("connect {to}: {e}")))?;
        let took = t0.elapsed();
        // A reset on close: the client keeps no TIME_WAIT, so ports never run out.
        let _ = setsockopt(
            &fd,
            sockopt::Linger,
            &nix::libc::linger {
                l_onoff: 1,
                l_linger: 0,
            },
        );
        drop(fd);
        h.saturating_record(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX).max(1));
        done += 1;
    }
    if done == 0 {
        return Err(Error::Setup(format!(
            "no connect to {to} within {within:?}"
        )));
    }
    Ok((h, done as f64 / start.elapsed().as_secs_f64()))
}

fn tcp_socket() -> Result<OwnedFd, Error> {
    socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| Error::Setup(format!("socket: {e}")))
}

// === Listener ===

/// A thread in a namespace accepting on `0.0.0.0:7000`, taking each connection's origin (the
/// agent's work on accept) and closing; stopped when dropped (shutting the socket down wakes
/// its blocked accept).
struct Listener {
    fd: OwnedFd,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Listener {
    fn start(ns: &Netns, origins: Arc<Origins>) -> Result<Self, Error> {
        let (tx, rx) = std::sync::mpsc::channel();
        let ns_path = ns.path();
        let enter = move || -> Result<OwnedFd, Error> {
            let file = std::fs::File::open(&ns_path).map_err(|source| Error::Io {
                what: format!("open {}", ns_path.display()),
                source,
            })?;
            nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| Error::Setup(format!("setns: {e}")))?;
            let fd = tcp_socket()?;
            let err = |e| Error::Setup(format!("listen on 0.0.0.0:{PORT}: {e}"));
            setsockopt(&fd, sockopt::ReuseAddr, &true).map_err(err)?;
            bind(
                fd.as_raw_fd(),
                &SockaddrIn::from(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, PORT)),
            )
            .map_err(err)?;
            listen(&fd, Backlog::new(1024).map_err(err)?).map_err(err)?;
            Ok(fd)
        };
        let thread = std::thread::spawn(move || {
            let fd = match enter() {
                Ok(fd) => fd,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            let Ok(dup) = fd.try_clone() else {
                let _ = tx.send(Err(Error::Setup("dup the listener".into())));
                return;
            };
            let _ = tx.send(Ok(dup));
            let listener = std::net::TcpListener::from(fd);
            // Until shut down: accept() then fails and the loop ends.
            loop {
                match listener.accept() {
                    // The peer as accept() reports it: the client has usually reset the
                    // connection by now, and getpeername() would refuse.
                    Ok((conn, peer)) => {
                        if let Ok(local) = conn.local_addr() {
                            let _ = origins.take(peer, local);
                        }
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::Interrupted
                        ) => {}
                    Err(_) => break,
                }
            }
        });
        let fd = rx
            .recv()
            .map_err(|_| Error::Setup("the listener thread ended".into()))??;
        Ok(Self {
            fd,
            thread: Some(thread),
        })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = shutdown(self.fd.as_raw_fd(), Shutdown::Both);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
