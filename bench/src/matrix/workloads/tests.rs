use std::collections::{HashMap, HashSet};

use super::*;

/// The text before the first newline: a RAG request's document, a no-sharing request's
/// prefix.
fn head(p: &Planned) -> &str {
    p.prompt.split('\n').next().unwrap_or_default()
}

fn all(g: &Generated) -> Vec<&Planned> {
    g.chains.iter().flat_map(|c| &c.turns).collect()
}

#[test]
fn workload_names_parse_and_print_back() {
    assert_eq!(
        "rag:1.4:2500".parse::<Workload>(),
        Ok(Workload::Rag {
            skew: 1.4,
            doc_tokens: 2500
        })
    );
    assert_eq!(
        "chat:2000".parse::<Workload>(),
        Ok(Workload::Chat {
            shared_tokens: 2000
        })
    );
    for name in ["chat", "chat:2000", "agentic", "no-sharing", "rag:0.6:1000"] {
        assert_eq!(name.parse::<Workload>().unwrap().to_string(), name);
    }
    for bad in [
        "rag",
        "rag:x:10",
        "rag:1.0",
        "rag:1.0:10:3",
        "rag:9:100",
        "rag:1:8",
        "chats",
        "chat:",
        "chat:8",
        "chat:x",
        "chat:1:2",
        "chat:20000",
    ] {
        assert!(bad.parse::<Workload>().is_err(), "{bad}");
    }
}

#[test]
fn rag_is_seeded_zipf_over_the_documents_with_a_question_each() {
    let sizes = Sizes {
        requests: 2000,
        ..Sizes::full(0)
    };
    let w = Workload::Rag {
        skew: 1.4,
        doc_tokens: 100,
    };
    let a = w.generate(&sizes, 10.0, 4, 3);
    let b = w.generate(&sizes, 10.0, 4, 3);
    let prompts = |g: &Generated| all(g).iter().map(|p| p.prompt.clone()).collect::<Vec<_>>();
    assert_eq!(prompts(&a), prompts(&b));
    assert_ne!(prompts(&a), prompts(&w.generate(&sizes, 10.0, 4, 4)));
    assert_eq!(a.requests(), 2000);
    assert!(a.chains.iter().all(|c| c.turns.len() == 1 && !c.grow));
    // Poisson at 10/s: arrivals increasing, 2000 of them over about 200 s.
    let turns = all(&a);
    assert!(turns.windows(2).all(|w| w[0].at <= w[1].at));
    let rate = 2000.0 / turns.last().unwrap().at.as_secs_f64();
    assert!((9.0..11.0).contains(&rate), "{rate}");
    // 24 documents at most; the hottest one's share is 1/sum_{d=1..24} d^-1.4 = 0.41.
    let mut by_doc = HashMap::<&str, usize>::new();
    for p in &turns {
        *by_doc.entry(head(p)).or_default() += 1;
    }
    assert!(by_doc.len() <= 24 && by_doc.len() >= 20, "{}", by_doc.len());
    let top = *by_doc.values().max().unwrap() as f64 / 2000.0;
    assert!((0.36..0.46).contains(&top), "{top}");
    // Every question its own.
    let questions: HashSet<_> = turns.iter().map(|p| &p.prompt).collect();
    assert_eq!(questions.len(), 2000);
    // ~100 tokens of document at 3.85 characters per token.
    assert!(
        (370..=390).contains(&head(turns[0]).len()),
        "{}",
        head(turns[0]).len()
    );
    assert_eq!(a.mean_prompt_tokens, 164.0);
    assert_eq!(a.longest_tokens, 228);
    // Skew 0: every document about equally popular (1/24 = 0.042 each).
    let flat = Workload::Rag {
        skew: 0.0,
        doc_tokens: 100,
    }
    .generate(&sizes, 10.0, 4, 3);
    let mut by_doc = HashMap::<&str, usize>::new();
    for p in all(&flat) {
        *by_doc.entry(head(p)).or_default() += 1;
    }
    assert_eq!(by_doc.len(), 24);
    assert!(by_doc.values().all(|n| (40..130).contains(n)), "{by_doc:?}");
}

#[test]
fn chat_sessions_interleave_grow_and_are_not_a_multiple_of_the_engines() {
    let sizes = Sizes {
        requests: 12,
        ..Sizes::quick(0)
    };
    // 12 requests of 3 turns: 4 sessions, a multiple of 4 engines, so 5.
    let g = Workload::CHAT.generate(&sizes, 5.0, 4, 1);
    assert_eq!(g.chains.len(), 5);
    assert_eq!(Workload::CHAT.generate(&sizes, 5.0, 3, 1).chains.len(), 4);
    assert_eq!(g.requests(), 15);
    for (s, c) in g.chains.iter().enumerate() {
        assert!(c.grow);
        assert_eq!(c.turns.len(), 3);
        assert!(c.turns.windows(2).all(|w| w[0].at < w[1].at));
        assert!(c.turns.iter().all(|t| t.user == s));
        assert!(c.turns[0].prompt.starts_with(&format!("System {s}: ")));
        assert!(c.turns[1].prompt.starts_with("\nUser 1: "));
        assert!(c.turns[2].prompt.starts_with("\nUser 2: "));
    }
    // Interleaved: some session's second turn arrives before another's first.
    let second_min = g.chains.iter().map(|c| c.turns[1].at).min().unwrap();
    let first_max = g.chains.iter().map(|c| c.turns[0].at).max().unwrap();
    assert!(second_min < first_max);
    // Tokens: 32 system + (k + 1) x 8 + k x 4 answer tokens at turn k = 0, 1, 2.
    assert_eq!(g.longest_tokens, 32 + 24 + 8 + 4);
    assert_eq!(g.mean_prompt_tokens, (40.0 + 52.0 + 64.0) / 3.0);
    assert_eq!(g.working_set_tokens, 5 * 68);
    let again = Workload::CHAT.generate(&sizes, 5.0, 4, 1);
    assert_eq!(
        all(&g).iter().map(|p| &p.prompt).collect::<Vec<_>>(),
        all(&again).iter().map(|p| &p.prompt).collect::<Vec<_>>()
    );
}

#[test]
fn agent_loops_grow_by_tool_output() {
    let sizes = Sizes {
        requests: 9,
        ..Sizes::quick(0)
    };
    let g = Workload::Agentic.generate(&sizes, 5.0, 2, 9);
    assert_eq!(g.chains.len(), 3);
    for c in &g.chains {
        assert!(c.grow);
        assert!(c.turns[0].prompt.starts_with("Task "));
        assert!(
            c.turns[1..]
                .iter()
                .all(|t| t.prompt.starts_with("\nTool output "))
        );
        // A tool result of at least 16 tokens (61 characters, whole sentences) and its label.
        let len = c.turns[1].prompt.len();
        assert!((61..200).contains(&len), "{len}");
    }
    // 64 task + 3 x 16 tool + 2 x 4 answer tokens, then 4 output.
    assert_eq!(g.longest_tokens, 64 + 48 + 8 + 4);
}

#[test]
fn no_sharing_gives_every_request_its_own_prefix() {
    let sizes = Sizes {
        requests: 40,
        ..Sizes::quick(0)
    };
    let g = Workload::NoSharing.generate(&sizes, 5.0, 4, 2);
    let heads: HashSet<_> = all(&g).into_iter().map(head).collect();
    assert_eq!(heads.len(), 40);
    assert!(!Workload::NoSharing.shares() && Workload::CHAT.shares());
    assert_eq!(g.working_set_tokens, 40 * (64 + 8 + 4));
}

#[test]
fn each_request_has_its_fresh_tokens_and_each_document_or_session_opening_is_new_once() {
    let sizes = Sizes::full(120);
    let rag = Workload::Rag {
        skew: 1.0,
        doc_tokens: 500,
    }
    .generate(&sizes, 10.0, 4, 7);
    let work = &rag.new_work();
    assert_eq!(work.each.len(), rag.requests());
    let docs: HashSet<&str> = all(&rag).into_iter().map(head).collect();
    // A document is new to one request (its whole prompt: ~500 + ~70 tokens); each request
    // brings its question (~70 tokens and what follows the document's last full block of 16).
    assert_eq!(work.shared.len(), docs.len());
    assert!(
        work.shared
            .iter()
            .all(|p| (450..700).contains(&p.cold.tokens) && p.cold.context == 0),
        "{work:?}"
    );
    let members: usize = work.shared.iter().map(|p| p.members.len()).sum();
    assert_eq!(members, rag.requests());
    // A document asked once: its request brings all of it. Asked more: each brings its own
    // part.
    for prefix in &work.shared {
        for &i in &prefix.members {
            let f = work.each[i];
            if prefix.members.len() == 1 {
                assert_eq!(f, prefix.cold, "{work:?}");
            } else {
                let own = (50..110).contains(&f.tokens) && (400..600).contains(&f.context);
                assert!(own, "{i}: {f:?}");
            }
        }
    }
    for w in [Workload::CHAT, Workload::Agentic] {
        let g = w.generate(&sizes, 10.0, 4, 7);
        let work = g.new_work();
        let each = &work.each;
        assert_eq!(each.len(), g.requests());
        assert!(work.shared.is_empty());
        // A session opens with its first text and message (chat 608 tokens, agentic 2,560,
        // as the generator estimates them), then brings one message (96) or tool result (512)
        // a turn, with its label ("User 3: "); the tokenizer counts up to a third more.
        let (opening, step) = match w {
            Workload::Chat { .. } => (608.0, 96.0),
            _ => (2560.0, 512.0),
        };
        let near = |t: usize, n: f64| (n * 0.9..n * 1.4).contains(&(t as f64));
        let opened = each.iter().filter(|f| near(f.tokens, opening)).count();
        assert_eq!(opened, g.chains.len(), "{w}");
        let steps = each.iter().filter(|f| near(f.tokens, step)).count();
        assert_eq!(steps, g.requests() - g.chains.len(), "{w}");
    }
    let control = Workload::NoSharing.generate(&sizes, 10.0, 4, 7);
    assert!(
        control
            .new_work()
            .each
            .iter()
            .all(|f| f.context == 0 && f.tokens > 1000)
    );
}

#[test]
fn chat_with_a_shared_system_prompt_opens_every_session_with_it_and_it_is_new_once() {
    let sizes = Sizes::full(120);
    let w = Workload::Chat {
        shared_tokens: 1000,
    };
    let g = w.generate(&sizes, 10.0, 4, 7);
    let openings: Vec<&str> = g
        .chains
        .iter()
        .map(|c| c.turns[0].prompt.as_str())
        .collect();
    // One text before the first newline, the same in every session, then each session's own.
    let shared = head(&g.chains[0].turns[0]);
    assert!((3500..4300).contains(&shared.len()), "{}", shared.len());
    for (s, o) in openings.iter().enumerate() {
        let own = o
            .strip_prefix(shared)
            .and_then(|rest| rest.strip_prefix('\n'))
            .expect("the shared system prompt first");
        assert!(own.starts_with(&format!("System {s}: ")), "{own}");
    }
    // The shared text is held once: 1,000 + 21 sessions (20, a multiple of 4, so 21) x
    // (512 + 6 x 96 + 5 x 64 + 64).
    assert_eq!(g.chains.len(), 21);
    assert_eq!(g.working_set_tokens, 1000 + 21 * (512 + 6 * 96 + 6 * 64));
    assert_eq!(g.longest_tokens, 1000 + 512 + 6 * 96 + 6 * 64);
    // Later turns are as in `chat`: the same sizes, only the openings are longer.
    let plain = Workload::CHAT.generate(&sizes, 10.0, 4, 7);
    assert_eq!(g.requests(), plain.requests());
    assert_eq!(
        g.mean_prompt_tokens - plain.mean_prompt_tokens,
        1000.0,
        "{} vs {}",
        g.mean_prompt_tokens,
        plain.mean_prompt_tokens
    );
    // The floor: one shared prefix whose members are the openings, cold for the first
    // (~1,000 + ~608 tokens, the tokenizer counting up to a third more); each opening brings
    // its own ~608 tokens after the shared whole blocks (a multiple of 16).
    let work = g.new_work();
    assert_eq!(work.shared.len(), 1);
    let mut starts = Vec::new();
    let mut i = 0;
    for c in &g.chains {
        starts.push(i);
        i += c.turns.len();
    }
    let mut members = work.shared[0].members.clone();
    members.sort_unstable();
    assert_eq!(members, starts);
    let cold = work.shared[0].cold;
    assert!(
        (1450..2200).contains(&cold.tokens) && cold.context == 0,
        "{cold:?}"
    );
    for &i in &starts {
        let f = work.each[i];
        assert_eq!(f.context % 16, 0, "{f:?}");
        assert!((900..1400).contains(&f.context), "{f:?}");
        assert!((540..860).contains(&f.tokens), "{f:?}");
    }
    // The other turns bring what they do in `chat`.
    let plain_work = plain.new_work();
    let later = |w: &NewWork, g: &Generated| -> Vec<usize> {
        let mut out = Vec::new();
        let mut i = 0;
        for c in &g.chains {
            out.extend((i + 1..i + c.turns.len()).map(|j| w.each[j].tokens));
            i += c.turns.len();
        }
        out
    };
    assert_eq!(later(&work, &g).len(), later(&plain_work, &plain).len());
    assert!(later(&work, &g).iter().all(|&t| (86..135).contains(&t)));
}

#[test]
fn a_mix_runs_every_part_at_its_share_of_the_rate_with_sessions_of_its_own() {
    let sizes = Sizes::full(120);
    let rate = 8.0;
    let g = Workload::Mix.generate(&sizes, rate, 4, 7);
    assert_eq!("mix".parse::<Workload>(), Ok(Workload::Mix));
    assert_eq!(Workload::Mix.to_string(), "mix");
    assert!(Workload::Mix.shares());
    // 30 requests a part: 30 RAG questions, 5 chat sessions and 5 agent loops of 6 turns
    // (not a multiple of 4 engines), 30 control requests.
    let kinds: Vec<Workload> = g.parts.iter().map(|p| p.workload.clone()).collect();
    let rag = Workload::Rag {
        skew: 1.0,
        doc_tokens: 2500,
    };
    let order = [rag, Workload::CHAT, Workload::Agentic, Workload::NoSharing];
    assert_eq!(kinds, order);
    let chains: Vec<usize> = g.parts.iter().map(|p| p.chains).collect();
    assert_eq!(chains, [30, 5, 5, 30]);
    assert_eq!(g.requests(), 120);
    // Chains by part: what each one's prompts open with, and the users of each part lie
    // at or above its `first_user` and below the next part's, each chain's its own.
    let mut first = 0;
    let mut users = HashSet::new();
    for (k, part) in g.parts.iter().enumerate() {
        let next = g.parts.get(k + 1).map_or(usize::MAX, |p| p.first_user);
        for c in &g.chains[first..first + part.chains] {
            let opening = &c.turns[0].prompt;
            let looks = match part.workload {
                Workload::Chat { .. } => opening.starts_with("System "),
                Workload::Agentic => opening.starts_with("Task "),
                _ => !c.grow && opening.contains("\nQuestion "),
            };
            assert!(looks, "{}: {opening:.40}", part.workload);
            let user = c.turns[0].user;
            assert!((part.first_user..next).contains(&user), "{user}");
            assert!(c.turns.iter().all(|t| t.user == user));
            assert!(users.insert(user), "user {user} twice");
            assert_eq!(Part::of_user(&g.parts, user), Some(part.workload.clone()));
        }
        first += part.chains;
    }
    // The arrivals merge into the cell's rate: 120 requests over about 120 / 8 = 15 s, and
    // each part's over the same span (its own rate is a quarter of the cell's).
    let last = |range: std::ops::Range<usize>| {
        g.chains[range]
            .iter()
            .flat_map(|c| &c.turns)
            .map(|t| t.at.as_secs_f64())
            .fold(0.0, f64::max)
    };
    assert!((9.0..22.0).contains(&last(0..70)), "{}", last(0..70));
    for range in [0..30, 30..35, 35..40, 40..70] {
        let end = last(range.clone());
        assert!((8.0..24.0).contains(&end), "{range:?}: {end}");
    }
    // The cell's sizes: the parts' working sets summed, the longest an agent loop's last
    // step (2,048 + 6 x 512 + 5 x 48 prompt tokens, 48 out), the mean prompt and output
    // over the 120 requests.
    assert_eq!(g.longest_tokens, 2048 + 3072 + 240 + 48);
    // (90 x 64 + 30 x 48) / 120 output tokens.
    assert_eq!(g.output_tokens, 60);
    // New work: one bound per request, in plan order; the documents' shared prefixes are
    // the RAG part's requests (the first 30) and only theirs; the control's requests bring
    // their whole prompts.
    let work = g.new_work();
    assert_eq!(work.each.len(), 120);
    assert!(!work.shared.is_empty());
    assert!(work.shared.iter().flat_map(|p| &p.members).all(|&i| i < 30));
    let members: usize = work.shared.iter().map(|p| p.members.len()).sum();
    assert_eq!(members, 30);
    assert!(
        work.each[90..]
            .iter()
            .all(|f| f.tokens > 1000 && f.context == 0)
    );
    // The same seed, the same plan; another seed, other text.
    let again = Workload::Mix.generate(&sizes, rate, 4, 7);
    let prompts = |g: &Generated| all(g).iter().map(|p| p.prompt.clone()).collect::<Vec<_>>();
    assert_eq!(prompts(&g), prompts(&again));
    assert_ne!(
        prompts(&g),
        prompts(&Workload::Mix.generate(&sizes, rate, 4, 8))
    );
}
