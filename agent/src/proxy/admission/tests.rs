use std::time::Duration;

use hyper::body::Frame;

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
        &a,
        false,
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

/// A body fed by hand: frames sent on the returned channel.
fn fed() -> (
    futures::channel::mpsc::Sender<Result<Frame<bytes::Bytes>, crate::http::BoxError>>,
    crate::http::Body,
) {
    use http_body_util::BodyExt;
    let (tx, rx) = futures::channel::mpsc::channel(4);
    (tx, http_body_util::StreamBody::new(rx).boxed_unsync())
}

#[tokio::test(start_paused = true)]
async fn a_silent_engine_ends_a_stream_with_an_error_event_at_the_idle_timeout() {
    use futures::SinkExt;
    use http_body_util::BodyExt;
    let a = Admission::new(Limits {
        upstream_idle_timeout: Duration::from_secs(5),
        ..limits(1, 0, 1)
    });
    let (mut tx, inner) = fed();
    let permit = a.admit().await.unwrap();
    let mut body = hold(inner, permit, &a, true);
    tx.send(Ok(Frame::data("data: {\"a\"".into())))
        .await
        .unwrap();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&first[..], b"data: {\"a\"");
    // A client that is slow to ask for more does not count as engine silence.
    tokio::time::advance(Duration::from_secs(60)).await;
    tx.send(Ok(Frame::data("}".into()))).await.unwrap();
    body.frame().await.unwrap().unwrap();
    let start = tokio::time::Instant::now();
    let end = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    let end = std::str::from_utf8(&end).unwrap();
    assert!(
        end.starts_with("\n\ndata: {\"error\""),
        "closes the open event: {end}"
    );
    assert!(
        end.contains("\"code\":504") && end.ends_with("data: [DONE]\n\n"),
        "{end}"
    );
    assert!(body.frame().await.is_none());
    assert_eq!(a.idle_timeouts.load(Ordering::Relaxed), 1);
    drop(body);
    assert_eq!(a.active(), 0, "the slot is released with the body");
}

#[tokio::test(start_paused = true)]
async fn a_silent_engine_cuts_other_bodies_short() {
    use http_body_util::BodyExt;
    let a = Admission::new(Limits {
        upstream_idle_timeout: Duration::from_secs(2),
        ..limits(0, 0, 1)
    });
    let (_tx, inner) = fed();
    let mut body = hold(inner, None, &a, false);
    let err = body.frame().await.unwrap().unwrap_err();
    assert!(err.to_string().contains("idle timeout"), "{err}");
}
