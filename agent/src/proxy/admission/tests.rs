use std::time::Duration;

use super::*;

fn limits(max_concurrent: usize, max_queued: usize, queue_ms: u64) -> Limits {
    Limits {
        max_concurrent,
        max_queued,
        queue_timeout: Duration::from_millis(queue_ms),
        ..Limits::default()
    }
}

#[tokio::test(start_paused = true)]
async fn a_full_agent_queues_then_refuses_with_a_retry_hint() {
    let a = Admission::new(limits(2, 1, 1500));
    let p1 = a.admit().await.unwrap().expect("counted");
    let _p2 = a.admit().await.unwrap().expect("counted");
    assert_eq!(a.active(), 2);
    // The third waits; a fourth finds the queue full and is refused at once.
    let waiter = tokio::spawn({
        let a = a.clone();
        async move { a.admit().await }
    });
    tokio::task::yield_now().await;
    assert_eq!(a.waiting.load(Ordering::Relaxed), 1);
    let full = a.admit().await.unwrap_err();
    assert_eq!(full.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(full.retry_after, Some(2), "1.5 s rounded up");
    assert_eq!(a.refused(Refused::QueueFull), 1);
    // A released slot goes to the waiter.
    drop(p1);
    let p3 = waiter.await.unwrap().unwrap();
    assert!(p3.is_some());
    assert_eq!(a.active(), 2);
    assert_eq!(a.waiting.load(Ordering::Relaxed), 0);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_gives_up_at_the_queue_timeout_not_before() {
    let a = Admission::new(limits(1, 4, 300));
    let _held = a.admit().await.unwrap();
    let start = tokio::time::Instant::now();
    let err = a.admit().await.unwrap_err();
    assert_eq!(start.elapsed(), Duration::from_millis(300));
    assert_eq!(err.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(err.message.contains("300 ms"), "{}", err.message);
    assert_eq!(a.refused(Refused::QueueTimeout), 1);
    assert_eq!(a.waiting.load(Ordering::Relaxed), 0);
}

#[tokio::test(start_paused = true)]
async fn waiters_are_served_in_arrival_order_and_none_is_lost() {
    let a = Admission::new(limits(1, 8, 10_000));
    let first = a.admit().await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..5 {
        let (a, tx) = (a.clone(), tx.clone());
        tokio::spawn(async move {
            let p = a.admit().await.unwrap();
            tx.send(i).unwrap();
            // Hold the slot a moment, then pass it on.
            tokio::time::sleep(Duration::from_millis(1)).await;
            drop(p);
        });
        tokio::task::yield_now().await;
    }
    drop(first);
    let mut order = Vec::new();
    for _ in 0..5 {
        order.push(rx.recv().await.unwrap());
    }
    assert_eq!(order, [0, 1, 2, 3, 4]);
    assert_eq!(a.refused(Refused::QueueTimeout), 0);
}

#[tokio::test]
async fn no_limit_counts_nothing() {
    let a = Admission::new(limits(0, 0, 0));
    for _ in 0..100 {
        assert!(a.admit().await.unwrap().is_none());
    }
    assert_eq!(a.active(), 0);
}

#[tokio::test]
async fn a_held_body_keeps_its_slot_until_dropped() {
    let a = Admission::new(limits(1, 0, 1));
    let permit = a.admit().await.unwrap().unwrap();
    let body = hold(
        crate::http::message::full(StatusCode::OK, "text/plain", "x").into_body(),
        Some(permit),
    );
    assert_eq!(a.admit().await.unwrap_err().status, 429);
    drop(body);
    assert!(a.admit().await.unwrap().is_some());
}

#[test]
fn retry_after_rounds_up_to_whole_seconds() {
    assert_eq!(retry_after(Duration::ZERO), 1);
    assert_eq!(retry_after(Duration::from_millis(1)), 1);
    assert_eq!(retry_after(Duration::from_millis(2000)), 2);
    assert_eq!(retry_after(Duration::from_millis(2001)), 3);
}
