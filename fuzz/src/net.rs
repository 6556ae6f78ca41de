//! A loopback harness: one current-thread runtime and one listener on 127.0.0.1 per fuzzing
//! thread, and a connected pair of TCP streams per input.

use std::{future::Future, time::Duration};

use tokio::{
    net::{TcpListener, TcpStream},
    runtime::Runtime,
};

/// How long one input may take end to end. Every exchange ends once both sides have sent
/// everything and closed, so reaching this is a hang: the target fails.
pub const EXCHANGE_LIMIT: Duration = Duration::from_secs(20);

thread_local! {
    /// Made once per thread and kept for the process's life (leaked on purpose: one each).
    static LOOPBACK: &'static (Runtime, TcpListener) = {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime builds");
        let listener = rt
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .expect("a loopback port is free");
        Box::leak(Box::new((rt, listener)))
    };
}

/// Runs `work` on this thread's runtime with its listener; panics (fails the input) when it
/// takes longer than [`EXCHANGE_LIMIT`].
pub fn run<F, Fut, T>(work: F) -> T
where
    F: FnOnce(&'static TcpListener) -> Fut,
    Fut: Future<Output = T>,
{
    let (rt, listener) = LOOPBACK.with(|l| *l);
    rt.block_on(async {
        tokio::time::timeout(EXCHANGE_LIMIT, work(listener))
            .await
            .unwrap_or_else(|_| panic!("the exchange did not finish within {EXCHANGE_LIMIT:?}"))
    })
}

/// Just `block_on` on this thread's runtime (for async code that does no network I/O).
pub fn block_on<F: Future>(work: F) -> F::Output {
    LOOPBACK.with(|l| l.0.block_on(work))
}

/// A connected pair: (the accepted side, the connecting side).
pub async fn pair(listener: &TcpListener) -> (TcpStream, std::net::SocketAddr, TcpStream) {
    let addr = listener
        .local_addr()
        .expect("a bound listener has an address");
    let (accepted, connected) = tokio::join!(listener.accept(), TcpStream::connect(addr));
    let (server, peer) = accepted.expect("loopback accept");
    let client = connected.expect("loopback connect");
    (server, peer, client)
}

/// Everything the peer sends until it closes (or resets: then `reset` is true and the bytes
/// are those read before).
pub async fn read_all(r: &mut (impl tokio::io::AsyncRead + Unpin)) -> (Vec<u8>, bool) {
    use tokio::io::AsyncReadExt as _;
    let mut out = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) => return (out, false),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(_) => return (out, true),
        }
    }
}
