//! Each pod's TTFT model, calibrated online from what the proxy observes, and how far its
//! predictions were off: a pool's per-pod fits ([`crate::routing::cost::Fit`], keyed by the
//! endpoint's serial) and a window of recent absolute errors (its median on `/status`).
//!
//! A decision notes its chosen pod's features and prediction ([`Prediction`], carried by the
//! request's bookkeeping); when a stream's first token arrives, the measured TTFT — from the
//! upstream request to the first body bytes, so the proxy's own admission queue is not the
//! pod's — is fitted and its error recorded. Only streams count: a non-streamed body's first
//! byte comes after the whole answer, not after prefill.
//!
//! Bounded: at most [`MAX_PODS`] fits (the least recently observed — a pod that left, whose
//! fit no stream refreshes — is dropped for a new pod when full)
//! and [`ERROR_WINDOW`] errors.

use std::{collections::HashMap, sync::Arc};

use parking_lot::{Mutex, RwLock};

use crate::routing::{
    BAND_START, SURVIVAL_BANDS, Survival,
    cost::{Features, Fit, Timing},
};

/// Pods with a fit per pool.
pub const MAX_PODS: usize = 1024;
/// Recent absolute errors kept for the median.
pub const ERROR_WINDOW: usize = 512;

/// One pool's calibration.
#[derive(Debug, Default)]
pub struct Calibration {
    /// Each pod's fit and the tick of its last observation.
    fits: RwLock<HashMap<u16, (Fit, u64)>>,
    /// Observations so far (the clock of the ticks).
    ticks: std::sync::atomic::AtomicU64,
    errors: Mutex<Errors>,
    /// How much of the prefix chosen pods held at decision their engines still had at
    /// prefill ([`Delivery`]).
    delivery: Mutex<Delivery>,
    /// [`Delivery::by_wait`] as of the last note, one band each, as f64 bits (0: none yet,
    /// which reads as 1): read by every decision without the lock.
    survival_bits: [std::sync::atomic::AtomicU64; SURVIVAL_BANDS],
    /// Decayed means of answered requests' output tokens and of their time in flight,
    /// seconds, as f64 bits (0: none yet): how many KV blocks a request holds beyond its
    /// prompt, and how long it holds them ([`crate::routing::KvRoom`]).
    output_bits: std::sync::atomic::AtomicU64,
    lifetime_bits: std::sync::atomic::AtomicU64,
}

/// Answers the output and lifetime means remember (weight 1/N per answer).
pub const OCCUPANCY_MEMORY: f64 = 64.0;
/// Before the first answer: a short chat answer's output, tokens.
pub const OUTPUT_PRIOR_TOKENS: f64 = 128.0;
/// Before the first answer: how long a request holds its KV, seconds.
pub const LIFETIME_PRIOR_SECS: f64 = 1.0;
/// An answer's output tokens and lifetime are counted at most this much (a bogus usage
/// figure moves the means a bounded step and keeps block sums far from overflow).
pub const MAX_OUTPUT_TOKENS: u64 = 1 << 20;
pub const MAX_LIFETIME_SECS: f64 = 3600.0;

/// Folds `x` into the decayed mean stored as f64 bits in `bits` (0: the first value).
/// Racing writers may lose one another's update: a mean, not a count.
fn fold_mean(bits: &std::sync::atomic::AtomicU64, x: f64) {
    use std::sync::atomic::Ordering::Relaxed;
    if !(x.is_finite() && x >= 0.0) {
        return;
    }
    let new = match bits.load(Relaxed) {
        0 => x,
        b => {
            let old = f64::from_bits(b);
            old + (x - old) / OCCUPANCY_MEMORY
        }
    };
    // 0.0's bits are 0 ("none yet"): the smallest positive value stands in.
    bits.store(new.max(f64::MIN_POSITIVE).to_bits(), Relaxed);
}

fn read_mean(bits: &std::sync::atomic::AtomicU64, prior: f64) -> f64 {
    match bits.load(std::sync::atomic::Ordering::Relaxed) {
        0 => prior,
        b => f64::from_bits(b),
    }
}

/// Decayed sums of route receipts' captured tokens and of what of them was delivered (the
/// engine's `cached_tokens`, at most the captured), per band of the TTFT predicted at
/// decision: their ratio is the share of a prefix a pod holds at decision that survives to
/// its prefill. Blocks a pod holds can be evicted while the request waits in its queue;
/// when its KV cache is too small for what runs there, most are in a long wait and few in a
/// short one, and the index's prefix is then worth that much less there
/// ([`crate::routing::Survival`]).
///
/// ```text
/// pool    = (sum delivered + PRIOR) / (sum captured + PRIOR)
/// band(i) = (delivered(i) + PRIOR x pool) / (captured(i) + PRIOR)
/// ```
///
/// then made non-increasing in the wait (pool-adjacent violators, each band weighted by
/// `captured(i) + PRIOR`): a band with few answers leans on the pool's figure, and a longer
/// wait never reads as safer than a shorter one.
#[derive(Debug, Default)]
struct Delivery {
    captured: [f64; SURVIVAL_BANDS],
    delivered: [f64; SURVIVAL_BANDS],
    observed: u64,
}

/// Requests with a captured prefix the survival estimate remembers (exponential forgetting).
pub const DELIVERY_MEMORY: f64 = 256.0;
/// Tokens of full survival the estimate starts from: before the first few answers, and for
/// engines that do not report `cached_tokens`, the index is taken at its word.
pub const DELIVERY_PRIOR_TOKENS: f64 = 4096.0;

#[derive(Debug, Default)]
struct Errors {
    ring: Vec<f64>,
    next: usize,
    count: u64,
}

/// What a decision predicted for its chosen pod, to be checked when the request ends.
#[derive(Debug, Clone)]
pub struct Prediction {
    pub calibration: Arc<Calibration>,
    /// The pod's endpoint serial.
    pub serial: u16,
    pub features: Features,
    /// Seconds.
    pub predicted: f64,
    /// The pool's block size in tokens (what an engine can serve of a prompt from cache
    /// comes in whole blocks).
    pub block_size: u64,
    /// The part of `predicted` that is the wait for KV room ([`crate::routing::KvRoom`]):
    /// not the fit's to learn, so an answer predicted to wait is not fitted.
    pub kv_wait: f64,
    /// When the answered attempt was sent (the start of the KV it held).
    pub sent: std::time::Instant,
}

/// The calibration's figures for `/status`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CalibrationStatus {
    /// Median |predicted - measured| TTFT over the last [`ERROR_WINDOW`] streams, ms.
    pub median_abs_error_ms: Option<f64>,
    /// Streams checked since start.
    pub checked: u64,
    /// The share of the prefix a chosen pod held at decision that its engine still had at
    /// prefill (recent answers, every wait; 1 before any) (docs/routing.md, "Prefix
    /// survival").
    pub prefix_survival: f64,
    /// The same by the TTFT predicted at decision: the weight the prefix presets give a
    /// held prefix at that wait.
    pub prefix_survival_by_wait: Vec<SurvivalBand>,
    /// Answers with a captured prefix and a reported `cached_tokens` noted so far.
    pub survival_observations: u64,
}

/// One band of predicted TTFT and the survival learnt in it, for `/status`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SurvivalBand {
    /// The band's upper edge, ms (none: the last, open band).
    pub below_ms: Option<f64>,
    pub survival: f64,
    /// Captured tokens the band's figure rests on (decayed).
    pub captured_tokens: f64,
}

/// The upper edge of band `i`, seconds (none for the last).
pub fn band_edge(i: usize) -> Option<f64> {
    (i + 1 < SURVIVAL_BANDS).then(|| BAND_START * f64::from(1u32 << i))
}

/// One pod's fitted coefficients for `/status`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PodTiming {
    pub prefill_tokens_per_s: f64,
    pub ms_per_running: f64,
    pub base_ms: f64,
    pub observations: u64,
}

// === impl Calibration ===

impl Calibration {
    /// The pod's coefficients (the prior before its first observation).
    pub fn timing(&self, serial: u16) -> Timing {
        self.fits
            .read()
            .get(&serial)
            .map_or(Timing::PRIOR, |(f, _)| f.timing())
    }

    pub fn pod_status(&self, serial: u16) -> PodTiming {
        let fits = self.fits.read();
        let fit = fits
            .get(&serial)
            .map(|(f, _)| f.clone())
            .unwrap_or_default();
        let t = fit.timing();
        PodTiming {
            prefill_tokens_per_s: 1.0 / t.secs_per_token,
            ms_per_running: t.secs_per_running * 1000.0,
            base_ms: t.base * 1000.0,
            observations: fit.observations(),
        }
    }

    /// A stream's measured TTFT against its decision's prediction: fits the pod and records
    /// the error. Returns the absolute error, seconds.
    pub fn check(&self, p: &Prediction, measured: f64) -> f64 {
        {
            let tick = self
                .ticks
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mut fits = self.fits.write();
            if !fits.contains_key(&p.serial) && fits.len() >= MAX_PODS {
                let stalest = fits
                    .iter()
                    .min_by_key(|(_, (_, last))| *last)
                    .map(|(s, _)| *s);
                if let Some(s) = stalest {
                    fits.remove(&s);
                }
            }
            let (fit, last) = fits.entry(p.serial).or_default();
            // An answer whose decision predicted a wait for KV room does not teach the fit:
            // its TTFT mixes that wait, which nothing measures, with the prefill and batch
            // terms the fit is of. Taking the predicted wait off biases the fit down where
            // the wait was over-predicted (to nothing, when the wait exceeds the TTFT), and
            // taking off only what exceeds the no-wait prediction biases it up.
            if p.kv_wait <= 0.0 || !p.kv_wait.is_finite() {
                fit.observe(p.features, measured);
            }
            *last = tick;
        }
        let error = (p.predicted - measured).abs();
        let mut e = self.errors.lock();
        if e.ring.len() < ERROR_WINDOW {
            e.ring.push(error);
        } else {
            let i = e.next;
            e.ring[i] = error;
        }
        e.next = (e.next + 1) % ERROR_WINDOW;
        e.count += 1;
        error
    }

    /// Drops a pod's fit (it left the pool).
    pub fn forget(&self, serial: u16) {
        self.fits.write().remove(&serial);
    }

    pub fn status(&self) -> CalibrationStatus {
        let e = self.errors.lock();
        let mut sorted = e.ring.clone();
        sorted.sort_by(f64::total_cmp);
        let median = match sorted.len() {
            0 => None,
            n if n % 2 == 1 => Some(sorted[n / 2]),
            n => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
        };
        let (prefix_survival, prefix_survival_by_wait, survival_observations) =
            self.survival_figures();
        CalibrationStatus {
            median_abs_error_ms: median.map(|m| m * 1000.0),
            checked: e.count,
            prefix_survival,
            prefix_survival_by_wait,
            survival_observations,
        }
    }

    /// The pool's survival over every wait, each band's, and the answers noted so far
    /// (only the delivery sums' lock: `/metrics` reads these without the error window).
    pub fn survival_figures(&self) -> (f64, Vec<SurvivalBand>, u64) {
        let d = self.delivery.lock();
        let by_wait = d.by_wait().bands();
        let bands = (0..SURVIVAL_BANDS)
            .map(|i| SurvivalBand {
                below_ms: band_edge(i).map(|s| s * 1000.0),
                survival: by_wait[i],
                captured_tokens: d.captured[i],
            })
            .collect();
        (d.overall(), bands, d.observed)
    }

    /// A request's route receipt settled: its pod held `captured` prompt tokens of its
    /// prefix at decision, where its TTFT was predicted at `predicted` seconds, and the
    /// engine served `delivered` from its cache. Only answers whose engine reported
    /// `cached_tokens` may be noted (without it there is no measure).
    pub fn note_delivery(&self, captured: u64, delivered: u64, predicted: f64) {
        let mut d = self.delivery.lock();
        if d.note(captured, delivered, predicted) {
            for (bits, share) in self.survival_bits.iter().zip(d.by_wait().bands()) {
                // 0.0's bits are 0 ("none yet"): the smallest positive value stands in.
                bits.store(
                    share.max(f64::MIN_POSITIVE).to_bits(),
                    std::sync::atomic::Ordering::Relaxed,
                );
            }
        }
    }

    /// A request answered: `output` tokens generated over `lifetime` seconds in flight.
    pub fn note_answer(&self, output: u64, lifetime: f64) {
        fold_mean(&self.output_bits, output.min(MAX_OUTPUT_TOKENS) as f64);
        // Not `min` on a NaN (which would make it the cap): fold_mean refuses it.
        if lifetime.is_finite() {
            fold_mean(&self.lifetime_bits, lifetime.min(MAX_LIFETIME_SECS));
        }
    }

    /// Mean output tokens per answered request (a prior before the first).
    pub fn output_tokens(&self) -> f64 {
        read_mean(&self.output_bits, OUTPUT_PRIOR_TOKENS)
    }

    /// The KV blocks a request's output is expected to take at `block_size` tokens a block.
    pub fn output_blocks(&self, block_size: usize) -> u64 {
        (self.output_tokens() / block_size.max(1) as f64).ceil() as u64
    }

    /// Mean seconds an answered request was in flight (a prior before the first).
    pub fn lifetime(&self) -> f64 {
        read_mean(&self.lifetime_bits, LIFETIME_PRIOR_SECS)
    }

    /// The share of a held prefix that reaches prefill, by predicted TTFT ([`Delivery`]).
    pub fn survival(&self) -> Survival {
        Survival::by_wait(self.survival_bits.each_ref().map(|bits| {
            match bits.load(std::sync::atomic::Ordering::Relaxed) {
                0 => 1.0,
                b => f64::from_bits(b),
            }
        }))
    }
}

impl Delivery {
    /// Notes one answer; false when it teaches nothing (nothing was captured).
    fn note(&mut self, captured: u64, delivered: u64, predicted: f64) -> bool {
        if captured == 0 {
            // Nothing was held: nothing to survive. (More delivered than captured — the
            // index missed blocks — is not evidence about what it saw.)
            return false;
        }
        // Every band forgets at the pace of the pool's answers, so a band no decision
        // predicts any more fades back to the pool's figure.
        let keep = 1.0 - 1.0 / DELIVERY_MEMORY;
        for (c, d) in self.captured.iter_mut().zip(&mut self.delivered) {
            *c *= keep;
            *d *= keep;
        }
        let band = Survival::band(predicted);
        self.captured[band] += captured as f64;
        self.delivered[band] += delivered.min(captured) as f64;
        self.observed += 1;
        true
    }

    /// Every wait's answers together.
    fn overall(&self) -> f64 {
        let delivered: f64 = self.delivered.iter().sum();
        let captured: f64 = self.captured.iter().sum();
        ((delivered + DELIVERY_PRIOR_TOKENS) / (captured + DELIVERY_PRIOR_TOKENS)).clamp(0.0, 1.0)
    }

    /// Each band's figure, leaning on the pool's by the prior, made non-increasing.
    fn by_wait(&self) -> Survival {
        let pool = self.overall();
        // Pool-adjacent violators: blocks of (weighted mean, weight, bands).
        let mut blocks: Vec<(f64, f64, usize)> = Vec::with_capacity(SURVIVAL_BANDS);
        for i in 0..SURVIVAL_BANDS {
            let weight = self.captured[i] + DELIVERY_PRIOR_TOKENS;
            let mut block = (
                (self.delivered[i] + DELIVERY_PRIOR_TOKENS * pool) / weight,
                weight,
                1,
            );
            while let Some(&(mean, w, n)) = blocks.last() {
                if mean >= block.0 {
                    break;
                }
                // A longer wait surviving better than a shorter one: pool the two.
                blocks.pop();
                block = (
                    (mean * w + block.0 * block.1) / (w + block.1),
                    w + block.1,
                    n + block.2,
                );
            }
            blocks.push(block);
        }
        let mut shares = [1.0; SURVIVAL_BANDS];
        let mut i = 0;
        for (mean, _, n) in blocks {
            for share in &mut shares[i..i + n] {
                *share = mean;
            }
            i += n;
        }
        Survival::by_wait(shares)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prediction(c: &Arc<Calibration>, serial: u16, predicted: f64) -> Prediction {
        Prediction {
            calibration: c.clone(),
            serial,
            features: Features {
                work_tokens: 1000.0,
                running: 0.0,
            },
            predicted,
            block_size: 16,
            kv_wait: 0.0,
            sent: std::time::Instant::now(),
        }
    }

    #[test]
    fn errors_give_a_median_and_each_pod_is_fitted_apart() {
        let c = Arc::new(Calibration::default());
        assert_eq!(c.status().median_abs_error_ms, None);
        // Errors of 10, 20 and 40 ms: the median is 20 ms.
        for (predicted, measured) in [(0.11, 0.1), (0.08, 0.1), (0.14, 0.1)] {
            let e = c.check(&prediction(&c, 0, predicted), measured);
            assert!((e - (predicted - measured).abs()).abs() < 1e-12);
        }
        let s = c.status();
        assert!(
            (s.median_abs_error_ms.unwrap() - 20.0).abs() < 1e-9,
            "{s:?}"
        );
        assert_eq!(s.checked, 3);
        // Pod 0 answered 1,000 tokens in 100 ms three times (the prior says 120 ms); pod 1
        // was never observed.
        assert!(c.timing(0).predict(1000.0, 0.0) < 0.12);
        assert_eq!(c.timing(1), Timing::PRIOR);
        c.forget(0);
        assert_eq!(c.timing(0), Timing::PRIOR);
    }

    #[test]
    fn answers_predicted_to_wait_for_kv_room_do_not_teach_the_fit_and_bogus_usage_is_bounded() {
        // Two pools see the same pod and the same answers (50-90 ms); one's decisions each
        // predicted a wait for KV room, the first wrongly (1.9 s that never came), the rest
        // rightly (the answers 100 ms later). Neither kind moves that pool's fit from the
        // prior, and every answer's error is still recorded.
        let (plain, waited) = (
            Arc::new(Calibration::default()),
            Arc::new(Calibration::default()),
        );
        for i in 0..50 {
            let measured = 0.05 + f64::from(i % 5) * 0.01;
            plain.check(&prediction(&plain, 1, 0.1), measured);
            let (wait, late) = if i % 2 == 0 { (1.9, 0.0) } else { (0.1, 0.1) };
            let p = Prediction {
                kv_wait: wait,
                ..prediction(&waited, 1, 0.1 + wait)
            };
            waited.check(&p, measured + late);
        }
        assert_ne!(
            plain.timing(1),
            Timing::PRIOR,
            "the plain pool's answers taught it"
        );
        assert_eq!(waited.timing(1), Timing::PRIOR);
        assert_eq!(waited.pod_status(1).observations, 0);
        assert_eq!(waited.status().checked, 50);
        // An answer claiming 2^60 output tokens counts as 2^20.
        let c = Calibration::default();
        c.note_answer(1 << 60, 1e12);
        assert_eq!(c.output_tokens(), MAX_OUTPUT_TOKENS as f64);
        assert_eq!(c.lifetime(), MAX_LIFETIME_SECS);
        assert_eq!(c.output_blocks(16), 1 << 16);
    }

    #[test]
    fn output_and_lifetime_means_start_from_priors_and_follow_answers() {
        let c = Calibration::default();
        assert_eq!(c.output_tokens(), OUTPUT_PRIOR_TOKENS);
        assert_eq!(c.lifetime(), LIFETIME_PRIOR_SECS);
        // The first answer replaces the prior; later ones move the mean by 1/64 of the gap.
        c.note_answer(64, 0.5);
        assert_eq!((c.output_tokens(), c.lifetime()), (64.0, 0.5));
        c.note_answer(128, 1.5);
        assert!((c.output_tokens() - (64.0 + 64.0 / 64.0)).abs() < 1e-12);
        assert!((c.lifetime() - (0.5 + 1.0 / 64.0)).abs() < 1e-12);
        // Nonsense is ignored; an answer of no output is a mean of ~0, not "none yet".
        c.note_answer(0, f64::NAN);
        assert!((c.lifetime() - (0.5 + 1.0 / 64.0)).abs() < 1e-12);
        let z = Calibration::default();
        z.note_answer(0, 0.0);
        assert!(z.output_tokens() < 1e-300 && z.lifetime() < 1e-300);
    }

    #[test]
    fn survival_is_what_engines_delivered_of_what_was_captured() {
        let c = Calibration::default();
        assert_eq!(
            c.survival(),
            Survival::new(1.0),
            "the index at its word before any answer"
        );
        // Nothing captured: nothing learnt, even with cached tokens the index did not see.
        c.note_delivery(0, 512, 0.01);
        assert_eq!(c.status().survival_observations, 0);
        // 1,000 answers each delivering 160 of 1,024 captured tokens: after 1,000 the
        // decayed sums are each (1 - (255/256)^1000) x 256 x per-answer, so the ratio tends
        // to 160 / 1024 = 0.156, lifted only by the 4,096-token prior:
        // (0.98 x 256 x 160 + 4096) / (0.98 x 256 x 1024 + 4096).
        for _ in 0..1000 {
            c.note_delivery(1024, 160, 0.01);
        }
        let keep: f64 = 1.0 - 1.0 / 256.0;
        let mass = (1.0 - keep.powi(1000)) * 256.0;
        let want = (mass * 160.0 + 4096.0) / (mass * 1024.0 + 4096.0);
        let got = c.status().prefix_survival;
        assert!((got - want).abs() < 1e-9, "{got} vs {want}");
        assert!((0.16..0.18).contains(&got), "{got}");
        assert_eq!(c.status().survival_observations, 1000);
        // Delivered beyond what was captured counts as the captured: full survival, at
        // every wait.
        for _ in 0..5000 {
            c.note_delivery(1024, 4096, 0.01);
        }
        assert!(c.status().prefix_survival > 0.999);
        assert!(c.survival().bands().iter().all(|&s| s > 0.999));
    }

    #[test]
    fn survival_is_learnt_by_predicted_wait_and_never_rises_with_it() {
        let c = Calibration::default();
        // One answer predicted at 10 ms (band 0, under 25 ms) delivered all 1,024 tokens it
        // captured; the next, predicted at 300 ms (band 4, 200-400 ms), delivered none.
        c.note_delivery(1024, 1024, 0.010);
        c.note_delivery(1024, 0, 0.300);
        // The first answer's sums were kept 255/256 at the second: 1,020 tokens.
        let pool = (1020.0 + 4096.0) / (1020.0 + 1024.0 + 4096.0);
        let band0 = (1020.0 + 4096.0 * pool) / (1020.0 + 4096.0);
        let band4 = 4096.0 * pool / (1024.0 + 4096.0);
        // Bands 1-3 saw nothing: the pool's figure, under band 0's and over band 4's. Bands
        // 5-7 saw nothing either, but a longer wait cannot read as safer than 200-400 ms:
        // they are pooled with band 4, each weighted by its tokens and the prior.
        let tail = (band4 * 5120.0 + pool * 3.0 * 4096.0) / (5120.0 + 3.0 * 4096.0);
        let want = [band0, pool, pool, pool, tail, tail, tail, tail];
        assert!(band0 > pool && pool > tail && tail > band4);
        let s = c.status();
        assert!((s.prefix_survival - pool).abs() < 1e-12);
        for ((band, w), read) in s
            .prefix_survival_by_wait
            .iter()
            .zip(want)
            .zip(c.survival().bands())
        {
            assert!((band.survival - w).abs() < 1e-12, "{s:?}");
            assert!((read - w).abs() < 1e-12, "decisions read what status shows");
        }
        assert_eq!(s.prefix_survival_by_wait[0].below_ms, Some(25.0));
        assert_eq!(s.prefix_survival_by_wait[4].below_ms, Some(400.0));
        assert_eq!(s.prefix_survival_by_wait[7].below_ms, None);
        assert_eq!(s.prefix_survival_by_wait[4].captured_tokens, 1024.0);
        assert_eq!(s.prefix_survival_by_wait[0].captured_tokens, 1020.0);
        // A nonsense prediction is learnt in the first band, not dropped or out of bounds.
        c.note_delivery(1024, 1024, f64::NAN);
        c.note_delivery(1024, 1024, f64::INFINITY);
        assert_eq!(c.status().survival_observations, 4);
    }

    #[test]
    fn memory_is_bounded() {
        let c = Arc::new(Calibration::default());
        for serial in 0..3000 {
            c.check(&prediction(&c, serial, 0.1), 0.1);
        }
        assert!(c.fits.read().len() <= MAX_PODS);
        assert_eq!(c.errors.lock().ring.len(), ERROR_WINDOW);
    }

    #[test]
    fn a_full_table_drops_the_least_recently_observed_pod() {
        let c = Arc::new(Calibration::default());
        // Pod 0 observed many times first, then pods 1..MAX_PODS once each: pod 0 is the
        // stalest, though the most observed.
        for _ in 0..50 {
            c.check(&prediction(&c, 0, 0.1), 0.1);
        }
        for serial in 1..MAX_PODS as u16 {
            c.check(&prediction(&c, serial, 0.1), 0.1);
        }
        assert_eq!(c.fits.read().len(), MAX_PODS);
        // A new pod takes pod 0's place; then another takes pod 1's, not the new one's.
        let new = MAX_PODS as u16;
        c.check(&prediction(&c, new, 0.1), 0.1);
        c.check(&prediction(&c, new + 1, 0.1), 0.1);
        let fits = c.fits.read();
        assert!(!fits.contains_key(&0) && !fits.contains_key(&1));
        assert!(fits.contains_key(&new) && fits.contains_key(&(new + 1)));
        assert_eq!(fits.len(), MAX_PODS);
    }
}
