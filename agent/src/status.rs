//! `warmpath status`: the admin port's `/status` as terminal tables (tenants, their route
//! receipts, pods, then requests routed without prefix keys, policies, the Kubernetes side
//! and the cluster: `status/cluster.rs`).

use std::fmt::Write as _;

mod cluster;

use crate::telemetry::LiveSummary;

/// Options of `warmpath status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// The agent's admin listener.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9090")]
    pub admin: String,

    /// File holding the agent's admin bearer token (the agent's --admin-token-file).
    #[arg(long, value_name = "PATH", env = "WARMPATH_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<std::path::PathBuf>,

    /// Print the raw JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// Errors of `warmpath status`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("GET http://{admin}/status: {source} (is the agent running with --admin {admin}?)")]
    Fetch {
        admin: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("--admin-token-file: {0}")]
    Token(String),
    #[error(
        "GET http://{admin}/status: 401 Unauthorized: {}",
        if *.sent {
            "the agent refused the admin token (is it the file the agent reads with --admin-token-file?)"
        } else {
            "the agent requires an admin token: give --admin-token-file PATH or set WARMPATH_ADMIN_TOKEN_FILE"
        }
    )]
    Unauthorized { admin: String, sent: bool },
}

pub async fn run(args: &StatusArgs) -> Result<(), Error> {
    let fetch = |source| Error::Fetch {
        admin: args.admin.clone(),
        source,
    };
    let token = args
        .admin_token_file
        .as_deref()
        .map(crate::config::read_token_file)
        .transpose()
        .map_err(Error::Token)?;
    let mut request = reqwest::Client::new().get(format!("http://{}/status", args.admin));
    if let Some(t) = &token {
        request = request.bearer_auth(t);
    }
    let response = request.send().await.map_err(fetch)?;
    if response.status() == reqwest::StatusCode::UNAUTHORIZED {
        return Err(Error::Unauthorized {
            admin: args.admin.clone(),
            sent: token.is_some(),
        });
    }
    let status: serde_json::Value = response
        .error_for_status()
        .map_err(fetch)?
        .json()
        .await
        .map_err(fetch)?;
    if args.json {
        println!("{status:#}");
    } else {
        print!("{}", render(&status));
    }
    Ok(())
}

/// The tables, from a `/status` document.
pub fn render(status: &serde_json::Value) -> String {
    let mut out = String::new();
    let tenants: Vec<LiveSummary> =
        serde_json::from_value(status["tenants"].clone()).unwrap_or_default();
    let window = tenants.first().map_or(0.0, |t| t.window_s);
    let _ = writeln!(out, "TENANTS (last {window:.0} s)");
    let _ = writeln!(
        out,
        "{:<20} {:>9} {:>7} {:>11} {:>11} {:>7} {:>9} {:>9} {:>9}",
        "TENANT",
        "REQ/S",
        "ERRORS",
        "PROMPT T/S",
        "OUTPUT T/S",
        "CACHE%",
        "TTFT P50",
        "TTFT P90",
        "TTFT P99"
    );
    let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}ms"));
    for t in &tenants {
        let _ = writeln!(
            out,
            "{:<20} {:>9.2} {:>7} {:>11.1} {:>11.1} {:>6.1}% {:>9} {:>9} {:>9}",
            t.tenant,
            t.requests_per_s,
            t.errors,
            t.prompt_tokens_per_s,
            t.output_tokens_per_s,
            t.cache_hit_pct,
            ms(t.ttft_ms_p50),
            ms(t.ttft_ms_p90),
            ms(t.ttft_ms_p99)
        );
    }
    if tenants.is_empty() {
        let _ = writeln!(out, "(no requests yet)");
    }
    receipts(&mut out, &tenants);
    let _ = writeln!(
        out,
        "\nPODS (policy {}, model {})",
        status["policy"].as_str().unwrap_or("?"),
        status["model"].as_str().unwrap_or("?")
    );
    let _ = writeln!(
        out,
        "{:<24} {:<8} {:>9} {:>9} {:>8} {:>8} {:>10} {:<9} {:<7}",
        "POD", "STATE", "IN FLIGHT", "REQUESTS", "WAITING", "KV USE", "INDEX", "HEALTH", "PREFIX"
    );
    for p in status["pods"].as_array().into_iter().flatten() {
        let load = &p["load"];
        let engine = &load["engine"];
        let _ = writeln!(
            out,
            "{:<24} {:<8} {:>9} {:>9} {:>8} {:>7.1}% {:>10} {:<9} {:<7}",
            load["endpoint"].as_str().unwrap_or("?"),
            load["state"].as_str().unwrap_or("serving"),
            load["in_flight"].as_u64().unwrap_or(0),
            load["requests"].as_u64().unwrap_or(0),
            engine["waiting"]
                .as_u64()
                .map_or("-".into(), |w| w.to_string()),
            engine["kv_cache_usage"].as_f64().unwrap_or(0.0) * 100.0,
            p["index"]["entries"]
                .as_u64()
                .map_or("-".into(), |e| e.to_string()),
            p["index"]["state"].as_str().unwrap_or("no events"),
            p["prefix_source"].as_str().unwrap_or("-"),
        );
    }
    unkeyed(&mut out, status);
    policies(&mut out, status);
    kubernetes(&mut out, status);
    cluster::render(&mut out, status);
    out
}

/// The agent's Kubernetes side, when it has one: lists and watch restarts per kind, the
/// intercepted Services, whether this agent writes statuses.
fn kubernetes(out: &mut String, status: &serde_json::Value) {
    let k = &status["kubernetes"];
    if !k.is_object() {
        return;
    }
    let _ = writeln!(out, "\nKUBERNETES");
    for (label, key) in [
        ("pods", "pods"),
        ("inference pools", "inference_pools"),
        ("services", "services"),
    ] {
        let kind = &k[key];
        let _ = writeln!(
            out,
            "{label:<16} lists {:>4}  watch restarts {:>4}  errors {:>4}",
            kind["lists"].as_u64().unwrap_or(0),
            kind["restarts"].as_u64().unwrap_or(0),
            kind["errors"].as_u64().unwrap_or(0),
        );
    }
    for s in k["services_intercepted"].as_array().into_iter().flatten() {
        let vips: Vec<&str> = s["vips"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str())
            .collect();
        let _ = writeln!(
            out,
            "intercepting     {} port {} -> pool {}: {}",
            s["service"].as_str().unwrap_or("?"),
            s["port"].as_u64().unwrap_or(0),
            s["pool"].as_str().unwrap_or("?"),
            if vips.is_empty() {
                format!("no VIP ({})", s["note"].as_str().unwrap_or("-"))
            } else {
                vips.join(", ")
            }
        );
    }
    let writer = &k["status_writer"];
    let _ = writeln!(
        out,
        "status writer    {}",
        match writer["leader"].as_bool() {
            Some(true) => format!(
                "this agent (holds the Lease; {} writes)",
                writer["writes"].as_u64().unwrap_or(0)
            ),
            Some(false) => "another agent holds the Lease".to_string(),
            None => "off (statusWrites false, or no node name)".to_string(),
        }
    );
}

/// Each tenant's route receipts over the window (printed when any request has one): prompt
/// tokens available on some pod, captured by the chosen pod, delivered by the engine.
fn receipts(out: &mut String, tenants: &[LiveSummary]) {
    if tenants.iter().all(|t| t.receipts.requests == 0) {
        return;
    }
    let _ = writeln!(out, "\nROUTE RECEIPTS (prompt tokens, same window)");
    let _ = writeln!(
        out,
        "{:<20} {:>9} {:>12} {:>12} {:>12} {:>9} {:>9} {:>9}",
        "TENANT",
        "REQUESTS",
        "AVAILABLE",
        "CAPTURED",
        "DELIVERED",
        "CAPTURE%",
        "DELIVER%",
        "SHORTFALL"
    );
    let pct = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}%"));
    for t in tenants.iter().filter(|t| t.receipts.requests > 0) {
        let r = &t.receipts;
        let _ = writeln!(
            out,
            "{:<20} {:>9} {:>12} {:>12} {:>12} {:>9} {:>9} {:>9}",
            t.tenant,
            r.requests,
            r.available_tokens,
            r.captured_tokens,
            r.delivered_tokens,
            pct(r.capture_pct),
            pct(r.delivery_pct),
            r.shortfall_requests
        );
    }
}

/// The declarative policy objects and their conditions, the files that could not be used,
/// and the declared tenants (only when a policy directory or tenants are in use).
fn policies(out: &mut String, status: &serde_json::Value) {
    let p = &status["policies"];
    let objects = p["objects"].as_array().map_or(&[][..], Vec::as_slice);
    let tenants = p["tenants"].as_array().map_or(&[][..], Vec::as_slice);
    let files = p["file_errors"].as_array().map_or(&[][..], Vec::as_slice);
    if objects.is_empty() && tenants.is_empty() && files.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nPOLICIES (set {}, directory load {})",
        p["generation"], p["directory_generation"]
    );
    let _ = writeln!(
        out,
        "{:<12} {:<32} {:>4} {:<26} {:<10} {:<10}",
        "KIND", "NAME", "GEN", "SERVING", "ACCEPTED", "RESOLVED"
    );
    let condition = |o: &serde_json::Value, t: &str| {
        o["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == t)
            .map_or("-".to_string(), |c| {
                if c["status"] == "True" {
                    "True".to_string()
                } else {
                    c["reason"].as_str().unwrap_or("False").to_string()
                }
            })
    };
    for o in objects {
        let _ = writeln!(
            out,
            "{:<12} {:<32} {:>4} {:<26} {:<10} {:<10}",
            o["kind"].as_str().unwrap_or("?"),
            o["name"].as_str().unwrap_or("?"),
            o["observed_generation"],
            o["serving"].as_str().unwrap_or("?"),
            condition(o, "Accepted"),
            condition(o, "ResolvedRefs"),
        );
        for c in o["conditions"].as_array().into_iter().flatten() {
            if c["status"] != "True" {
                let _ = writeln!(
                    out,
                    "    {}: {}",
                    c["type"].as_str().unwrap_or("?"),
                    c["message"].as_str().unwrap_or("")
                );
            }
        }
    }
    for f in files {
        let _ = writeln!(
            out,
            "file {}: {}",
            f["file"].as_str().unwrap_or("?"),
            f["error"].as_str().unwrap_or("?")
        );
    }
    if !tenants.is_empty() {
        let _ = writeln!(
            out,
            "{:<20} {:>8} {:>6} {:<9} QUOTAS (this agent's share)",
            "TENANT", "PRIORITY", "WEIGHT", "CACHE"
        );
    }
    for t in tenants {
        let q = &t["quotas"];
        let share = &t["local_share"];
        let mut quotas = Vec::new();
        for (key, unit) in [
            ("requests_per_s", "req/s"),
            ("prompt_tokens_per_s", "prompt tok/s"),
            ("output_tokens_per_s", "output tok/s"),
            ("concurrent_streams", "streams"),
        ] {
            if let Some(limit) = q[key].as_f64() {
                let mine = share[key]
                    .as_f64()
                    .map_or("-".to_string(), |v| format!("{v:.0}"));
                quotas.push(format!("{limit:.0} {unit} ({mine})"));
            }
        }
        let _ = writeln!(
            out,
            "{:<20} {:>8} {:>6} {:<9} {}",
            t["name"].as_str().unwrap_or("?"),
            t["priority"],
            t["weight"],
            t["cache_isolation"].as_str().unwrap_or("?"),
            if quotas.is_empty() {
                "-".to_string()
            } else {
                quotas.join(", ")
            }
        );
    }
}

/// Requests each pool routed without prefix keys, by reason, with the first failure's
/// message (printed only when there are any).
fn unkeyed(out: &mut String, status: &serde_json::Value) {
    let mut rows = Vec::new();
    for pool in status["pools"].as_array().into_iter().flatten() {
        let Some(counts) = pool["unkeyed"].as_object() else {
            continue;
        };
        for (reason, n) in counts {
            let first = pool["unkeyed_first_error"][reason.as_str()]
                .as_str()
                .unwrap_or("");
            rows.push((
                pool["name"].as_str().unwrap_or("?").to_string(),
                reason.clone(),
                n.as_u64().unwrap_or(0),
                first.to_string(),
            ));
        }
    }
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nROUTED WITHOUT PREFIX KEYS");
    let _ = writeln!(
        out,
        "{:<16} {:<24} {:>9}  FIRST ERROR",
        "POOL", "REASON", "REQUESTS"
    );
    for (pool, reason, n, first) in rows {
        let first: String = first.chars().take(100).collect();
        let _ = writeln!(out, "{pool:<16} {reason:<24} {n:>9}  {first}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_policy_objects_and_tenants() {
        let status = serde_json::json!({
            "policies": {"generation": 4, "directory_generation": 2,
                "objects": [{"kind": "RoutePolicy", "name": "ml/canary", "observed_generation": 3,
                    "serving": "last good (generation 2)",
                    "conditions": [{"type": "Accepted", "status": "False", "reason": "Invalid",
                        "message": "spec.action.retries: `99`: must be 0 to 16"},
                        {"type": "ResolvedRefs", "status": "True", "reason": "ResolvedRefs", "message": "ok"}]}],
                "file_errors": [{"file": "/p/bad.yaml", "error": "document 1: not YAML"}],
                "tenants": [{"name": "team-a", "priority": 5, "weight": 3, "cache_isolation": "isolated",
                    "quotas": {"prompt_tokens_per_s": 5000.0, "requests_per_s": null},
                    "local_share": {"prompt_tokens_per_s": 1250.0}}]}
        });
        let text = render(&status);
        let row = text.lines().find(|l| l.starts_with("RoutePolicy")).unwrap();
        assert!(
            row.contains("ml/canary")
                && row.contains("last good (generation 2)")
                && row.contains("Invalid")
                && row.contains("True"),
            "{row}"
        );
        assert!(
            text.contains("    Accepted: spec.action.retries: `99`: must be 0 to 16"),
            "{text}"
        );
        assert!(
            text.contains("file /p/bad.yaml: document 1: not YAML"),
            "{text}"
        );
        let t = text.lines().find(|l| l.starts_with("team-a")).unwrap();
        assert!(
            t.contains("isolated") && t.contains("5000 prompt tok/s (1250)"),
            "{t}"
        );
        assert!(!render(&serde_json::json!({})).contains("POLICIES"));
    }

    #[test]
    fn renders_the_kubernetes_section() {
        let kind = |l, r| serde_json::json!({"lists": l, "restarts": r, "errors": 0});
        let status = serde_json::json!({"pods": [], "kubernetes": {
            "pods": kind(2, 1), "inference_pools": kind(1, 0), "services": kind(1, 0),
            "services_intercepted": [
                {"service": "ml/chat", "port": 8000, "pool": "chat", "vips": ["10.96.0.10:8000"], "note": null},
                {"service": "ml/headless", "port": 8000, "pool": "chat", "vips": [], "note": "headless"}],
            "status_writer": {"leader": true, "writes": 3}}});
        let text = render(&status);
        let line = |start: &str| {
            text.lines()
                .find(|l| l.starts_with(start))
                .unwrap_or_else(|| panic!("{start}: {text}"))
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(line("pods "), "pods lists 2 watch restarts 1 errors 0");
        assert_eq!(
            line("intercepting     ml/chat"),
            "intercepting ml/chat port 8000 -> pool chat: 10.96.0.10:8000"
        );
        assert_eq!(
            line("intercepting     ml/headless"),
            "intercepting ml/headless port 8000 -> pool chat: no VIP (headless)"
        );
        assert_eq!(
            line("status writer"),
            "status writer this agent (holds the Lease; 3 writes)"
        );
        // Off-cluster: no section.
        assert!(!render(&serde_json::json!({"pods": []})).contains("KUBERNETES"));
    }

    #[test]
    fn renders_tenants_and_pods() {
        let status = serde_json::json!({
            "policy": "Precise", "model": "m",
            "tenants": [{"tenant": "team-a", "window_s": 60.0, "requests": 120, "errors": 2,
                "requests_per_s": 2.0, "prompt_tokens_per_s": 900.0, "output_tokens_per_s": 64.0,
                "cache_hit_pct": 81.25, "ttft_ms_p50": 12.5, "ttft_ms_p90": 40.0, "ttft_ms_p99": null,
                "receipts": {"requests": 100, "available_tokens": 8000, "captured_tokens": 6400,
                    "delivered_tokens": 4800, "shortfall_requests": 7, "capture_pct": 80.0,
                    "delivery_pct": 75.0}}],
            "pods": [{"load": {"endpoint": "127.0.0.1:8100", "state": "unready", "in_flight": 3, "requests": 50,
                "engine": {"waiting": 1, "kv_cache_usage": 0.5}},
                "index": {"entries": 1234, "state": "unsure"}, "prefix_source": "history"}],
            "pools": [{"name": "llama", "unkeyed": {"template": 3},
                "unkeyed_first_error": {"template": "chat template: roles must alternate"}}]
        });
        let text = render(&status);
        assert!(text.contains("TENANTS (last 60 s)"), "{text}");
        let row = text.lines().find(|l| l.starts_with("team-a")).unwrap();
        assert!(
            row.contains("2.00")
                && row.contains("81.2%")
                && row.contains("12.5ms")
                && row.ends_with('-'),
            "{row}"
        );
        assert!(text.contains("ROUTE RECEIPTS"), "{text}");
        let receipt = text
            .lines()
            .filter(|l| l.starts_with("team-a"))
            .nth(1)
            .unwrap();
        assert_eq!(
            receipt.split_whitespace().collect::<Vec<_>>(),
            [
                "team-a", "100", "8000", "6400", "4800", "80.0%", "75.0%", "7"
            ],
            "{receipt}"
        );
        let pod = text
            .lines()
            .find(|l| l.starts_with("127.0.0.1:8100"))
            .unwrap();
        assert!(
            pod.contains("1234")
                && pod.contains("unsure")
                && pod.contains("50.0%")
                && pod.contains("unready")
                && pod.ends_with("history"),
            "{pod}"
        );
        assert!(text.contains("ROUTED WITHOUT PREFIX KEYS"), "{text}");
        let row = text.lines().find(|l| l.starts_with("llama")).unwrap();
        assert!(
            row.contains("template") && row.contains(" 3  chat template: roles must alternate"),
            "{row}"
        );
    }

    #[test]
    fn no_unkeyed_section_without_unkeyed_requests() {
        let status = serde_json::json!({"pools": [{"name": "p", "unkeyed": {}}]});
        assert!(!render(&status).contains("WITHOUT PREFIX KEYS"));
        // A status from an agent without receipts (older, or no usage yet): no table.
        let status = serde_json::json!({"tenants": [{"tenant": "a", "window_s": 60.0,
            "requests": 1, "errors": 0, "requests_per_s": 0.1, "prompt_tokens_per_s": 1.0,
            "output_tokens_per_s": 1.0, "cache_hit_pct": 0.0, "ttft_ms_p50": null,
            "ttft_ms_p90": null, "ttft_ms_p99": null}]});
        let text = render(&status);
        assert!(
            text.contains("TENANTS") && !text.contains("ROUTE RECEIPTS"),
            "{text}"
        );
    }
}
