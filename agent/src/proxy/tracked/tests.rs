use std::time::Duration;

use tokio::time::Instant;

use super::Silence;

/// Waits on `silence` until it fires; how long that took.
async fn wait(silence: &mut Silence, limit: Duration) -> Duration {
    let start = Instant::now();
    std::future::poll_fn(|cx| silence.poll(limit, cx)).await;
    start.elapsed()
}

#[tokio::test(start_paused = true)]
async fn the_idle_clock_fires_after_a_whole_wait_of_silence() {
    let mut s = Silence::default();
    assert_eq!(
        wait(&mut s, Duration::from_secs(5)).await,
        Duration::from_secs(5)
    );
}

#[tokio::test(start_paused = true)]
async fn time_between_waits_does_not_count_and_each_frame_restarts_the_clock() {
    let limit = Duration::from_secs(5);
    let mut s = Silence::default();
    // A first wait that ends with a frame after 3 s.
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    assert!(s.poll(limit, &mut cx).is_pending());
    tokio::time::advance(Duration::from_secs(3)).await;
    assert!(s.poll(limit, &mut cx).is_pending(), "3 s of 5");
    s.heard();
    // The client is slow to ask for more: a minute passes outside any wait.
    tokio::time::advance(Duration::from_secs(60)).await;
    // The next wait has the whole limit again, not 2 s (nor none).
    assert_eq!(wait(&mut s, limit).await, limit);
}
