//! The CLUSTER section of `warmpath status`: this agent in the cluster, what it refused, its
//! live peers, the health it publishes for its own pods and, per remote pod, its owner's
//! word (health and load: docs/cluster.md, "Seeing it").

use std::fmt::Write as _;

/// Appends the section when the agent is in a cluster (`/status` has `cluster`).
pub fn render(out: &mut String, status: &serde_json::Value) {
    let c = &status["cluster"];
    if !c.is_object() {
        return;
    }
    let text = |v: &serde_json::Value| v.as_str().unwrap_or("-").to_string();
    let num = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    let _ = writeln!(
        out,
        "\nCLUSTER (node {}, IndexSync {})",
        text(&c["node"]),
        text(&c["grpc"])
    );
    let n = &c["counters"];
    let _ = writeln!(
        out,
        "refused          datagrams {} (malformed {}, oversized {})  streams {}  facts {}",
        num(&n["rejected_datagrams"]),
        num(&n["malformed_datagrams"]),
        num(&n["oversized_datagrams"]),
        num(&n["rejected_streams"]),
        num(&n["malformed_facts"]),
    );
    let peers = c["peers"].as_array().map_or(&[][..], Vec::as_slice);
    if peers.is_empty() {
        let _ = writeln!(out, "(no live peers)");
    } else {
        let _ = writeln!(
            out,
            "{:<16} {:>15} {:<22} {:>5} {:>10}",
            "PEER", "INCARNATION", "INDEXSYNC", "PODS", "MALFORMED"
        );
        for p in peers {
            let _ = writeln!(
                out,
                "{:<16} {:>15} {:<22} {:>5} {:>10}",
                text(&p["node"]),
                num(&p["incarnation"]),
                text(&p["grpc"]),
                num(&p["pods"]),
                num(&p["malformed_facts"]),
            );
        }
    }
    let local = c["local_pods"].as_array().map_or(&[][..], Vec::as_slice);
    if !local.is_empty() {
        let _ = writeln!(
            out,
            "{:<24} {:<9} {:<24}",
            "OWN POD", "PUBLISHED", "WATERMARK"
        );
        for p in local {
            let _ = writeln!(
                out,
                "{:<24} {:<9} {:<24}",
                text(&p["pod"]),
                text(&p["health"]),
                text(&p["watermark"]),
            );
        }
    }
    let remote = c["remote_pods"].as_array().map_or(&[][..], Vec::as_slice);
    if !remote.is_empty() {
        let _ = writeln!(
            out,
            "{:<24} {:<16} {:<10} {:>8} {:>8} {:>7}",
            "REMOTE POD", "OWNER", "OWNER SAYS", "RUNNING", "WAITING", "KV USE"
        );
        for p in remote {
            let load = &p["owner_load"];
            let (running, waiting, kv) = if load.is_object() {
                (
                    num(&load["running"]).to_string(),
                    num(&load["waiting"]).to_string(),
                    format!(
                        "{:.1}%",
                        load["kv_cache_usage"].as_f64().unwrap_or(0.0) * 100.0
                    ),
                )
            } else {
                ("-".into(), "-".into(), "-".into())
            };
            let _ = writeln!(
                out,
                "{:<24} {:<16} {:<10} {:>8} {:>8} {:>7}",
                text(&p["pod"]),
                p["owner"].as_str().unwrap_or("(none)"),
                text(&p["owner_health"]),
                running,
                waiting,
                kv,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str, start: &str) -> Vec<String> {
        text.lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("{start}: {text}"))
            .split_whitespace()
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn renders_counters_peers_and_the_owners_word() {
        let status = serde_json::json!({"cluster": {"node": "agent-0", "grpc": "127.0.0.1:7401",
            "counters": {"rejected_datagrams": 3, "malformed_datagrams": 0,
                "oversized_datagrams": 0, "rejected_streams": 1, "malformed_facts": 2},
            "peers": [{"node": "agent-1", "incarnation": 17, "gossip": "127.0.0.1:7410",
                "grpc": "127.0.0.1:7411", "pods": 2, "malformed_facts": 2}],
            "local_pods": [{"pod": "127.0.0.1:8100", "model": "m", "health": "stalled",
                "watermark": "65536:12"}],
            "remote_pods": [
                {"pod": "127.0.0.1:8102", "owner": "agent-1", "owner_health": "healthy",
                    "watermark": "131072:4",
                    "owner_load": {"running": 3, "waiting": 1, "kv_cache_usage": 0.41}},
                {"pod": "127.0.0.1:8104", "owner": null, "owner_health": null,
                    "watermark": null, "owner_load": null}]}});
        let mut text = String::new();
        render(&mut text, &status);
        assert!(
            text.contains("CLUSTER (node agent-0, IndexSync 127.0.0.1:7401)"),
            "{text}"
        );
        assert_eq!(
            words(&text, "refused").join(" "),
            "refused datagrams 3 (malformed 0, oversized 0) streams 1 facts 2"
        );
        assert_eq!(
            words(&text, "agent-1"),
            ["agent-1", "17", "127.0.0.1:7411", "2", "2"]
        );
        assert_eq!(
            words(&text, "127.0.0.1:8100"),
            ["127.0.0.1:8100", "stalled", "65536:12"]
        );
        assert_eq!(
            words(&text, "127.0.0.1:8102"),
            ["127.0.0.1:8102", "agent-1", "healthy", "3", "1", "41.0%"]
        );
        assert_eq!(
            words(&text, "127.0.0.1:8104"),
            ["127.0.0.1:8104", "(none)", "-", "-", "-", "-"]
        );
        // Alone (no cluster): no section.
        let mut alone = String::new();
        render(&mut alone, &serde_json::json!({"pods": []}));
        assert!(alone.is_empty());
    }
}
