use super::*;

/// A pod as the API server sends it: `edit` changes the JSON first.
fn pod(name: &str, ip: &str, edit: impl FnOnce(&mut serde_json::Value)) -> Pod {
    let mut v = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": "ml", "uid": format!("uid-{name}"),
            "resourceVersion": "10", "labels": {"app": "vllm"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"},
        },
        "spec": {"nodeName": "node-a", "containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]},
        "status": {
            "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "True"},
            ],
        },
    });
    edit(&mut v);
    serde_json::from_value(v).unwrap()
}

fn annotated(pairs: &[(&str, &str)]) -> impl FnOnce(&mut serde_json::Value) {
    let pairs: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |v| {
        for (k, val) in pairs {
            v["metadata"]["annotations"][k] = serde_json::Value::String(val);
        }
    }
}

/// The endpoint a plain ready pod at `ip` becomes, on node-a, port 8000.
fn plain(ip: &str, origin: &str) -> EndpointSpec {
    EndpointSpec {
        authority: format!("{ip}:8000"),
        metrics_url: format!("http://{ip}:8000/metrics"),
        kv_events: None,
        kv_replay: None,
        kv_topic: String::new(),
        dp_rank: None,
        local: true,
        routable: true,
        origin: origin.into(),
    }
}

fn one(p: Pod) -> Translation {
    translate(8000, [p], Some("node-a"))
}

#[test]
fn readiness_and_termination() {
    let cases: Vec<(&str, Pod, Option<bool>)> = vec![
        ("ready", pod("a", "10.0.0.1", |_| {}), Some(true)),
        (
            "not ready",
            pod("a", "10.0.0.1", |v| {
                v["status"]["conditions"][1]["status"] = "False".into()
            }),
            Some(false),
        ),
        (
            "no conditions",
            pod("a", "10.0.0.1", |v| {
                v["status"]["conditions"] = serde_json::json!([])
            }),
            Some(false),
        ),
        (
            "pending with an IP",
            pod("a", "10.0.0.1", |v| v["status"]["phase"] = "Pending".into()),
            Some(false),
        ),
        (
            "terminating, still Ready",
            pod("a", "10.0.0.1", |v| {
                v["metadata"]["deletionTimestamp"] = "2026-12-01T15:00:00Z".into()
            }),
            Some(false),
        ),
        (
            "no IP yet",
            pod("a", "", |v| v["status"]["phase"] = "Pending".into()),
            None,
        ),
        (
            "no status",
            pod("a", "10.0.0.1", |v| {
                v.as_object_mut().unwrap().remove("status");
            }),
            None,
        ),
        (
            "succeeded",
            pod("a", "10.0.0.1", |v| {
                v["status"]["phase"] = "Succeeded".into()
            }),
            None,
        ),
        (
            "failed",
            pod("a", "10.0.0.1", |v| v["status"]["phase"] = "Failed".into()),
            None,
        ),
    ];
    for (case, p, routable) in cases {
        let t = one(p);
        assert_eq!(
            t.endpoints.iter().map(|e| e.routable).collect::<Vec<_>>(),
            routable.into_iter().collect::<Vec<_>>(),
            "{case}"
        );
        assert!(t.problems.is_empty(), "{case}: {:?}", t.problems);
    }
}

#[test]
fn address_node_and_origin() {
    assert_eq!(
        one(pod("a", "10.0.0.1", |_| {})).endpoints,
        vec![plain("10.0.0.1", "ml/a")]
    );
    let v6 = one(pod("b", "fd00:231::5", |_| {})).endpoints;
    assert_eq!(v6[0].authority, "[fd00:231::5]:8000");
    assert_eq!(v6[0].metrics_url, "http://[fd00:231::5]:8000/metrics");
    // Another node's pod, and an agent that does not know its node: not local.
    let other = pod("c", "10.0.0.3", |v| v["spec"]["nodeName"] = "node-b".into());
    assert!(!translate(8000, [&other], Some("node-a")).endpoints[0].local);
    assert!(!translate(8000, [&other], None).endpoints[0].local);
    let bad = one(pod("d", "10.0.0.999", |_| {}));
    assert!(bad.endpoints.is_empty());
    assert_eq!(bad.problems[0].pod, "ml/d");
    assert!(bad.problems[0].message.contains("not an IP"));
}

#[test]
fn annotations() {
    let ep = |ip: &str| plain(ip, "ml/a");
    type Annotations<'a> = &'a [(&'a str, &'a str)];
    let cases: Vec<(&str, Annotations, Vec<EndpointSpec>)> = vec![
        ("none: no events", &[], vec![ep("10.0.0.1")]),
        (
            "events as a port",
            &[(KV_EVENTS, "5557")],
            vec![EndpointSpec {
                kv_events: Some("tcp://10.0.0.1:5557".into()),
                ..ep("10.0.0.1")
            }],
        ),
        (
            "vLLM's own bind address, replay, topic and metrics port",
            &[
                (KV_EVENTS, "tcp://*:5557"),
                (KV_REPLAY, "tcp://0.0.0.0:5657"),
                (KV_TOPIC, "kv@llama"),
                (METRICS_PORT, "9100"),
            ],
            vec![EndpointSpec {
                metrics_url: "http://10.0.0.1:9100/metrics".into(),
                kv_events: Some("tcp://10.0.0.1:5557".into()),
                kv_replay: Some("tcp://10.0.0.1:5657".into()),
                kv_topic: "kv@llama".into(),
                ..ep("10.0.0.1")
            }],
        ),
        (
            "the pod's own IP, explicitly",
            &[(KV_EVENTS, "tcp://10.0.0.1:5557")],
            vec![EndpointSpec {
                kv_events: Some("tcp://10.0.0.1:5557".into()),
                ..ep("10.0.0.1")
            }],
        ),
        (
            "IPv6 any",
            &[(KV_EVENTS, "tcp://[::]:5557")],
            vec![EndpointSpec {
                kv_events: Some("tcp://10.0.0.1:5557".into()),
                ..ep("10.0.0.1")
            }],
        ),
        (
            "one DP rank is no rank",
            &[(KV_EVENTS, "5557"), (DP_RANKS, "1")],
            vec![EndpointSpec {
                kv_events: Some("tcp://10.0.0.1:5557".into()),
                ..ep("10.0.0.1")
            }],
        ),
        (
            "three DP ranks: one endpoint each, port + rank",
            &[(KV_EVENTS, "5557"), (KV_REPLAY, "5657"), (DP_RANKS, "3")],
            (0..3u16)
                .map(|r| EndpointSpec {
                    kv_events: Some(format!("tcp://10.0.0.1:{}", 5557 + r)),
                    kv_replay: Some(format!("tcp://10.0.0.1:{}", 5657 + r)),
                    dp_rank: Some(u32::from(r)),
                    ..ep("10.0.0.1")
                })
                .collect(),
        ),
    ];
    for (case, pairs, want) in cases {
        let t = one(pod("a", "10.0.0.1", annotated(pairs)));
        assert_eq!(t.endpoints, want, "{case}");
        assert!(t.problems.is_empty(), "{case}: {:?}", t.problems);
    }
}

#[test]
fn bad_annotations_route_without_events_and_say_why() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[(KV_EVENTS, "five")],
            "warmpath.dev/kv-events: `five`: expected a port",
        ),
        (&[(KV_EVENTS, "0")], "expected a port"),
        (&[(KV_EVENTS, "tcp://*")], "no port"),
        (&[(KV_EVENTS, "tcp://*:99999")], "`99999` is not a port"),
        (&[(KV_EVENTS, "ipc:///tmp/kv")], "inside the pod"),
        (&[(KV_EVENTS, "tcp://127.0.0.1:5557")], "loopback"),
        (&[(KV_EVENTS, "tcp://[::1]:5557")], "loopback"),
        (&[(KV_EVENTS, "tcp://vllm.ml:5557")], "not an IP address"),
        (
            &[(KV_EVENTS, "tcp://10.0.9.9:5557")],
            "not this pod's address",
        ),
        (
            &[(KV_REPLAY, "5657")],
            "kv-replay needs warmpath.dev/kv-events",
        ),
        (&[(DP_RANKS, "2")], "dp-ranks needs warmpath.dev/kv-events"),
        (&[(KV_EVENTS, "5557"), (DP_RANKS, "0")], "expected 1 to 64"),
        (&[(KV_EVENTS, "5557"), (DP_RANKS, "65")], "expected 1 to 64"),
        (&[(KV_EVENTS, "5557"), (DP_RANKS, "-1")], "expected 1 to 64"),
        (
            &[(KV_EVENTS, "65534"), (DP_RANKS, "4")],
            "rank 2 would publish beyond port 65535",
        ),
    ];
    for (pairs, why) in cases {
        let t = one(pod("a", "10.0.0.1", annotated(pairs)));
        assert_eq!(t.endpoints, vec![plain("10.0.0.1", "ml/a")], "{pairs:?}");
        let [p] = t.problems.as_slice() else {
            panic!("{pairs:?}: {:?}", t.problems)
        };
        assert_eq!((p.pod.as_str(), p.uid.as_str()), ("ml/a", "uid-a"));
        assert!(
            p.message.contains(why) && p.message.ends_with("routed without KV events"),
            "{pairs:?}: want {why}: {}",
            p.message
        );
    }
    let long = "t".repeat(MAX_TOPIC_LEN + 1);
    let t = one(pod(
        "a",
        "10.0.0.1",
        annotated(&[(KV_EVENTS, "5557"), (KV_TOPIC, &long)]),
    ));
    assert_eq!(t.endpoints, vec![plain("10.0.0.1", "ml/a")]);
    assert!(t.problems[0].message.contains("256 bytes, at most 255"));
    // A bad metrics port keeps the events and reads metrics on the serving port.
    let t = one(pod(
        "a",
        "10.0.0.1",
        annotated(&[(KV_EVENTS, "5557"), (METRICS_PORT, "http")]),
    ));
    assert_eq!(
        t.endpoints,
        vec![EndpointSpec {
            kv_events: Some("tcp://10.0.0.1:5557".into()),
            ..plain("10.0.0.1", "ml/a")
        }]
    );
    assert!(
        t.problems[0]
            .message
            .contains("metrics-port: `http` is not a port (1 to 65535); metrics read on port 8000"),
        "{:?}",
        t.problems
    );
}

#[test]
fn many_pods_ordered_one_per_address() {
    let pods = [
        pod("b", "10.0.0.2", |_| {}),
        pod("a", "10.0.0.1", |_| {}),
        // A terminating pod and its replacement that got the same IP: the routable one.
        pod("old", "10.0.0.3", |v| {
            v["metadata"]["deletionTimestamp"] = "2026-12-01T15:00:00Z".into()
        }),
        pod("new", "10.0.0.3", |_| {}),
        pod("gone", "10.0.0.4", |v| {
            v["status"]["phase"] = "Failed".into()
        }),
    ];
    let got = endpoints_of(8000, &pods, Some("node-a"));
    assert_eq!(
        got,
        vec![
            plain("10.0.0.1", "ml/a"),
            plain("10.0.0.2", "ml/b"),
            plain("10.0.0.3", "ml/new"),
        ]
    );
    assert_eq!(endpoints_of(8000, pods.iter().rev(), Some("node-a")), got);
}

#[test]
fn slimming_keeps_what_the_translation_reads() {
    let mut p = pod(
        "a",
        "10.0.0.1",
        annotated(&[(KV_EVENTS, "tcp://*:5557"), (DP_RANKS, "2")]),
    );
    p.metadata.deletion_timestamp = None;
    let before = one(p.clone());
    slim(&mut p);
    assert_eq!(one(p.clone()), before);
    let annotations = p.metadata.annotations.unwrap();
    assert_eq!(
        annotations.keys().collect::<Vec<_>>(),
        [DP_RANKS, KV_EVENTS]
    );
    assert!(p.metadata.labels.is_none());
    assert!(p.spec.unwrap().containers.is_empty());
    let conditions = p.status.unwrap().conditions.unwrap();
    assert_eq!(conditions.len(), 1);
    assert_eq!(conditions[0].type_, "Ready");
}
