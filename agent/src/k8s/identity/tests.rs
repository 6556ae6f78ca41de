//! Pods to tenants, table-driven: each row is a client address and the tenant it must
//! resolve to, written from the precedence in docs/policy.md (service account, pod labels,
//! namespace, then CIDRs), not from the code.

use std::collections::BTreeMap;

use super::*;
use crate::tenant::{CidrTable, LayeredDirectory, TenantPolicy, parse_net};

fn pod(ns: &str, name: &str, sa: &str, labels: &[(&str, &str)], ips: &[&str]) -> Pod {
    pod_with(ns, name, sa, labels, ips, "Running", false)
}

fn pod_with(
    ns: &str,
    name: &str,
    sa: &str,
    labels: &[(&str, &str)],
    ips: &[&str],
    phase: &str,
    host_network: bool,
) -> Pod {
    let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
    let pod_ips: Vec<_> = ips.iter().map(|ip| serde_json::json!({"ip": ip})).collect();
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}"), "labels": labels},
        "spec": {"containers": [], "serviceAccountName": sa, "hostNetwork": host_network},
        "status": {"phase": phase, "podIP": ips.first(), "podIPs": pod_ips},
    }))
    .expect("a valid Pod")
}

fn labels(l: &[(&str, &str)]) -> BTreeMap<String, String> {
    l.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Tenants (added in name order, as compiling does): team-a claims namespace `a`; team-b
/// claims the service account `a/batch`; gpu-users claims pods labelled `gpu: "yes"`;
/// gpu-prod pods labelled `gpu: "yes", env: prod` (more labels: more specific); labels-tie-x
/// and labels-tie-y both claim `tie: "1"` (the first by name wins).
fn selectors() -> Arc<WorkloadSelectors> {
    let mut s = WorkloadSelectors::default();
    s.add(
        &Arc::from("gpu-prod"),
        &[],
        &[],
        Some(&labels(&[("gpu", "yes"), ("env", "prod")])),
    );
    s.add(
        &Arc::from("gpu-users"),
        &[],
        &[],
        Some(&labels(&[("gpu", "yes")])),
    );
    s.add(
        &Arc::from("labels-tie-x"),
        &[],
        &[],
        Some(&labels(&[("tie", "1")])),
    );
    s.add(
        &Arc::from("labels-tie-y"),
        &[],
        &[],
        Some(&labels(&[("tie", "1")])),
    );
    s.add(&Arc::from("team-a"), &["a".into()], &[], None);
    s.add(&Arc::from("team-b"), &[], &["a/batch".into()], None);
    s.add(&Arc::from("nothing"), &[], &[], Some(&BTreeMap::new()));
    Arc::new(s)
}

fn pods() -> Vec<Pod> {
    vec![
        pod("a", "web", "default", &[], &["10.0.0.1", "fd00::1"]),
        pod("a", "batch-1", "batch", &[("gpu", "yes")], &["10.0.0.2"]),
        pod("a", "gpu-1", "default", &[("gpu", "yes")], &["10.0.0.3"]),
        pod(
            "b",
            "gpu-2",
            "default",
            &[("gpu", "yes"), ("env", "prod")],
            &["10.0.0.4"],
        ),
        pod("b", "tie", "default", &[("tie", "1")], &["10.0.0.5"]),
        pod("b", "plain", "default", &[], &["10.0.0.6"]),
        pod_with("a", "host", "default", &[], &["10.0.0.7"], "Running", true),
        pod_with(
            "a",
            "done",
            "default",
            &[],
            &["10.0.0.8"],
            "Succeeded",
            false,
        ),
        pod("c", "batch-2", "batch", &[], &["10.0.0.9"]),
    ]
}

#[test]
fn pods_resolve_to_tenants_by_the_most_specific_selector() {
    let dir = Arc::new(PodDirectory::default());
    dir.replace_pods(&pods());
    dir.select(selectors());
    let layered = TenantPolicy {
        directory: Arc::new(LayeredDirectory {
            workloads: dir.clone(),
            cidrs: CidrTable::new([(parse_net("10.0.0.0/24").unwrap(), "by-cidr".to_string())])
                .unwrap(),
        }),
        ..TenantPolicy::default()
    };
    let none = crate::http::Headers::default();
    let cases = [
        ("10.0.0.1", "team-a", "namespace a"),
        ("fd00::1", "team-a", "its IPv6 address too"),
        (
            "10.0.0.2",
            "team-b",
            "service account before labels and namespace",
        ),
        ("10.0.0.3", "gpu-users", "labels before namespace"),
        ("10.0.0.4", "gpu-prod", "the selector with more labels"),
        (
            "10.0.0.5",
            "labels-tie-x",
            "a tie: the first tenant by name",
        ),
        ("10.0.0.6", "by-cidr", "a pod no selector claims: its CIDR"),
        ("10.0.0.7", "by-cidr", "host network: not a pod identity"),
        ("10.0.0.8", "by-cidr", "a finished pod: not an identity"),
        (
            "10.0.0.9",
            "by-cidr",
            "service account a/batch is namespace a's only",
        ),
        ("::ffff:10.0.0.1", "team-a", "IPv4-mapped IPv6 as IPv4"),
        ("10.0.1.1", "default", "no pod, no CIDR"),
    ];
    for (ip, want, why) in cases {
        let (got, _) = layered.resolve(Some(ip.parse().unwrap()), &none);
        assert_eq!(&*got, want, "{ip}: {why}");
    }
    assert_eq!(dir.len(), 7, "host-network and finished pods are not kept");
    let w = dir.workload_of("10.0.0.2".parse().unwrap()).unwrap();
    assert_eq!(
        (
            w.namespace.as_str(),
            w.name.as_str(),
            w.service_account.as_str()
        ),
        ("a", "batch-1", "batch")
    );
    assert_eq!(dir.workload_by_uid("uid-gpu-1").unwrap().name, "gpu-1");
}

#[test]
fn changes_to_pods_and_selectors_recompute_the_map() {
    let dir = PodDirectory::default();
    let ip: IpAddr = "10.0.0.1".parse().unwrap();
    assert_eq!(dir.tenant_of(ip), None);
    dir.apply_pod(&pod("a", "web", "default", &[], &["10.0.0.1"]));
    assert_eq!(dir.tenant_of(ip), None, "no selectors yet");
    dir.select(selectors());
    assert_eq!(dir.tenant_of(ip).as_deref(), Some("team-a"));
    // Relabelled: now the gpu tenant's.
    dir.apply_pod(&pod(
        "a",
        "web",
        "default",
        &[("gpu", "yes")],
        &["10.0.0.1"],
    ));
    assert_eq!(dir.tenant_of(ip).as_deref(), Some("gpu-users"));
    // Replaced by a pod of another namespace at the same address, the old one finishing.
    dir.apply_pod(&pod_with(
        "a",
        "web",
        "default",
        &[],
        &["10.0.0.1"],
        "Pending",
        false,
    ));
    dir.apply_pod(&pod("b", "new", "default", &[], &["10.0.0.1"]));
    assert_eq!(
        dir.tenant_of(ip),
        None,
        "the running pod (namespace b) wins"
    );
    dir.delete_pod(&pod("b", "new", "default", &[], &["10.0.0.1"]));
    assert_eq!(dir.tenant_of(ip).as_deref(), Some("team-a"));
    // A relist without the pod removes it.
    dir.replace_pods(&[pod("a", "other", "default", &[], &["10.0.0.2"])]);
    assert_eq!(dir.tenant_of(ip), None);
    assert_eq!(
        dir.tenant_of("10.0.0.2".parse().unwrap()).as_deref(),
        Some("team-a")
    );
    // Selectors emptied: nobody is claimed.
    dir.select(Arc::new(WorkloadSelectors::default()));
    assert_eq!(dir.tenant_of("10.0.0.2".parse().unwrap()), None);
}

#[test]
fn the_active_policy_matches_tenant_selectors_through_the_directory() {
    use crate::policy::{active::ActivePolicy, documents};
    let text = r#"
apiVersion: warmpath.dev/v1alpha1
kind: Tenant
metadata: {name: ml-team}
spec:
  identity: {namespaces: [ml]}
---
apiVersion: warmpath.dev/v1alpha1
kind: Tenant
metadata: {name: batch}
spec:
  identity: {serviceAccounts: [ml/batch], cidrs: [10.9.0.0/16]}
"#;
    let resources = documents::parse("t.yaml", text).unwrap();
    let active = ActivePolicy::new(TenantPolicy::default());
    let dir = Arc::new(PodDirectory::default());
    dir.replace_pods(&[
        pod("ml", "notebook", "default", &[], &["10.1.0.1"]),
        pod("ml", "job", "batch", &[], &["10.1.0.2"]),
    ]);
    active.set_workloads(dir.clone());
    let set = active.apply(resources);
    let none = crate::http::Headers::default();
    let tenant = |ip: &str| {
        let set = active.current();
        set.identity.resolve(Some(ip.parse().unwrap()), &none).0
    };
    assert_eq!(&*tenant("10.1.0.1"), "ml-team");
    assert_eq!(&*tenant("10.1.0.2"), "batch");
    assert_eq!(&*tenant("10.9.3.4"), "batch", "CIDRs still apply");
    assert_eq!(&*tenant("10.2.0.1"), "default");
    // On Kubernetes workload selectors are in effect: no off-cluster warning.
    let ml = set
        .resolved
        .iter()
        .find(|(_, k, _)| k == "ml-team")
        .unwrap();
    assert_eq!(
        (ml.2.status.as_str(), ml.2.reason.as_str()),
        ("True", "ResolvedRefs")
    );
    // A pod appearing later is identified without a new policy set.
    dir.apply_pod(&pod("ml", "late", "default", &[], &["10.1.0.3"]));
    assert_eq!(&*tenant("10.1.0.3"), "ml-team");
}
