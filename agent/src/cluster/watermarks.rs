//! How often a pod's watermark fact (`wm:POD`) changes: at most once per
//! [`WATERMARK_EVERY`] while its incarnation stays, at once when the incarnation changes (a
//! restart: every replica starts over) or the pod is new. A busy engine moves its watermark
//! with every batch; gossiping each value would cost every node bytes in proportion to the
//! cluster's pods and the publish rate, for a fact nothing waits on: index state streams over
//! IndexSync as soon as the owner applies it, and a replica checks its own order on the
//! stream. The fact tells an operator (and a peer's view) how far the owner has come, to
//! within this period.

use std::{collections::HashMap, time::Duration};

use super::facts::Fact;
use crate::kv_index::Watermark;

/// The most often one pod's watermark is republished within an incarnation: two seconds,
/// four production gossip rounds (500 ms), so a moving watermark costs a quarter of a fact
/// per round.
pub const WATERMARK_EVERY: Duration = Duration::from_secs(2);

/// The watermarks last published, per pod, and when.
#[derive(Debug, Default)]
pub(super) struct Pacer {
    last: HashMap<String, (Watermark, tokio::time::Instant)>,
}

impl Pacer {
    /// Rewrites the watermark facts in `facts` (what is about to be published) to what may be
    /// published at `now`: a new pod's or a new incarnation's at once, a moved sequence once
    /// [`WATERMARK_EVERY`] has passed since the last one published, else the last published
    /// value (which changes nothing). Pods without a watermark fact are forgotten.
    pub(super) fn pace(&mut self, facts: &mut [Fact], now: tokio::time::Instant) {
        let mut seen = HashMap::with_capacity(self.last.len());
        for fact in facts.iter_mut() {
            let Fact::Watermark { pod, at } = fact else {
                continue;
            };
            let due = match self.last.get(pod.as_str()) {
                None => true,
                Some((last, when)) => {
                    last.incarnation != at.incarnation
                        || (last.sequence != at.sequence && now >= *when + WATERMARK_EVERY)
                }
            };
            let published = if due {
                (*at, now)
            } else {
                self.last[pod.as_str()]
            };
            *at = published.0;
            seen.insert(pod.clone(), published);
        }
        self.last = seen;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wm(pod: &str, incarnation: u64, sequence: u64) -> Fact {
        Fact::Watermark {
            pod: pod.into(),
            at: Watermark {
                incarnation,
                sequence,
            },
        }
    }

    fn paced(p: &mut Pacer, facts: &[Fact], now: tokio::time::Instant) -> Vec<Fact> {
        let mut facts = facts.to_vec();
        p.pace(&mut facts, now);
        facts
    }

    #[test]
    fn a_moving_watermark_is_published_once_per_period_and_a_new_incarnation_at_once() {
        let t0 = tokio::time::Instant::now();
        let ms = Duration::from_millis;
        let mut p = Pacer::default();
        // New pods: at once.
        assert_eq!(
            paced(&mut p, &[wm("a", 1, 5), wm("b", 7, 0)], t0),
            [wm("a", 1, 5), wm("b", 7, 0)]
        );
        // Moved within the period: the last published value stays.
        assert_eq!(
            paced(&mut p, &[wm("a", 1, 9), wm("b", 7, 3)], t0 + ms(100)),
            [wm("a", 1, 5), wm("b", 7, 0)]
        );
        // A restart (new incarnation) is not held back.
        assert_eq!(
            paced(&mut p, &[wm("a", 2, 0), wm("b", 7, 4)], t0 + ms(200)),
            [wm("a", 2, 0), wm("b", 7, 0)]
        );
        // The period since b's last publication has passed: its newest value goes out, and
        // the clock for it starts again.
        let later = t0 + WATERMARK_EVERY;
        assert_eq!(
            paced(&mut p, &[wm("a", 2, 3), wm("b", 7, 8)], later),
            [wm("a", 2, 0), wm("b", 7, 8)]
        );
        assert_eq!(
            paced(&mut p, &[wm("a", 2, 4), wm("b", 7, 9)], later + ms(1)),
            [wm("a", 2, 0), wm("b", 7, 8)]
        );
        assert_eq!(
            paced(&mut p, &[wm("a", 2, 4)], t0 + ms(200) + WATERMARK_EVERY),
            [wm("a", 2, 4)]
        );
        // b left the facts (no longer local): forgotten, so it is new again on return.
        assert_eq!(
            paced(&mut p, &[wm("b", 7, 9)], t0 + ms(300) + WATERMARK_EVERY),
            [wm("b", 7, 9)]
        );
    }

    #[test]
    fn other_facts_pass_unchanged() {
        let mut p = Pacer::default();
        let facts = [Fact::Agent(super::super::facts::AgentFact {
            grpc: ([127, 0, 0, 1], 7401).into(),
            proxy: None,
        })];
        assert_eq!(paced(&mut p, &facts, tokio::time::Instant::now()), facts);
    }
}
