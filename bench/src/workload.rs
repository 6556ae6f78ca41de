//! Seeded workloads for `warmpath bench compare`.
//!
//! Shared-prefix groups (the shape llm-d publishes, scaled): G groups of U users; each group
//! shares a system prompt of S tokens, each request adds a question of Q tokens and asks for
//! O output tokens. Arrivals are Poisson at a given rate, in a seeded random order of users.
//! With `--skew S`, group popularity follows Zipf's law (group g's share of users is
//! proportional to 1/(g+1)^S), so a few system prompts are hot and the rest cool.

use std::time::Duration;

use rand::{Rng, SeedableRng, seq::SliceRandom};
use rand_chacha::ChaCha8Rng;
use warmpath_tokenizer::text::TextGen;

/// Average characters per token of the built-in tokenizer on generated English text.
const CHARS_PER_TOKEN: f64 = 3.85;

/// Shape of a shared-prefix workload.
#[derive(Debug, Clone, clap::Args)]
pub struct SharedPrefix {
    /// Prefix groups (distinct system prompts).
    #[arg(long, default_value_t = 16)]
    pub groups: usize,
    /// Users per group.
    #[arg(long, default_value_t = 8)]
    pub users: usize,
    /// Questions each user asks.
    #[arg(long, default_value_t = 4)]
    pub rounds: usize,
    /// System-prompt tokens shared by a group.
    #[arg(long, default_value_t = 2048)]
    pub system_tokens: usize,
    /// Question tokens per request.
    #[arg(long, default_value_t = 128)]
    pub question_tokens: usize,
    /// Output tokens per request.
    #[arg(long, default_value_t = 64)]
    pub output_tokens: usize,
    /// Poisson arrival rate, requests per modelled second (the default loads the demo fleet
    /// past what round-robin can serve, and below what prefix-aware routing can).
    #[arg(long, default_value_t = 28.0)]
    pub rate: f64,
    /// Share nothing: every request gets its own random system prompt (the control).
    #[arg(long)]
    pub no_sharing: bool,
    /// Zipf exponent of group popularity (0: every group has `users` users; 1: group g has
    /// a share of the `groups x users` users proportional to 1/(g+1), at least one).
    #[arg(long, default_value_t = 0.0)]
    pub skew: f64,
}

/// Users per group: `groups x users` users shared out in proportion to 1/(g+1)^skew (at
/// least one each; exactly `users` each when `skew` is 0).
pub fn users_per_group(groups: usize, users: usize, skew: f64) -> Vec<usize> {
    if skew <= 0.0 || groups == 0 {
        return vec![users; groups];
    }
    let weights: Vec<f64> = (0..groups).map(|g| (g as f64 + 1.0).powf(-skew)).collect();
    let total: f64 = weights.iter().sum();
    weights
        .iter()
        .map(|w| ((w / total) * (groups * users) as f64).round().max(1.0) as usize)
        .collect()
}

/// One request to send.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Planned {
    /// When to send it, from the start (modelled time).
    pub at: Duration,
    /// Who sends it (group x users + user): a client keeps its node, so its agent.
    pub user: usize,
    pub prompt: String,
    pub max_tokens: usize,
}

/// The shared-prefix shape both load generators draw from: each group's system prompt
/// (seeded per group, `system_chars` long) and every (group, user, round) in a shuffled
/// arrival order drawn from `rng`.
pub fn shared_prefix_order(
    seed: u64,
    users: &[usize],
    rounds: usize,
    system_chars: usize,
    rng: &mut ChaCha8Rng,
) -> (Vec<String>, Vec<(usize, usize, usize)>) {
    let systems: Vec<String> = (0..users.len())
        .map(|g| TextGen::new(seed ^ ((g as u64 + 1) * 7919)).text(system_chars))
        .collect();
    let mut order: Vec<(usize, usize, usize)> = users
        .iter()
        .enumerate()
        .flat_map(|(g, &n)| (0..n).flat_map(move |u| (0..rounds).map(move |r| (g, u, r))))
        .collect();
    order.shuffle(rng);
    (systems, order)
}

/// The prompt of user `user`'s question `round` after `system`.
pub fn question_prompt(system: &str, user: usize, round: usize, question: &str) -> String {
    format!("{system}\nUser {user} asks question {round}: {question}")
}

impl SharedPrefix {
    /// The requests, in arrival order; identical for the same seed.
    pub fn plan(&self, seed: u64) -> Vec<Planned> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let chars = |tokens: usize| (tokens as f64 * CHARS_PER_TOKEN) as usize;
        let users = users_per_group(self.groups, self.users, self.skew);
        // Users are numbered across groups: group g's first user follows group g-1's last.
        let first_user: Vec<usize> = users
            .iter()
            .scan(0, |next, n| {
                let first = *next;
                *next += n;
                Some(first)
            })
            .collect();
        let (systems, order) = shared_prefix_order(
            seed,
            &users,
            self.rounds,
            chars(self.system_tokens),
            &mut rng,
        );
        // Users ask their questions in order: sort each user's rounds by appearance.
        let mut at = Duration::ZERO;
        let mut text = TextGen::new(seed ^ 0xabcdef);
        order
            .into_iter()
            .map(|(g, u, r)| {
                let gap: f64 = -(1.0 - rng.random::<f64>()).ln() / self.rate;
                at += Duration::from_secs_f64(gap);
                let system = if self.no_sharing {
                    TextGen::new(rng.random()).text(chars(self.system_tokens))
                } else {
                    systems[g].clone()
                };
                let question = text.text(chars(self.question_tokens));
                Planned {
                    at,
                    user: first_user[g] + u,
                    prompt: question_prompt(&system, u, r, &question),
                    max_tokens: self.output_tokens,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> SharedPrefix {
        SharedPrefix {
            groups: 3,
            users: 2,
            rounds: 2,
            system_tokens: 200,
            question_tokens: 20,
            output_tokens: 8,
            rate: 10.0,
            no_sharing: false,
            skew: 0.0,
        }
    }

    #[test]
    fn seeded_and_shaped() {
        let a = shape().plan(1);
        let b = shape().plan(1);
        assert_eq!(a.len(), 12);
        assert_eq!(
            a.iter().map(|p| &p.prompt).collect::<Vec<_>>(),
            b.iter().map(|p| &p.prompt).collect::<Vec<_>>()
        );
        assert_ne!(a[0].prompt, shape().plan(2)[0].prompt);
        // Poisson: mean gap 1/rate (12 samples: loose bounds), arrivals increasing.
        assert!(a.windows(2).all(|w| w[0].at <= w[1].at));
        let mean = a.last().unwrap().at.as_secs_f64() / a.len() as f64;
        assert!((0.03..0.3).contains(&mean), "{mean}");
        // Exactly `groups` distinct system prompts.
        let systems: std::collections::HashSet<_> = a
            .iter()
            .map(|p| p.prompt.split('\n').next().unwrap().to_string())
            .collect();
        assert_eq!(systems.len(), 3);
        let mut control = shape();
        control.no_sharing = true;
        let c: std::collections::HashSet<_> = control
            .plan(1)
            .iter()
            .map(|p| p.prompt.split('\n').next().unwrap().to_string())
            .collect();
        assert_eq!(c.len(), 12);
    }

    #[test]
    fn skew_makes_a_few_groups_hot() {
        assert_eq!(users_per_group(3, 4, 0.0), vec![4, 4, 4]);
        // 1/(g+1) over 8 groups: 2.72 in total; 64 users.
        let u = users_per_group(8, 8, 1.0);
        assert_eq!(u.len(), 8);
        assert!(u.windows(2).all(|w| w[0] >= w[1]), "{u:?}");
        assert_eq!(u[0], 24, "{u:?}");
        assert!(u.iter().all(|&n| n >= 1));
        let total: usize = u.iter().sum();
        assert!((60..=68).contains(&total), "{u:?}");
        // The plan follows: the hottest group's system prompt heads most requests, and
        // user numbers are distinct across groups.
        let mut s = shape();
        s.groups = 8;
        s.users = 8;
        s.skew = 1.0;
        let plan = s.plan(5);
        assert_eq!(plan.len(), total * s.rounds);
        let mut by_system = std::collections::HashMap::<String, usize>::new();
        for p in &plan {
            *by_system
                .entry(p.prompt.split('\n').next().unwrap().to_string())
                .or_default() += 1;
        }
        assert_eq!(*by_system.values().max().unwrap(), 24 * s.rounds);
        let users: std::collections::HashSet<_> = plan.iter().map(|p| p.user).collect();
        assert_eq!(users.len(), total);
    }

    #[test]
    fn long_run_arrival_rate_matches() {
        let mut s = shape();
        s.groups = 50;
        s.users = 10;
        s.rounds = 4;
        s.system_tokens = 10;
        let plan = s.plan(3);
        let rate = plan.len() as f64 / plan.last().unwrap().at.as_secs_f64();
        assert!((9.0..11.0).contains(&rate), "{rate}");
    }
}
