//! Tenants compiled: identity (CIDRs, header sources, workload selectors), priority,
//! weight, quotas and cache isolation.

use std::{collections::HashMap, sync::Arc};

use ipnet::IpNet;

use super::{QuotaLimits, TenantRule, condition};
use crate::{
    policy::resources::{CacheIsolation, Condition, Tenant},
    tenant::{CidrTable, LayeredDirectory, TenantPolicy, WorkloadSelectors, Workloads},
};

/// The tenants' identity (the configuration's CIDRs and trusted sources, then each
/// tenant's; on Kubernetes their workload selectors, matched through `workloads` before
/// CIDRs), their rules and their workload selectors.
pub(super) fn compile_tenants(
    base: &TenantPolicy,
    tenants: &[&Tenant],
    workloads: Option<&Arc<dyn Workloads>>,
    resolved: &mut Vec<(&'static str, String, Condition)>,
) -> (
    TenantPolicy,
    HashMap<Arc<str>, Arc<TenantRule>>,
    WorkloadSelectors,
) {
    let mut identity = base.clone();
    let mut cidrs: Vec<(IpNet, String)> = base.cidrs.clone();
    let mut rules = HashMap::new();
    let mut selectors = WorkloadSelectors::default();
    // In name order: of two tenants claiming one namespace or service account, the first
    // by name keeps it (as validation decides).
    let mut tenants = tenants.to_vec();
    tenants.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for t in tenants {
        let name = t.metadata.name.clone().unwrap_or_default();
        let mut problems = Vec::new();
        for c in &t.spec.identity.cidrs {
            match crate::tenant::parse_net(c) {
                Ok(net) => cidrs.push((net, name.clone())),
                Err(e) => problems.push(e),
            }
        }
        let mut sources = Vec::new();
        for c in &t.spec.identity.header_sources {
            match crate::tenant::parse_net(c) {
                Ok(net) => sources.push(net),
                Err(e) => problems.push(e),
            }
        }
        let name_arc: Arc<str> = Arc::from(name.as_str());
        if !sources.is_empty() {
            identity.header_sources.insert(name_arc.clone(), sources);
        }
        let id = &t.spec.identity;
        selectors.add(
            &name_arc,
            &id.namespaces,
            &id.service_accounts,
            id.pod_labels.as_ref().map(|l| &l.match_labels),
        );
        let k8s_only = workloads.is_none()
            && t.spec.identity.cidrs.is_empty()
            && t.spec.identity.header_sources.is_empty()
            && (!t.spec.identity.namespaces.is_empty()
                || !t.spec.identity.service_accounts.is_empty()
                || t.spec.identity.pod_labels.is_some());
        let quotas = match t
            .spec
            .quotas
            .as_ref()
            .map(QuotaLimits::from_spec)
            .transpose()
        {
            Ok(q) => q.filter(|q| !q.is_unlimited()),
            Err(e) => {
                problems.push(e.to_string());
                None
            }
        };
        let (ok, reason, message) = if !problems.is_empty() {
            (false, "Invalid", problems.join("; "))
        } else if k8s_only {
            (
                false,
                "WorkloadSelectorsInactive",
                "namespaces, serviceAccounts and podLabels identify clients on Kubernetes only; off-cluster this tenant is named by nothing (add cidrs or headerSources)".to_string(),
            )
        } else {
            (
                true,
                "ResolvedRefs",
                "identity selectors in effect".to_string(),
            )
        };
        resolved.push((
            "Tenant",
            name.clone(),
            condition("ResolvedRefs", ok, reason, message, t.metadata.generation),
        ));
        rules.insert(
            name_arc.clone(),
            Arc::new(TenantRule {
                name: name_arc,
                priority: t.spec.priority,
                weight: t.spec.weight.max(1),
                quotas,
                isolated: t.spec.cache_isolation == CacheIsolation::Isolated,
            }),
        );
    }
    match CidrTable::new(cidrs) {
        Ok(table) => {
            identity.directory = match workloads {
                Some(w) => Arc::new(LayeredDirectory {
                    workloads: w.clone(),
                    cidrs: table,
                }),
                None => Arc::new(table),
            }
        }
        Err(e) => tracing::warn!("tenant CIDRs: {e}; keeping the configuration's"),
    }
    (identity, rules, selectors)
}
