//! Per-request series, aggregated per thread without locks.
//!
//! Every thread that records owns a shard of cells. A cell is written by its owning thread
//! only, with a relaxed load and a relaxed store: no lock, no `lock`-prefixed instruction,
//! nothing another core has to give back. Collectors (a Prometheus scrape, an OTLP push) read
//! the cells with relaxed loads and sum the shards. A value read mid-update is the value just
//! before or just after one request, which a cumulative series absorbs at the next read.
//!
//! Memory is bounded: a shard holds one set of cells per series its thread recorded, and series
//! are bounded by the tenant cap and the pools. When a thread ends, its shard is folded into
//! the retired totals at the next collection and freed, so counts survive their threads. A
//! record made while the thread's own storage is being torn down goes to a shared shard
//! behind a mutex instead of being lost.

use std::{
    cell::RefCell,
    collections::{BTreeMap, HashMap},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use parking_lot::Mutex;

/// A counter written by one thread: see the module docs.
#[derive(Debug, Default)]
pub struct Cell(AtomicU64);

impl Cell {
    fn with(v: u64) -> Self {
        Self(AtomicU64::new(v))
    }

    /// Adds `v`. Only the cell's owning thread (or the holder of the fallback lock) calls this.
    #[inline]
    pub fn add(&self, v: u64) {
        self.set(self.get().wrapping_add(v));
    }

    #[inline]
    fn set(&self, v: u64) {
        self.0.store(v, Ordering::Relaxed);
    }

    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// An explicit-bucket histogram written by one thread (OpenTelemetry's bucket rule: bucket
/// `i` counts values in `(bounds[i-1], bounds[i]]`, the last one everything above).
#[derive(Debug)]
pub struct Hist {
    bounds: &'static [f64],
    buckets: Box<[Cell]>,
    /// `f64` bits.
    sum: Cell,
    min: Cell,
    max: Cell,
}

impl Hist {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            buckets: (0..=bounds.len()).map(|_| Cell::default()).collect(),
            sum: Cell::with(0f64.to_bits()),
            min: Cell::with(f64::INFINITY.to_bits()),
            max: Cell::with(f64::NEG_INFINITY.to_bits()),
        }
    }

    /// Records `v`; values that are not finite are ignored.
    #[inline]
    pub fn record(&self, v: f64) {
        if !v.is_finite() {
            return;
        }
        // A branch-free count of the bounds below `v`: a few vector compares, where a binary
        // search is a chain of dependent loads (measured: the larger part of a record).
        let i: usize = self.bounds.iter().map(|b| usize::from(*b < v)).sum();
        self.buckets[i].add(1);
        self.sum.set((f64::from_bits(self.sum.get()) + v).to_bits());
        if v < f64::from_bits(self.min.get()) {
            self.min.set(v.to_bits());
        }
        if v > f64::from_bits(self.max.get()) {
            self.max.set(v.to_bits());
        }
    }

    fn totals(&self) -> HistTotals {
        HistTotals {
            bounds: self.bounds,
            counts: self.buckets.iter().map(Cell::get).collect(),
            sum: f64::from_bits(self.sum.get()),
            min: f64::from_bits(self.min.get()),
            max: f64::from_bits(self.max.get()),
        }
    }
}

/// A histogram's values summed over shards.
#[derive(Debug, Clone, PartialEq)]
pub struct HistTotals {
    pub bounds: &'static [f64],
    /// One more than `bounds`: the last counts values above every bound.
    pub counts: Vec<u64>,
    pub sum: f64,
    /// `+inf` while empty.
    pub min: f64,
    /// `-inf` while empty.
    pub max: f64,
}

impl HistTotals {
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    fn merge(&mut self, other: &HistTotals) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.sum += other.sum;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }
}

/// The shape of one kind of series: how many counters, which histograms.
#[derive(Debug)]
pub struct Layout {
    pub counters: usize,
    pub histograms: &'static [&'static [f64]],
}

/// Which series: a tenant's requests in a pool (per pod when pods are an attribute), or a
/// pool's routing decisions (`tenant` unused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeriesKey {
    pub kind: u8,
    pub tenant: u32,
    pub pool: u16,
    pub pod: Option<u16>,
}

/// The names a series is labelled with beyond its key's pool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Labels {
    pub tenant: Option<Arc<str>>,
    pub pod: Option<Arc<str>>,
}

/// One series' cells in one shard.
#[derive(Debug)]
pub struct Cells {
    key: SeriesKey,
    labels: Labels,
    pub counters: Box<[Cell]>,
    pub histograms: Box<[Hist]>,
}

impl Cells {
    fn new(key: SeriesKey, labels: Labels, layout: &Layout) -> Self {
        Self {
            key,
            labels,
            counters: (0..layout.counters).map(|_| Cell::default()).collect(),
            histograms: layout.histograms.iter().map(|b| Hist::new(b)).collect(),
        }
    }

    fn totals(&self) -> SeriesTotals {
        SeriesTotals {
            labels: self.labels.clone(),
            counters: self.counters.iter().map(Cell::get).collect(),
            histograms: self.histograms.iter().map(Hist::totals).collect(),
        }
    }
}

/// A series' values summed over shards.
#[derive(Debug, Clone, PartialEq)]
pub struct SeriesTotals {
    pub labels: Labels,
    pub counters: Vec<u64>,
    pub histograms: Vec<HistTotals>,
}

impl SeriesTotals {
    fn merge(&mut self, other: &SeriesTotals) {
        for (a, b) in self.counters.iter_mut().zip(&other.counters) {
            *a += b;
        }
        for (a, b) in self.histograms.iter_mut().zip(&other.histograms) {
            a.merge(b);
        }
    }
}

/// Every series, summed, in key order.
pub type Totals = BTreeMap<SeriesKey, SeriesTotals>;

fn add_to(totals: &mut Totals, key: SeriesKey, series: SeriesTotals) {
    match totals.get_mut(&key) {
        Some(t) => t.merge(&series),
        None => {
            totals.insert(key, series);
        }
    }
}

/// One thread's cells, as collectors see them.
#[derive(Debug, Default)]
struct Shard {
    series: Mutex<Vec<Arc<Cells>>>,
    /// Its thread has ended: fold it into the retired totals.
    ended: AtomicBool,
    /// Its registry is gone: the thread may forget it.
    orphaned: AtomicBool,
}

/// A thread's private index into its shard (the request path's only lookup).
#[derive(Debug, Default)]
struct Local {
    shard: Arc<Shard>,
    index: HashMap<SeriesKey, Arc<Cells>, foldhash::fast::RandomState>,
}

impl Local {
    fn cells(
        &mut self,
        key: SeriesKey,
        layout: &Layout,
        labels: impl FnOnce() -> Labels,
    ) -> &Cells {
        self.index.entry(key).or_insert_with(|| {
            let cells = Arc::new(Cells::new(key, labels(), layout));
            self.shard.series.lock().push(cells.clone());
            cells
        })
    }
}

/// A thread's local cells for one registry; its shard is retired when the thread ends.
#[derive(Debug)]
struct Writer {
    registry: u64,
    local: Local,
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.local.shard.ended.store(true, Ordering::Release);
    }
}

thread_local! {
    static WRITERS: RefCell<Vec<Writer>> = const { RefCell::new(Vec::new()) };
}

/// Registry ids, so a thread tells the registries it writes to apart.
static NEXT_REGISTRY: AtomicU64 = AtomicU64::new(0);

/// All shards of one telemetry instance.
#[derive(Debug)]
pub struct Registry {
    id: u64,
    shards: Mutex<Vec<Arc<Shard>>>,
    /// Ended threads' series.
    retired: Mutex<Totals>,
    /// For records made while a thread's own storage is gone.
    fallback: Mutex<Local>,
}

impl Default for Registry {
    fn default() -> Self {
        let fallback = Local::default();
        Self {
            id: NEXT_REGISTRY.fetch_add(1, Ordering::Relaxed),
            shards: Mutex::new(vec![fallback.shard.clone()]),
            retired: Mutex::new(Totals::new()),
            fallback: Mutex::new(fallback),
        }
    }
}

impl Registry {
    /// Runs `f` on this thread's cells of the series `key`, creating them (labelled by
    /// `labels`) the first time this thread records it.
    #[inline]
    pub fn with<R>(
        &self,
        key: SeriesKey,
        layout: &Layout,
        labels: impl FnOnce() -> Labels,
        f: impl FnOnce(&Cells) -> R,
    ) -> R {
        let mut slot = Some((labels, f));
        let local = WRITERS.try_with(|writers| {
            let Ok(mut writers) = writers.try_borrow_mut() else {
                return None;
            };
            let (labels, f) = slot.take()?;
            let i = match writers.iter().position(|w| w.registry == self.id) {
                Some(i) => i,
                None => {
                    writers.retain(|w| !w.local.shard.orphaned.load(Ordering::Relaxed));
                    writers.push(self.writer());
                    writers.len() - 1
                }
            };
            Some(f(writers[i].local.cells(key, layout, labels)))
        });
        if let Ok(Some(r)) = local {
            return r;
        }
        // The thread's storage is being torn down (or re-entered): the shared shard, under
        // its lock, keeps the record.
        let (labels, f) = slot
            .take()
            .expect("the closures run at most once, above or here");
        f(self.fallback.lock().cells(key, layout, labels))
    }

    fn writer(&self) -> Writer {
        let local = Local::default();
        self.shards.lock().push(local.shard.clone());
        Writer {
            registry: self.id,
            local,
        }
    }

    /// Every series summed over live and retired shards. Ended threads' shards are folded
    /// into the retired totals here and freed.
    pub fn totals(&self) -> Totals {
        let mut shards = self.shards.lock();
        let mut retired = self.retired.lock();
        shards.retain(|shard| {
            if !shard.ended.load(Ordering::Acquire) {
                return true;
            }
            for cells in shard.series.lock().iter() {
                add_to(&mut retired, cells.key, cells.totals());
            }
            false
        });
        let mut totals = retired.clone();
        drop(retired);
        for shard in shards.iter() {
            for cells in shard.series.lock().iter() {
                add_to(&mut totals, cells.key, cells.totals());
            }
        }
        totals
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        for shard in self.shards.lock().iter() {
            shard.orphaned.store(true, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: &[f64] = &[1.0, 2.0, 5.0];
    const LAYOUT: Layout = Layout {
        counters: 2,
        histograms: &[BOUNDS],
    };

    fn key(tenant: u32) -> SeriesKey {
        SeriesKey {
            kind: 0,
            tenant,
            pool: 0,
            pod: None,
        }
    }

    fn record(r: &Registry, tenant: u32, v: f64) {
        r.with(
            key(tenant),
            &LAYOUT,
            || Labels {
                tenant: Some(Arc::from(format!("t{tenant}"))),
                pod: None,
            },
            |c| {
                c.counters[0].add(1);
                c.counters[1].add(10);
                c.histograms[0].record(v);
            },
        );
    }

    #[test]
    fn buckets_follow_the_upper_inclusive_rule() {
        let h = Hist::new(BOUNDS);
        for v in [0.5, 1.0, 1.5, 5.0, 9.0, f64::NAN, f64::INFINITY] {
            h.record(v);
        }
        let t = h.totals();
        assert_eq!(t.counts, vec![2, 1, 1, 1]);
        assert_eq!(t.count(), 5);
        assert_eq!(t.sum, 17.0);
        assert_eq!((t.min, t.max), (0.5, 9.0));
    }

    #[test]
    fn threads_sum_and_ended_threads_are_kept() {
        let r = Arc::new(Registry::default());
        record(&r, 1, 0.5);
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let r = r.clone();
                std::thread::spawn(move || {
                    for _ in 0..100 {
                        record(&r, 1, 3.0);
                    }
                    record(&r, 2, f64::from(i));
                })
            })
            .collect();
        // A join returns once the thread is gone, its thread-local storage included.
        for t in threads {
            t.join().expect("a recording thread");
        }
        let totals = r.totals();
        // The four threads ended; their shards are folded and freed, the counts stay.
        assert_eq!(
            r.shards.lock().len(),
            2,
            "the fallback shard and this thread's"
        );
        let one = &totals[&key(1)];
        assert_eq!(one.counters, vec![401, 4010]);
        assert_eq!(one.histograms[0].counts, vec![1, 0, 400, 0]);
        assert_eq!(one.histograms[0].sum, 1200.5);
        assert_eq!(one.labels.tenant.as_deref(), Some("t1"));
        let two = &totals[&key(2)];
        assert_eq!(two.histograms[0].counts, vec![2, 1, 1, 0]);
        assert_eq!((two.histograms[0].min, two.histograms[0].max), (0.0, 3.0));
        // Reading again changes nothing.
        assert_eq!(r.totals(), totals);
    }

    #[test]
    fn a_thread_forgets_registries_that_are_gone() {
        for _ in 0..10 {
            let r = Registry::default();
            record(&r, 1, 1.0);
            assert_eq!(r.totals()[&key(1)].counters[0], 1);
        }
        let live = WRITERS.with_borrow(|w| w.len());
        assert_eq!(live, 1, "only the last registry's writer is still held");
    }
}
