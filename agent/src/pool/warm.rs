//! A pool's warm share ([`WarmShare`]): how many of its recent keyed requests were warm at
//! their pick, read by the cold-yield rule ([`crate::routing::cold_yield`]) and the stall
//! charge ([`crate::routing::StallShare`]).

/// A pool's warm share: the mean of its recent keyed requests' "warm at the pick" (1) or not
/// (0), over about the last [`WARM_SHARE_MEMORY`]. Until that many were seen it is the plain
/// mean of all of them, so a fresh agent's share is its traffic's from the first requests,
/// not biased toward 0 by an empty start (measured: four agents of a fleet, each a quarter of
/// chat's traffic, stayed below [`crate::routing::cold_yield::MIN_WARM_SHARE`] for a whole
/// run of 30 requests each and never yielded, where the central agent did).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WarmShare {
    /// The share x 2^31 (fixed point: 0 to 2^31).
    share: u32,
    /// Requests seen, up to [`WARM_SHARE_MEMORY`].
    seen: u32,
}

/// Requests the warm share remembers (weight 1/N per request once that many were seen).
pub const WARM_SHARE_MEMORY: u32 = 64;

impl WarmShare {
    const ONE: u64 = 1 << 31;

    /// Folds in one request.
    pub fn note(self, warm: bool) -> Self {
        let seen = (self.seen + 1).min(WARM_SHARE_MEMORY);
        let old = u64::from(self.share);
        let x = if warm { Self::ONE } else { 0 };
        // old + (x - old) / seen, in integers (x and old both at most ONE).
        let new = (old * u64::from(seen - 1) + x) / u64::from(seen);
        Self {
            share: new.min(Self::ONE) as u32,
            seen,
        }
    }

    pub fn share(self) -> f64 {
        self.share as f64 / Self::ONE as f64
    }

    /// Requests seen, up to [`WARM_SHARE_MEMORY`].
    pub(super) fn seen(self) -> u32 {
        self.seen
    }

    pub(super) fn pack(self) -> u64 {
        u64::from(self.seen) << 32 | u64::from(self.share)
    }

    pub(super) fn unpack(w: u64) -> Self {
        Self {
            share: w as u32,
            seen: (w >> 32) as u32,
        }
    }
}
