//! Who sent a request: one function over configured identity sources, in order.
//!
//! 1. `workload`: the verified source workload. First, on a connection intercepted by the
//!    eBPF data path, the client's cgroup ([`CgroupDirectory`], [`cgroups`]): off-cluster
//!    the configuration's cgroup directories (`tenants.cgroups`), on Kubernetes the pod
//!    whose cgroup it is (`k8s::identity::cgroup`) matched against the `Tenant`s' workload
//!    selectors. The kernel sets the id, so no client can claim another's. Then the source
//!    address: off-cluster a CIDR table (longest prefix wins); on Kubernetes a pod directory
//!    ([`Workloads`], `k8s::identity`) is asked first: the pod at the source address,
//!    matched against the selectors ([`WorkloadSelectors`]: service account, then pod
//!    labels, then namespace), then the CIDR table ([`LayeredDirectory`]). Interception
//!    keeps the client's real source address, so this cannot be spoofed either.
//! 2. `header`: a request header (`x-warmpath-tenant` by default), believed ONLY when the
//!    connection comes from a source listed as trusted (a gateway that authenticates users).
//! 3. the default tenant.
//!
//! Names are checked (1..=64 characters of `[A-Za-z0-9._:/-]`); a malformed header value is
//! ignored like an absent one. Cardinality is bounded where series are created
//! ([`crate::telemetry::Telemetry::tenant`]), not here.

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
    sync::Arc,
};

use ipnet::IpNet;

use crate::http::Headers;

pub mod cgroups;

/// Header a trusted gateway sets.
pub const DEFAULT_HEADER: &str = "x-warmpath-tenant";
/// Tenant of requests nobody claims.
pub const DEFAULT_TENANT: &str = "default";
/// Longest tenant name accepted.
const MAX_NAME: usize = 64;

/// A source of identity, in the order the policy lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IdentitySource {
    /// The client workload, from the connection's source address.
    Workload,
    /// A header, from trusted sources only.
    Header,
}

/// How a request's tenant was found (for status and debug logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// The client's cgroup (intercepted connections).
    Cgroup,
    Workload,
    Header,
    Default,
}

/// Maps a client address to the tenant of the workload there.
pub trait WorkloadDirectory: std::fmt::Debug + Send + Sync {
    fn tenant_of(&self, addr: IpAddr) -> Option<Arc<str>>;
}

/// Maps the cgroup a client's socket was opened from (its cgroup v2 id, which the kernel
/// records for intercepted connections) to the tenant of the workload there.
pub trait CgroupDirectory: std::fmt::Debug + Send + Sync {
    fn tenant_of_cgroup(&self, cgroup_id: u64) -> Option<Arc<str>>;
}

/// One cgroup directory first, then another (on Kubernetes: the pods' cgroups, then the
/// configuration's `tenants.cgroups`).
#[derive(Debug)]
pub struct LayeredCgroups {
    pub first: Arc<dyn CgroupDirectory>,
    pub then: Arc<dyn CgroupDirectory>,
}

impl CgroupDirectory for LayeredCgroups {
    fn tenant_of_cgroup(&self, cgroup_id: u64) -> Option<Arc<str>> {
        self.first
            .tenant_of_cgroup(cgroup_id)
            .or_else(|| self.then.tenant_of_cgroup(cgroup_id))
    }
}

/// The off-cluster directory: CIDR -> tenant, longest prefix first.
#[derive(Debug, Default, Clone)]
pub struct CidrTable {
    /// Sorted by prefix length, longest first.
    entries: Vec<(IpNet, Arc<str>)>,
}

impl CidrTable {
    pub fn new(entries: impl IntoIterator<Item = (IpNet, String)>) -> Result<Self, String> {
        let mut entries = entries
            .into_iter()
            .map(|(net, name)| {
                check_name(&name).map(|()| (net.trunc(), Arc::<str>::from(name.as_str())))
            })
            .collect::<Result<Vec<_>, _>>()?;
        entries.sort_by_key(|(net, _)| std::cmp::Reverse(net.prefix_len()));
        Ok(Self { entries })
    }
}

impl WorkloadDirectory for CidrTable {
    fn tenant_of(&self, addr: IpAddr) -> Option<Arc<str>> {
        let addr = canonical(addr);
        self.entries
            .iter()
            .find(|(net, _)| net.contains(&addr))
            .map(|(_, name)| name.clone())
    }
}

/// A client workload (on Kubernetes, a pod) as `Tenant` identity selectors see it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Workload {
    pub namespace: String,
    pub name: String,
    /// `spec.serviceAccountName` (`default` when the pod names none).
    pub service_account: String,
    pub labels: BTreeMap<String, String>,
}

/// Which selector claimed a workload, most specific first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Claim {
    ServiceAccount,
    PodLabels,
    Namespace,
}

/// The `Tenant`s' workload selectors (`spec.identity.serviceAccounts`, `podLabels`,
/// `namespaces`), compiled. A workload is claimed by the most specific selector that
/// matches: its service account, else the pod-label selector with the most labels (ties:
/// the first tenant by name), else its namespace; source CIDRs come after all three.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct WorkloadSelectors {
    /// `namespace/name` -> tenant.
    service_accounts: HashMap<String, Arc<str>>,
    /// Most labels first, then tenant name.
    labels: Vec<(BTreeMap<String, String>, Arc<str>)>,
    namespaces: HashMap<String, Arc<str>>,
}

// === impl WorkloadSelectors ===

impl WorkloadSelectors {
    /// Adds one tenant's selectors. Of two tenants claiming the same namespace or service
    /// account (policy validation rejects the second) the one added first keeps it; an
    /// empty label selector claims nothing.
    pub fn add(
        &mut self,
        tenant: &Arc<str>,
        namespaces: &[String],
        service_accounts: &[String],
        pod_labels: Option<&BTreeMap<String, String>>,
    ) {
        for ns in namespaces {
            self.namespaces
                .entry(ns.clone())
                .or_insert_with(|| tenant.clone());
        }
        for sa in service_accounts {
            self.service_accounts
                .entry(sa.clone())
                .or_insert_with(|| tenant.clone());
        }
        if let Some(labels) = pod_labels.filter(|l| !l.is_empty()) {
            self.labels.push((labels.clone(), tenant.clone()));
            self.labels
                .sort_by(|(a, ta), (b, tb)| b.len().cmp(&a.len()).then_with(|| ta.cmp(tb)));
        }
    }

    /// No tenant selects workloads.
    pub fn is_empty(&self) -> bool {
        self.service_accounts.is_empty() && self.labels.is_empty() && self.namespaces.is_empty()
    }

    /// The tenant that claims `w`, and by which selector.
    pub fn tenant_of(&self, w: &Workload) -> Option<(Arc<str>, Claim)> {
        if !self.service_accounts.is_empty() {
            let sa = format!("{}/{}", w.namespace, w.service_account);
            if let Some(t) = self.service_accounts.get(&sa) {
                return Some((t.clone(), Claim::ServiceAccount));
            }
        }
        let by_labels = self
            .labels
            .iter()
            .find(|(sel, _)| sel.iter().all(|(k, v)| w.labels.get(k) == Some(v)));
        if let Some((_, t)) = by_labels {
            return Some((t.clone(), Claim::PodLabels));
        }
        self.namespaces
            .get(&w.namespace)
            .map(|t| (t.clone(), Claim::Namespace))
    }
}

/// Client workloads by address (on Kubernetes, `k8s::identity`'s pod directory): answers
/// [`WorkloadDirectory::tenant_of`] from a map of address -> tenant recomputed whenever its
/// pods or its selectors change, so a request costs one hash lookup.
pub trait Workloads: WorkloadDirectory {
    /// Matches workloads against `selectors` from now on (a policy set was compiled).
    fn select(&self, selectors: Arc<WorkloadSelectors>);
}

/// The workload directory first, then the CIDR table.
#[derive(Debug)]
pub struct LayeredDirectory {
    pub workloads: Arc<dyn WorkloadDirectory>,
    pub cidrs: CidrTable,
}

impl WorkloadDirectory for LayeredDirectory {
    fn tenant_of(&self, addr: IpAddr) -> Option<Arc<str>> {
        self.workloads
            .tenant_of(addr)
            .or_else(|| self.cidrs.tenant_of(addr))
    }
}

/// Everything tenant resolution needs; one value per pool policy.
#[derive(Debug, Clone)]
pub struct TenantPolicy {
    pub order: Vec<IdentitySource>,
    pub directory: Arc<dyn WorkloadDirectory>,
    /// Tenants by client cgroup (intercepted connections), asked before `directory`.
    pub cgroups: Option<Arc<dyn CgroupDirectory>>,
    /// The configuration's CIDR rules (what `directory` was built from off-cluster), kept so
    /// that declared `Tenant`s can be merged with them ([`crate::policy`]).
    pub cidrs: Vec<(IpNet, String)>,
    pub header: http::HeaderName,
    /// Sources whose tenant header is believed, for any tenant.
    pub trusted: Vec<IpNet>,
    /// Sources believed when the header names this tenant (a `Tenant`'s `headerSources`).
    pub header_sources: HashMap<Arc<str>, Vec<IpNet>>,
    pub default_tenant: Arc<str>,
}

impl Default for TenantPolicy {
    fn default() -> Self {
        Self {
            order: vec![IdentitySource::Workload, IdentitySource::Header],
            directory: Arc::new(CidrTable::default()),
            cgroups: None,
            cidrs: Vec::new(),
            header: http::HeaderName::from_static(DEFAULT_HEADER),
            trusted: Vec::new(),
            header_sources: HashMap::new(),
            default_tenant: Arc::from(DEFAULT_TENANT),
        }
    }
}

impl TenantPolicy {
    /// The tenant of a request from `peer` carrying `headers`.
    pub fn resolve(&self, peer: Option<IpAddr>, headers: &Headers) -> (Arc<str>, Via) {
        self.resolve_client(peer, None, headers)
    }

    /// The tenant of a request from `peer`, on a connection opened from cgroup `cgroup`
    /// when it was intercepted, carrying `headers`.
    pub fn resolve_client(
        &self,
        peer: Option<IpAddr>,
        cgroup: Option<u64>,
        headers: &Headers,
    ) -> (Arc<str>, Via) {
        let peer = peer.map(canonical);
        for source in &self.order {
            match source {
                IdentitySource::Workload => {
                    if let Some(name) = cgroup.and_then(|id| self.tenant_of_cgroup(id)) {
                        return (name, Via::Cgroup);
                    }
                    if let Some(name) = peer.and_then(|p| self.directory.tenant_of(p)) {
                        return (name, Via::Workload);
                    }
                }
                IdentitySource::Header => {
                    let Some(peer) = peer else { continue };
                    if let Some(name) = headers
                        .get(self.header.as_str())
                        .and_then(|v| std::str::from_utf8(v).ok())
                        .filter(|v| check_name(v).is_ok())
                        .filter(|v| self.header_trusted(peer, v))
                    {
                        return (Arc::from(name), Via::Header);
                    }
                }
            }
        }
        (self.default_tenant.clone(), Via::Default)
    }
}

impl TenantPolicy {
    /// The tenant whose workload runs in cgroup `cgroup_id`, if a cgroup selector claims it
    /// (also for the kernel's per-cgroup counters of steered connections).
    pub fn tenant_of_cgroup(&self, cgroup_id: u64) -> Option<Arc<str>> {
        self.cgroups.as_ref()?.tenant_of_cgroup(cgroup_id)
    }

    /// Whether `peer` may name `tenant` in the header: a source trusted for every tenant,
    /// or one of that tenant's own `headerSources`.
    pub fn header_trusted(&self, peer: IpAddr, tenant: &str) -> bool {
        self.trusted.iter().any(|n| n.contains(&peer))
            || self
                .header_sources
                .get(tenant)
                .is_some_and(|nets| nets.iter().any(|n| n.contains(&peer)))
    }
}

/// Tenant names become metric attributes: short, printable, no quoting needed.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:/-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "tenant name `{name}`: expected 1 to {MAX_NAME} characters of A-Z a-z 0-9 . _ : / -"
        ))
    }
}

/// IPv4-mapped IPv6 peers (dual-stack listeners) are matched as IPv4.
fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(addr, IpAddr::V4),
        v4 => v4,
    }
}

/// Parses `NAME=CIDR` (a `--tenant-cidr` rule).
pub fn parse_cidr_rule(s: &str) -> Result<(IpNet, String), String> {
    let (name, net) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: expected NAME=CIDR, e.g. team-a=127.0.0.2/32"))?;
    check_name(name)?;
    Ok((parse_net(net)?, name.to_string()))
}

/// Parses a CIDR, or a bare address as a single-host network.
pub fn parse_net(s: &str) -> Result<IpNet, String> {
    s.parse::<IpNet>()
        .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| format!("`{s}`: expected a CIDR such as 127.0.0.0/8 or an address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> TenantPolicy {
        TenantPolicy {
            directory: Arc::new(
                CidrTable::new([
                    (parse_net("127.0.0.0/8").unwrap(), "loopback".into()),
                    (parse_net("127.0.0.2").unwrap(), "team-a".into()),
                ])
                .unwrap(),
            ),
            trusted: vec![parse_net("127.0.0.9/32").unwrap()],
            order: vec![IdentitySource::Header, IdentitySource::Workload],
            ..TenantPolicy::default()
        }
    }

    fn headers(tenant: &str) -> Headers {
        let mut h = http::HeaderMap::new();
        h.insert(DEFAULT_HEADER, tenant.parse().unwrap());
        Headers::Map(h)
    }

    #[test]
    fn longest_prefix_wins_and_mapped_v6_is_v4() {
        let p = policy();
        let none = Headers::default();
        assert_eq!(
            &*p.resolve(Some("127.0.0.2".parse().unwrap()), &none).0,
            "team-a"
        );
        assert_eq!(
            &*p.resolve(Some("127.0.0.3".parse().unwrap()), &none).0,
            "loopback"
        );
        assert_eq!(
            &*p.resolve(Some("::ffff:127.0.0.2".parse().unwrap()), &none)
                .0,
            "team-a"
        );
        assert_eq!(
            p.resolve(Some("::1".parse().unwrap()), &none).1,
            Via::Default
        );
        assert_eq!(p.resolve(None, &none).1, Via::Default);
    }

    #[test]
    fn header_is_believed_only_from_trusted_sources() {
        let p = policy();
        let trusted = Some("127.0.0.9".parse().unwrap());
        let untrusted = Some("127.0.0.2".parse().unwrap());
        assert_eq!(
            p.resolve(trusted, &headers("team-z")),
            (Arc::from("team-z"), Via::Header)
        );
        // Header first in the order, but the source is not trusted: the workload decides.
        assert_eq!(
            p.resolve(untrusted, &headers("team-z")),
            (Arc::from("team-a"), Via::Workload)
        );
        // A malformed value from a trusted source is ignored, not used as a label.
        assert_eq!(p.resolve(trusted, &headers("a b")).1, Via::Workload);
    }

    /// Cgroup 42 is team-c's.
    #[derive(Debug)]
    struct OneCgroup;
    impl CgroupDirectory for OneCgroup {
        fn tenant_of_cgroup(&self, cgroup_id: u64) -> Option<Arc<str>> {
            (cgroup_id == 42).then(|| Arc::from("team-c"))
        }
    }

    #[test]
    fn the_cgroup_decides_first_within_the_workload_source() {
        let p = TenantPolicy {
            cgroups: Some(Arc::new(OneCgroup)),
            order: vec![IdentitySource::Workload, IdentitySource::Header],
            ..policy()
        };
        let trusted = Some("127.0.0.9".parse().unwrap());
        let team_a = Some("127.0.0.2".parse().unwrap());
        // Before the source address and a trusted header alike.
        assert_eq!(
            p.resolve_client(team_a, Some(42), &headers("team-z")),
            (Arc::from("team-c"), Via::Cgroup)
        );
        assert_eq!(
            p.resolve_client(trusted, Some(42), &headers("team-z")),
            (Arc::from("team-c"), Via::Cgroup)
        );
        // A cgroup nobody claims, or none: as before.
        assert_eq!(
            p.resolve_client(team_a, Some(7), &headers("team-z")),
            (Arc::from("team-a"), Via::Workload)
        );
        assert_eq!(
            p.resolve_client(None, None, &headers("team-z")),
            (Arc::from("default"), Via::Default)
        );
        assert_eq!(p.tenant_of_cgroup(42).as_deref(), Some("team-c"));
        assert_eq!(p.tenant_of_cgroup(7), None);
        // Header first in the order: a trusted gateway's header wins over its own cgroup.
        let header_first = TenantPolicy {
            order: vec![IdentitySource::Header, IdentitySource::Workload],
            ..p.clone()
        };
        assert_eq!(
            header_first.resolve_client(trusted, Some(42), &headers("team-z")),
            (Arc::from("team-z"), Via::Header)
        );
        assert_eq!(
            header_first.resolve_client(team_a, Some(42), &headers("team-z")),
            (Arc::from("team-c"), Via::Cgroup)
        );
    }

    #[test]
    fn layered_cgroups_ask_the_first_then_the_second() {
        #[derive(Debug)]
        struct Seven;
        impl CgroupDirectory for Seven {
            fn tenant_of_cgroup(&self, cgroup_id: u64) -> Option<Arc<str>> {
                (cgroup_id == 7 || cgroup_id == 42).then(|| Arc::from("seven"))
            }
        }
        let layered = LayeredCgroups {
            first: Arc::new(OneCgroup),
            then: Arc::new(Seven),
        };
        assert_eq!(layered.tenant_of_cgroup(42).as_deref(), Some("team-c"));
        assert_eq!(layered.tenant_of_cgroup(7).as_deref(), Some("seven"));
        assert_eq!(layered.tenant_of_cgroup(8), None);
    }

    #[test]
    fn rules_parse_with_clear_errors() {
        assert_eq!(
            parse_cidr_rule("team-a=127.0.0.2/32").unwrap(),
            (parse_net("127.0.0.2/32").unwrap(), "team-a".to_string())
        );
        assert!(parse_cidr_rule("team-a").unwrap_err().contains("NAME=CIDR"));
        assert!(
            parse_cidr_rule("a b=127.0.0.1")
                .unwrap_err()
                .contains("tenant name")
        );
        assert!(parse_cidr_rule("x=300.0.0.1").unwrap_err().contains("CIDR"));
        assert!(check_name(&"x".repeat(65)).is_err());
    }
}
