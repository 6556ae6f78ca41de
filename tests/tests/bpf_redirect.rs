//! cgroup/connect4 redirect, end to end: build -> embed -> load -> attach -> verify
//! (getpeername4 shows the VIP).
//!
//! Root only. A child cgroup is created under the detected cgroup v2 root (never the root
//! itself), the program is attached to it, and a real client process (python3) inside it
//! connects to the VIP 127.77.0.1:8000. Nothing listens on the VIP, so only a working
//! rewrite can reach the listener; a process outside the cgroup gets "connection refused".
#![allow(clippy::unwrap_used)] // test binary: a failed unwrap is a failed test

use std::{
    io::ErrorKind,
    net::{SocketAddrV4, TcpListener, TcpStream},
    process::Command,
    sync::mpsc,
    time::Duration,
};

use warmpath_agent::ebpf::{ChildCgroup, Redirector, cgroup2_root};
use warmpath_e2e::{gate, process::OwnedChild};

const VIP: &str = "127.77.0.1:8000";
const WAIT: Duration = Duration::from_secs(10);

/// Connects to the VIP when told to ("go" on stdin) and prints its own address and the peer.
const CLIENT: &str = r#"
import socket, sys
for line in sys.stdin:
    host, port = sys.argv[1].split(":")
    try:
        s = socket.create_connection((host, int(port)), timeout=5)
        own = s.getsockname()
        peer = s.getpeername()
        print(f"ok {own[0]}:{own[1]} {peer[0]}:{peer[1]}", flush=True)
        s.close()
    except OSError as e:
        print(f"err {e.errno}", flush=True)
"#;

fn client_process() -> OwnedChild {
    let mut cmd = Command::new("python3");
    cmd.args(["-c", CLIENT, VIP]);
    OwnedChild::spawn(cmd).expect("python3 is installed by .ci/run")
}

/// Accepts one connection on `listener` within `WAIT`, on a helper thread.
fn accept_one(listener: TcpListener) -> mpsc::Receiver<std::io::Result<SocketAddrV4>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let accepted = listener.accept().map(|(_, peer)| match peer {
            std::net::SocketAddr::V4(v4) => v4,
            std::net::SocketAddr::V6(v6) => panic!("IPv4 listener got {v6}"),
        });
        let _ = tx.send(accepted);
    });
    rx
}

#[test]
fn connect4_redirects_only_inside_the_cgroup() {
    if !gate::bpf_available("connect4_redirects_only_inside_the_cgroup") {
        return;
    }
    let vip: SocketAddrV4 = VIP.parse().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let target = match listener.local_addr().unwrap() {
        std::net::SocketAddr::V4(v4) => v4,
        other => panic!("bound {other}"),
    };

    // Declaration order is drop order reversed: client killed, then program detached, then
    // the cgroup emptied and removed, also when an assertion below fails.
    let root = cgroup2_root().unwrap();
    let cgroup_name = format!("warmpath-test-connect4-{}", std::process::id());
    let cgroup = ChildCgroup::create(&root, &cgroup_name).unwrap();
    let mut redirector = Redirector::load().unwrap();
    redirector.set_redirect(vip, target).unwrap();
    redirector.attach(cgroup.path()).unwrap();
    let mut client = client_process();
    cgroup.add_process(client.pid()).unwrap();

    // (a) the client inside the cgroup reaches the listener through the VIP.
    let accepted = accept_one(listener.try_clone().unwrap());
    client.send_line("go").unwrap();
    let reply = client.next_line(WAIT).expect("client answered");
    let mut parts = reply.split_whitespace();
    assert_eq!(
        parts.next(),
        Some("ok"),
        "client inside the cgroup: {reply}"
    );
    let own: SocketAddrV4 = parts.next().unwrap().parse().unwrap();
    let peer = parts.next().unwrap();
    let accepted = accepted
        .recv_timeout(WAIT)
        .expect("listener accepted")
        .unwrap();
    assert_eq!(
        accepted, own,
        "the listener accepted the client's connection"
    );
    assert_eq!(peer, VIP, "getpeername4 shows the VIP the client dialled");

    // (b) the original destination, recorded under the client socket's cookie at connect and
    // copied to the connection's 4-tuple once established, is what an accept finds; taking
    // it removes it.
    let origins = redirector.origins();
    let origin = origins
        .take(accepted.into(), target.into())
        .unwrap()
        .expect("the accepted connection's origin");
    assert_eq!(origin.vip, vip.into());
    assert_eq!(
        origin.cgroup_id,
        warmpath_agent::ebpf::cgroup_id(cgroup.path()).unwrap(),
        "the client's cgroup is recorded"
    );
    assert_eq!(
        origins.take(accepted.into(), target.into()).unwrap(),
        None,
        "an origin is taken once"
    );
    let counters = redirector.counters().unwrap();
    assert!(counters.redirected >= 1, "{counters:?}");
    assert_eq!(counters.orig_dst_failed, 0);
    assert!(counters.peername_rewritten >= 1, "{counters:?}");

    // (c) a process outside the cgroup (this one) is not redirected: nothing listens on the VIP.
    let outside = TcpStream::connect_timeout(&vip.into(), WAIT);
    assert_eq!(
        outside.map(|_| ()).unwrap_err().kind(),
        ErrorKind::ConnectionRefused
    );

    // (d) after detaching, the same client in the same cgroup is no longer redirected.
    redirector.detach_all();
    assert!(redirector.attached().is_empty());
    client.send_line("go").unwrap();
    let reply = client
        .next_line(WAIT)
        .expect("client answered after detach");
    assert_eq!(
        reply,
        format!("err {}", libc_econnrefused()),
        "after detach: {reply}"
    );

    drop(client);
    drop(redirector);
    let path = cgroup.path().to_path_buf();
    drop(cgroup);
    assert!(!path.exists(), "cgroup {} removed", path.display());
    gate::announce(&format!(
        "bpf: connect4 redirect verified ({VIP} -> {target}, client {own}), detached and cleaned up"
    ));
}

fn libc_econnrefused() -> i32 {
    nix::errno::Errno::ECONNREFUSED as i32
}
