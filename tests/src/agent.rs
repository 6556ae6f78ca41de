//! The routing proxy started in-process from `warmpath agent` flags, in front of a fleet.

use clap::Parser;
use warmpath_agent::{
    agent::{Routing, start_routing},
    args::AgentArgs,
};

use crate::sim::Fleet;

/// Starts the proxy (ports 0) in front of every engine of `fleet`, with their events and
/// replay endpoints, plus `extra` flags.
pub async fn proxy(fleet: &Fleet, extra: &[&str]) -> Routing {
    let mut args: Vec<String> = [
        "agent",
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--explain",
    ]
    .map(String::from)
    .to_vec();
    for (i, engine) in fleet.engines.iter().enumerate() {
        args.extend(["--endpoint".into(), fleet.url(i)]);
        if let Some(p) = &engine.publisher {
            args.extend(["--kv-events".into(), p.events_endpoint.clone()]);
            if let Some(r) = &p.replay_endpoint {
                args.extend(["--kv-replay".into(), r.clone()]);
            }
        }
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let agent = AgentArgs::try_parse_from(args).expect("valid agent flags");
    start_routing(&agent).await.expect("proxy starts")
}

/// The proxy's base URL and its admin URL (`http://` and the bound addresses).
pub fn urls(routing: &Routing) -> (String, String) {
    (
        format!("http://{}", routing.listen),
        format!("http://{}", routing.admin),
    )
}
