//! Pinned state across agents (issue #20; docs/ebpf.md "Pinning and adoption"): a pinned
//! map of another layout is replaced, not adopted; an earlier agent's VIPs, steered VIPs and
//! excluded cgroups that the new agent does not name are removed; and an agent that cannot
//! intercept serves as an explicit proxy, saying why once.
//!
//! Root only (the fallback test drops to uid 65534 itself). The first two tests load the
//! programs in this process (`Redirector::load_pinned`, as the agent does) under a pin
//! directory of their own; the third runs the agent in a child process.
#![allow(clippy::unwrap_used)] // test binary: a failed unwrap is a failed test

use std::{net::SocketAddr, path::Path, time::Duration};

use aya::maps::{HashMap, Map, MapData, MapInfo};
use warmpath_agent::ebpf::{
    ChildCgroup, Endpoint, LAYOUTS, Layout, Redirector, Replaced, cgroup_id, cgroup2_root,
    replace_mismatched,
};
use warmpath_e2e::{agent_process::AgentProcess, gate, pods::PinDir, sim::Fleet};

const WAIT: Duration = Duration::from_secs(15);

#[test]
#[ignore = "entry point of the agent child process (agent_process.rs)"]
fn agent_process() {
    warmpath_e2e::agent_process::child_main();
}

fn map_path(dir: &Path, name: &str) -> std::path::PathBuf {
    dir.join("maps").join(name)
}

fn layout_at(dir: &Path, name: &str) -> Layout {
    Layout::of(&MapInfo::from_pin(map_path(dir, name)).unwrap()).unwrap()
}

/// The keys of the pinned hash map `name` (at most a handful in these tests).
fn pinned_keys<K: aya::Pod, V: aya::Pod>(dir: &Path, name: &str) -> Vec<K> {
    let data = MapData::from_pin(map_path(dir, name)).unwrap();
    let map: HashMap<MapData, K, V> = Map::from_map_data(data).unwrap().try_into().unwrap();
    map.keys().map(Result::unwrap).collect()
}

fn endpoint(a: SocketAddr) -> Endpoint {
    match a {
        SocketAddr::V4(a) => Endpoint::v4(a.ip().octets(), a.port()),
        SocketAddr::V6(a) => Endpoint::v6(a.ip().octets(), a.port()),
    }
}

#[test]
fn a_pinned_map_of_another_layout_is_replaced_not_adopted() {
    if !gate::bpf_available("a_pinned_map_of_another_layout_is_replaced_not_adopted") {
        return;
    }
    let pins = PinDir::new(&format!("layout-{}", std::process::id()));
    // A first load pins every map: each has the layout the table says.
    drop(Redirector::load_pinned(&pins.path).unwrap());
    for (name, want) in LAYOUTS {
        assert_eq!(layout_at(&pins.path, name), want, "{name}");
    }
    // An "older agent" left WARMPATH_SERVICES as a hash of 8-byte keys, 4-byte values and 64
    // entries (the exclusion map's layout, pinned under the services name).
    let services = map_path(&pins.path, "WARMPATH_SERVICES");
    std::fs::remove_file(&services).unwrap();
    MapData::from_pin(map_path(&pins.path, "WARMPATH_EXCLUDED"))
        .unwrap()
        .pin(&services)
        .unwrap();
    assert_eq!(
        replace_mismatched(&pins.path).unwrap(),
        vec![Replaced {
            map: "WARMPATH_SERVICES",
            differences: "key 8 B (want 20 B), value 4 B (want 20 B), max entries 64 (want 4096)"
                .into(),
        }]
    );
    assert!(!services.exists(), "unpinned");
    // The next agent's load creates it afresh and it works; the other maps were adopted.
    let mut r = Redirector::load_pinned(&pins.path).unwrap();
    assert_eq!(replace_mismatched(&pins.path).unwrap(), vec![]);
    for (name, want) in LAYOUTS {
        assert_eq!(layout_at(&pins.path, name), want, "{name}");
    }
    let vip: SocketAddr = "10.96.0.40:8000".parse().unwrap();
    r.set_redirect(vip, "10.231.0.1:8080".parse::<SocketAddr>().unwrap())
        .unwrap();
    assert_eq!(
        pinned_keys::<Endpoint, Endpoint>(&pins.path, "WARMPATH_SERVICES"),
        vec![endpoint(vip)]
    );
    drop(r);
    gate::announce("bpf: pins: WARMPATH_SERVICES of another layout replaced, not adopted");
}

#[test]
fn an_earlier_agents_vips_steering_and_exclusions_are_reconciled_on_adoption() {
    if !gate::bpf_available(
        "an_earlier_agents_vips_steering_and_exclusions_are_reconciled_on_adoption",
    ) {
        return;
    }
    let pid = std::process::id();
    let pins = PinDir::new(&format!("reconcile-{pid}"));
    let root = cgroup2_root().unwrap();
    let parent = ChildCgroup::create(&root, &format!("warmpath-test-reconcile-{pid}")).unwrap();
    let old_agent = ChildCgroup::create(parent.path(), "old-agent").unwrap();
    let new_agent = ChildCgroup::create(parent.path(), "new-agent").unwrap();
    let listener: SocketAddr = "10.231.0.1:8080".parse().unwrap();
    // Where the earlier agent sent the VIP it alone named.
    let old_listener: SocketAddr = "10.231.0.1:8081".parse().unwrap();
    let (kept, dropped): (SocketAddr, SocketAddr) = (
        "10.96.0.41:8000".parse().unwrap(),
        "10.96.0.42:8000".parse().unwrap(),
    );

    // The earlier agent: two VIPs, the second steered and sent to a listener of its own, its
    // own cgroup excluded; attached (links pinned) and gone.
    let mut first = Redirector::load_pinned(&pins.path).unwrap();
    first.set_redirect(kept, listener).unwrap();
    first.set_redirect(dropped, old_listener).unwrap();
    first.set_steer(dropped, true).unwrap();
    let old_id = first.exclude_cgroup(old_agent.path()).unwrap();
    first.attach(parent.path()).unwrap();
    drop(first);
    // Its links as another process's (link pins are named after the pinning pid, and this
    // process plays both agents).
    for entry in std::fs::read_dir(pins.path.join("links")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        let earlier = name.replace(&format!("-{pid}"), "-1");
        std::fs::rename(&path, path.with_file_name(earlier)).unwrap();
    }
    assert_eq!(
        pinned_keys::<u64, u32>(&pins.path, "WARMPATH_EXCLUDED"),
        vec![old_id]
    );

    // The new agent names only `kept` and excludes its own cgroup: at attach the rest goes.
    let mut second = Redirector::load_pinned(&pins.path).unwrap();
    second.set_redirect(kept, listener).unwrap();
    let new_id = second.exclude_cgroup(new_agent.path()).unwrap();
    second.attach(parent.path()).unwrap();
    assert_eq!(
        pinned_keys::<Endpoint, Endpoint>(&pins.path, "WARMPATH_SERVICES"),
        vec![endpoint(kept)],
        "the dropped VIP is no longer intercepted"
    );
    let steer = pinned_keys::<Endpoint, u32>(&pins.path, "WARMPATH_STEER");
    assert_eq!(steer, vec![], "nothing steered");
    assert_eq!(
        pinned_keys::<u64, u32>(&pins.path, "WARMPATH_EXCLUDED"),
        vec![new_id],
        "only the new agent's cgroup is excluded"
    );
    assert_eq!(
        pinned_keys::<Endpoint, u32>(&pins.path, "WARMPATH_LISTENERS"),
        vec![endpoint(listener)],
        "the earlier agent's listener is gone with its VIP"
    );
    assert_eq!(cgroup_id(new_agent.path()).unwrap(), new_id);
    drop(second);
    drop(pins);
    gate::announce(&format!(
        "bpf: pins: reconciled on adoption (VIP {dropped}, its steering and its listener {old_listener} removed, excluded {old_id} -> {new_id})"
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_cannot_intercept_says_why_once_and_serves_as_an_explicit_proxy() {
    if !gate::bpf_available(
        "an_agent_that_cannot_intercept_says_why_once_and_serves_as_an_explicit_proxy",
    ) {
        return;
    }
    let fleet = Fleet::tiny(1, &[]).await;
    let endpoint = fleet.url(0);
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--endpoint",
        &endpoint,
        "--explain",
        "--redirect",
        "10.96.0.43:8000=127.0.0.1:8080",
    ];
    // Unprivileged: loading eBPF programs is refused, for a reason the agent can name. The
    // test binary is world-executable where cargo builds it.
    let exe = std::env::current_exe().unwrap();
    let agent = AgentProcess::start_as(&args, &[("RUST_LOG", "info")], 65534, &exe)
        .unwrap_or_else(|e| panic!("the agent did not start: {e:?}"));
    let line = agent
        .wait_for_log(&["interception off:", "serving as an explicit proxy"], WAIT)
        .await;
    assert!(
        line.contains("loading eBPF programs needs root") && line.contains("uid 65534"),
        "names why: {line}"
    );
    let body =
        serde_json::json!({"model": "sim-llama", "prompt": "explicitly proxied", "max_tokens": 2});
    let response = reqwest::Client::new()
        .post(format!("http://{}/v1/completions", agent.listen))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let pod = response
        .headers()
        .get("x-warmpath-pod")
        .map(|v| v.to_str().unwrap().to_string());
    assert_eq!(
        pod.as_deref(),
        Some(endpoint.trim_start_matches("http://")),
        "routed to the simulator"
    );
    let stderr = agent.stderr();
    assert_eq!(
        stderr.matches("interception off:").count(),
        1,
        "said once:\n{stderr}"
    );
    assert!(!stderr.contains("interception attached"), "{stderr}");
    gate::announce(&format!("bpf: fallback: {line}"));
}
