//! The routing proxy started in-process from `warmpath agent` flags, in front of a fleet.

use clap::Parser;
use warmpath_agent::{
    agent::{Routing, start_routing},
    args::AgentArgs,
};

use crate::sim::Fleet;

/// Starts the agent in this process, its listener and admin port on 127.0.0.1 port 0, with
/// `flags` after those.
pub async fn start(flags: impl IntoIterator<Item = String>) -> Routing {
    let mut args: Vec<String> = ["agent", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"]
        .map(String::from)
        .to_vec();
    args.extend(flags);
    let agent = AgentArgs::try_parse_from(args).expect("valid agent flags");
    start_routing(&agent).await.expect("the agent starts")
}

/// `--endpoint URL` for each of `urls`.
fn endpoint_flags(urls: &[String]) -> Vec<String> {
    urls.iter()
        .flat_map(|u| ["--endpoint".to_string(), u.clone()])
        .collect()
}

/// Starts the proxy (ports 0, `--explain`) in front of `endpoints` (base URLs), without KV
/// events, plus `extra` flags.
pub async fn in_front_of(endpoints: &[String], extra: &[&str]) -> Routing {
    let mut flags = vec!["--explain".to_string()];
    flags.extend(endpoint_flags(endpoints));
    flags.extend(extra.iter().map(|s| s.to_string()));
    start(flags).await
}

/// Starts the proxy (ports 0, `--explain`) in front of every engine of `fleet`, with their
/// events and replay endpoints, plus `extra` flags.
pub async fn proxy(fleet: &Fleet, extra: &[&str]) -> Routing {
    let mut flags = vec!["--explain".to_string()];
    for (i, engine) in fleet.engines.iter().enumerate() {
        flags.extend(["--endpoint".into(), fleet.url(i)]);
        if let Some(p) = &engine.publisher {
            flags.extend(["--kv-events".into(), p.events_endpoint.clone()]);
            if let Some(r) = &p.replay_endpoint {
                flags.extend(["--kv-replay".into(), r.clone()]);
            }
        }
    }
    flags.extend(extra.iter().map(|s| s.to_string()));
    start(flags).await
}

/// The proxy's base URL and its admin URL (`http://` and the bound addresses).
pub fn urls(routing: &Routing) -> (String, String) {
    (
        format!("http://{}", routing.listen),
        format!("http://{}", routing.admin),
    )
}

/// Posts a completion of `prompt` (text or token ids) to the proxy at `base`, asserting a
/// 200; returns the pod that answered (`x-warmpath-pod`: the proxy runs with `--explain`)
/// and the answer.
pub async fn complete(
    client: &reqwest::Client,
    base: &str,
    prompt: serde_json::Value,
) -> (String, serde_json::Value) {
    let body = serde_json::json!({"model": "sim-llama", "prompt": prompt, "max_tokens": 2});
    let r = client
        .post(format!("{base}/v1/completions"))
        .json(&body)
        .send()
        .await
        .expect("the proxy answers");
    assert_eq!(r.status(), 200);
    let pod = r.headers()["x-warmpath-pod"]
        .to_str()
        .expect("an ASCII pod address")
        .to_string();
    (pod, r.json().await.expect("a JSON answer"))
}
