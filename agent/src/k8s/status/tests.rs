//! Condition diffing (table-driven), the Lease election over an in-memory Lease API on
//! tokio's paused clock (two contenders, renewal, expiry, takeover, conflict, lost API), and
//! the writer: statuses written only by the holder and only when they differ.

use std::{
    sync::{Arc, atomic::AtomicBool},
    time::Duration,
};

use parking_lot::Mutex;

use super::*;

const T0: &str = "2026-12-01T15:00:00Z";
const NOW: &str = "2026-12-01T16:00:00Z";

fn cond(type_: &str, status: &str, reason: &str, generation: i64, time: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: format!("{reason} at {generation}"),
        observed_generation: Some(generation),
        last_transition_time: time.into(),
    }
}

fn status(generation: i64, conditions: Vec<Condition>) -> ResourceStatus {
    ResourceStatus {
        observed_generation: Some(generation),
        conditions,
    }
}

#[test]
fn next_status_writes_only_what_differs() {
    let accepted = |g, t: &str| cond("Accepted", "True", "Accepted", g, t);
    let invalid = |g, t: &str| cond("Accepted", "False", "Invalid", g, t);
    let resolved = |g, t: &str| cond("ResolvedRefs", "True", "ResolvedRefs", g, t);
    let foreign = cond("Ready", "True", "ByOther", 1, T0);
    // (what, current, desired (times ignored), expected write)
    let cases: Vec<(
        &str,
        Option<ResourceStatus>,
        ResourceStatus,
        Option<ResourceStatus>,
    )> = vec![
        (
            "no status yet: everything, at now",
            None,
            status(1, vec![accepted(1, ""), resolved(1, "")]),
            Some(status(1, vec![accepted(1, NOW), resolved(1, NOW)])),
        ),
        (
            "the same: nothing (times not compared with the wish)",
            Some(status(1, vec![accepted(1, T0), resolved(1, T0)])),
            status(1, vec![accepted(1, ""), resolved(1, "x")]),
            None,
        ),
        (
            "the same in another order: nothing",
            Some(status(1, vec![resolved(1, T0), accepted(1, T0)])),
            status(1, vec![accepted(1, ""), resolved(1, "")]),
            None,
        ),
        (
            "a new generation accepted: status unchanged keeps its time",
            Some(status(1, vec![accepted(1, T0), resolved(1, T0)])),
            status(2, vec![accepted(2, ""), resolved(2, "")]),
            Some(status(2, vec![accepted(2, T0), resolved(2, T0)])),
        ),
        (
            "rejected: Accepted flips (time now), ResolvedRefs of the last good stays",
            Some(status(1, vec![accepted(1, T0), resolved(1, T0)])),
            status(2, vec![invalid(2, ""), resolved(1, "")]),
            Some(status(2, vec![invalid(2, NOW), resolved(1, T0)])),
        ),
        (
            "a managed condition no longer wished is removed",
            Some(status(1, vec![accepted(1, T0), resolved(1, T0)])),
            status(1, vec![accepted(1, "")]),
            Some(status(1, vec![accepted(1, T0)])),
        ),
        (
            "another writer's condition is kept, after ours",
            Some(status(1, vec![foreign.clone()])),
            status(1, vec![accepted(1, "")]),
            Some(status(1, vec![accepted(1, NOW), foreign.clone()])),
        ),
        (
            "another writer's condition alone does not cause a write",
            Some(status(1, vec![foreign.clone(), accepted(1, T0)])),
            status(1, vec![accepted(1, "")]),
            None,
        ),
        (
            "only observedGeneration differs: written",
            Some(status(1, vec![accepted(1, T0)])),
            status(3, vec![accepted(1, "")]),
            Some(status(3, vec![accepted(1, T0)])),
        ),
    ];
    for (what, current, desired, want) in cases {
        assert_eq!(next_status(current.as_ref(), &desired, NOW), want, "{what}");
    }
}

// === the election ===

/// One Lease in memory, shared by the contenders: create fails when it exists, replace
/// when the resourceVersion is stale, exactly as the API server does.
#[derive(Debug, Default)]
struct MemLease {
    lease: Mutex<Option<LeaseRecord>>,
    version: Mutex<u64>,
    /// While set, every call fails (the API unreachable from this contender).
    down: AtomicBool,
}

/// A contender's view of the shared Lease.
#[derive(Debug, Clone)]
struct View {
    mem: Arc<MemLease>,
    /// Answers `get` with this record instead (a read that another write overtakes).
    stale: Arc<Mutex<Option<LeaseRecord>>>,
    down: Arc<AtomicBool>,
}

impl View {
    fn new(mem: &Arc<MemLease>) -> Self {
        Self {
            mem: mem.clone(),
            stale: Arc::default(),
            down: Arc::default(),
        }
    }

    fn check(&self) -> Result<(), LeaseError> {
        if self.down.load(Ordering::Relaxed) || self.mem.down.load(Ordering::Relaxed) {
            return Err(LeaseError::Api("connection refused".into()));
        }
        Ok(())
    }
}

impl MemLease {
    fn next_version(&self) -> String {
        let mut v = self.version.lock();
        *v += 1;
        v.to_string()
    }

    fn holder(&self) -> Option<String> {
        self.lease.lock().as_ref().and_then(|l| l.holder.clone())
    }

    fn transitions(&self) -> i32 {
        self.lease.lock().as_ref().map_or(0, |l| l.transitions)
    }
}

impl LeaseApi for View {
    async fn get(&self) -> Result<Option<LeaseRecord>, LeaseError> {
        self.check()?;
        if let Some(r) = self.stale.lock().take() {
            return Ok(Some(r));
        }
        Ok(self.mem.lease.lock().clone())
    }

    async fn create(&self, r: &LeaseRecord) -> Result<LeaseRecord, LeaseError> {
        self.check()?;
        let mut lease = self.mem.lease.lock();
        if lease.is_some() {
            return Err(LeaseError::Conflict);
        }
        let made = LeaseRecord {
            resource_version: self.mem.next_version(),
            ..r.clone()
        };
        *lease = Some(made.clone());
        Ok(made)
    }

    async fn replace(&self, r: &LeaseRecord) -> Result<LeaseRecord, LeaseError> {
        self.check()?;
        let mut lease = self.mem.lease.lock();
        match lease.as_ref() {
            Some(l) if l.resource_version == r.resource_version => {}
            _ => return Err(LeaseError::Conflict),
        }
        let written = LeaseRecord {
            resource_version: self.mem.next_version(),
            ..r.clone()
        };
        *lease = Some(written.clone());
        Ok(written)
    }
}

fn elector(view: &View, name: &str) -> Elector<View> {
    Elector::new(view.clone(), name.into(), LeaseTiming::default())
}

async fn advance(d: Duration) {
    tokio::time::advance(d).await;
}

#[tokio::test(start_paused = true)]
async fn one_of_two_contenders_leads_and_keeps_leading_while_it_renews() {
    let mem = Arc::new(MemLease::default());
    let (va, vb) = (View::new(&mem), View::new(&mem));
    let (mut a, mut b) = (elector(&va, "node-a"), elector(&vb, "node-b"));
    let until = a.tick().await.expect("a creates the Lease and leads");
    assert_eq!(until, Instant::now() + Duration::from_secs(10));
    assert_eq!(b.tick().await, None, "b finds it held");
    for _ in 0..12 {
        advance(Duration::from_secs(5)).await;
        assert!(a.tick().await.is_some());
        assert_eq!(b.tick().await, None);
    }
    assert_eq!(mem.holder().as_deref(), Some("node-a"));
    assert_eq!(mem.transitions(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_holder_gone_is_taken_over_only_after_the_duration() {
    let mem = Arc::new(MemLease::default());
    let (va, vb) = (View::new(&mem), View::new(&mem));
    let (mut a, mut b) = (elector(&va, "node-a"), elector(&vb, "node-b"));
    assert!(a.tick().await.is_some());
    assert_eq!(b.tick().await, None, "b first sees a's record now");
    // a stops renewing (it died). b keeps looking every 5 s.
    for _ in 0..2 {
        advance(Duration::from_secs(5)).await;
        assert_eq!(b.tick().await, None, "not expired yet");
    }
    advance(Duration::from_millis(4_999)).await;
    assert_eq!(b.tick().await, None, "14.999 s after b saw it change");
    advance(Duration::from_millis(1)).await;
    assert!(b.tick().await.is_some(), "15 s unchanged: b takes over");
    assert_eq!(mem.holder().as_deref(), Some("node-b"));
    assert_eq!(mem.transitions(), 1);
    // a comes back: it finds b's (fresh) record and does not lead.
    assert_eq!(a.tick().await, None);
}

#[tokio::test(start_paused = true)]
async fn of_two_writes_over_one_read_the_second_conflicts() {
    let mem = Arc::new(MemLease::default());
    let (vc, va, vb) = (View::new(&mem), View::new(&mem), View::new(&mem));
    let mut c = elector(&vc, "node-c");
    assert!(c.tick().await.is_some());
    let (mut a, mut b) = (elector(&va, "node-a"), elector(&vb, "node-b"));
    assert_eq!(a.tick().await, None);
    assert_eq!(b.tick().await, None);
    advance(Duration::from_secs(15)).await;
    // Both read the expired record; a writes first, so b's write is over a stale version.
    let expired = mem.lease.lock().clone();
    *vb.stale.lock() = expired;
    assert!(a.tick().await.is_some(), "a takes over");
    assert_eq!(b.tick().await, None, "b's conditional write conflicts");
    assert_eq!(mem.holder().as_deref(), Some("node-a"));
    assert_eq!(mem.transitions(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_holder_that_cannot_renew_stops_at_its_deadline() {
    let mem = Arc::new(MemLease::default());
    let va = View::new(&mem);
    let mut a = elector(&va, "node-a");
    let first = a.tick().await.expect("leads");
    va.down.store(true, Ordering::Relaxed);
    advance(Duration::from_secs(5)).await;
    assert_eq!(
        a.tick().await,
        Some(first),
        "still leading until the deadline"
    );
    advance(Duration::from_secs(5)).await;
    assert_eq!(a.tick().await, None, "10 s without renewal: stops");
    va.down.store(false, Ordering::Relaxed);
    assert!(a.tick().await.is_some(), "its own record: renews again");
}

#[tokio::test(start_paused = true)]
async fn a_holder_learning_of_a_new_holder_stops_at_once() {
    let mem = Arc::new(MemLease::default());
    let (va, vb) = (View::new(&mem), View::new(&mem));
    let (mut a, mut b) = (elector(&va, "node-a"), elector(&vb, "node-b"));
    assert!(a.tick().await.is_some());
    assert_eq!(b.tick().await, None);
    // a is cut off long enough for b to take over.
    va.down.store(true, Ordering::Relaxed);
    advance(Duration::from_secs(15)).await;
    assert_eq!(a.tick().await, None);
    assert!(b.tick().await.is_some());
    va.down.store(false, Ordering::Relaxed);
    assert_eq!(a.tick().await, None, "b holds it, renewed just now");
}

#[tokio::test(start_paused = true)]
async fn a_released_lease_is_taken_at_the_next_read() {
    let mem = Arc::new(MemLease::default());
    let (va, vb) = (View::new(&mem), View::new(&mem));
    let (mut a, mut b) = (elector(&va, "node-a"), elector(&vb, "node-b"));
    assert!(a.tick().await.is_some());
    assert_eq!(b.tick().await, None);
    a.release().await;
    assert_eq!(mem.holder(), None);
    assert!(b.tick().await.is_some(), "no holder: taken at once");
    assert_eq!(
        (mem.holder().as_deref(), mem.transitions()),
        (Some("node-b"), 1)
    );
    // Releasing what it does not hold changes nothing.
    a.release().await;
    assert_eq!(mem.holder().as_deref(), Some("node-b"));
}

// === the writer ===

/// Records status writes; the object's status becomes what was written.
#[derive(Debug, Default, Clone)]
struct MemStatus {
    written: Arc<Mutex<Vec<(String, ResourceStatus)>>>,
}

impl StatusApi for MemStatus {
    async fn write(&self, t: &Target, status: &ResourceStatus) -> Result<(), String> {
        self.written.lock().push((t.name.clone(), status.clone()));
        Ok(())
    }
}

fn target(name: &str, rv: &str, current: Option<ResourceStatus>, generation: i64) -> Target {
    Target {
        kind: Kind::Tenant,
        namespace: None,
        name: name.into(),
        resource_version: Some(rv.into()),
        current,
        desired: status(
            generation,
            vec![cond("Accepted", "True", "Accepted", generation, "")],
        ),
    }
}

fn settings(holder: &str) -> Settings {
    Settings {
        holder: holder.into(),
        namespace: "warmpath".into(),
        timing: LeaseTiming::default(),
    }
}

/// Lets the spawned tasks run until they wait (the paused clock does not move).
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn only_the_holder_writes_and_only_what_differs() {
    let mem = Arc::new(MemLease::default());
    let (sa, sb) = (MemStatus::default(), MemStatus::default());
    let (tx, rx) = watch::channel(Arc::new(vec![target("team-a", "1", None, 1)]));
    let a = spawn_with(View::new(&mem), sa.clone(), settings("node-a"), rx.clone());
    settle().await;
    let b = spawn_with(View::new(&mem), sb.clone(), settings("node-b"), rx);
    settle().await;
    assert!(a.is_leader() && !b.is_leader());
    assert_eq!(sa.written.lock().len(), 1, "{:?}", sa.written.lock());
    assert!(sb.written.lock().is_empty());
    let (_, first) = sa.written.lock()[0].clone();
    // The same wish again before the watch shows the write: not written twice.
    tx.send_replace(Arc::new(vec![target("team-a", "1", None, 1)]));
    settle().await;
    assert_eq!(a.writes(), 1);
    // The watch shows it: nothing to write, across renewals and a relist.
    tx.send_replace(Arc::new(vec![target(
        "team-a",
        "2",
        Some(first.clone()),
        1,
    )]));
    for _ in 0..4 {
        advance(Duration::from_secs(5)).await;
        settle().await;
    }
    assert_eq!(a.writes(), 1);
    // A new generation: one write, by a.
    tx.send_replace(Arc::new(vec![target("team-a", "3", Some(first), 2)]));
    settle().await;
    assert_eq!((a.writes(), b.writes()), (2, 0));
    // a goes away: b takes over after the Lease expires, and writes what differs.
    drop(a);
    tx.send_replace(Arc::new(vec![target("team-a", "4", None, 3)]));
    settle().await;
    assert_eq!(b.writes(), 0, "b does not hold the Lease yet");
    for _ in 0..4 {
        advance(Duration::from_secs(5)).await;
        settle().await;
    }
    assert!(b.is_leader());
    assert_eq!(b.writes(), 1);
    assert_eq!(sb.written.lock()[0].1.observed_generation, Some(3));
    // A graceful stop hands the Lease back.
    b.release().await;
    assert_eq!(mem.holder(), None);
}
