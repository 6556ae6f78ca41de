//! The evict charge's resident prefixes end to end: a prefix a request reuses is counted on
//! every pod that holds it, by the proxy's background recount (no request triggers it), and
//! shown on `/status` (`pods[].resident_blocks`, `pools[].resident_prefixes_tracked`).
#![allow(clippy::unwrap_used)] // test binary: a failed unwrap is a failed test

use std::{collections::HashSet, time::Duration};

use serde_json::json;
use warmpath_e2e::{
    agent::{self, proxy, urls},
    sim::{Fleet, get_json, wait_for},
};

const WAIT: Duration = Duration::from_secs(20);
/// Prompt tokens: 8 whole blocks of 16.
const TOKENS: u32 = 128;

/// Sends one completion of the document's tokens; returns the pod that answered.
async fn complete(client: &reqwest::Client, base: &str) -> String {
    let prompt: Vec<u32> = (0..TOKENS).map(|i| 300 + i).collect();
    agent::complete(client, base, json!(prompt)).await.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_prefix_is_counted_on_the_pods_holding_it_without_a_request() {
    let fleet = Fleet::tiny(2, &[]).await;
    let routing = proxy(&fleet, &["--policy", "precise"]).await;
    let (base, admin) = urls(&routing);
    let client = reqwest::Client::new();
    // The first request brings the document (nothing reused); the second reuses its 8
    // blocks wherever a pod holds them.
    let mut served = HashSet::new();
    served.insert(complete(&client, &base).await);
    served.insert(complete(&client, &base).await);
    let (c, status_url) = (&client, format!("{admin}/status"));
    let (url, served) = (&status_url, &served);
    // Every pod that answered one of the two holds the document's 8 blocks; the other none.
    let want = |pod: &str| {
        if served.contains(pod) {
            u64::from(TOKENS / 16)
        } else {
            0
        }
    };
    // No request follows: only the background recount can count it.
    wait_for(
        "the reused prefix counted on its pods",
        WAIT,
        || async move {
            let s = get_json(c, url).await;
            let tracked = s["pools"][0]["resident_prefixes_tracked"].as_u64();
            let counted = s["pods"].as_array()?.iter().all(|p| {
                let pod = p["load"]["endpoint"].as_str().unwrap_or_default();
                p["resident_blocks"].as_u64() == Some(want(pod))
            });
            (tracked == Some(1) && counted).then_some(())
        },
    )
    .await;
}
