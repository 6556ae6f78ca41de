//! Conflicts between the objects of one set (everything the agent would load together).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::route::{NormalMatch, NormalTarget};
use crate::policy::resources::{FieldError, Resource, RoutePolicy, Tenant};

/// The conflicts in a set, each as the key ([`Resource::key`]) of the object rejected and
/// the field at fault. The rules, independent of the order of `rs` except the first:
///
/// 1. A kind and key given twice: the later one in `rs` is rejected (`metadata.name`); only
///    the first takes part in the other checks.
/// 2. Two `RoutePolicy`s of one namespace (references resolve in the policy's namespace)
///    with the same `targetRef` (models in any order) and the same set of matches (entries
///    and their conditions in any order; no matches is one entry without conditions): they
///    would apply to exactly the same requests, so precedence could only fall back to
///    names. Every one but the first by name is rejected (`spec.matches`).
/// 3. Two `Tenant`s claiming the same CIDR (the same network, however written), namespace
///    or service account: the source would belong to both. Tenants are taken in name
///    order; a tenant claiming what an accepted one claims is rejected at that entry
///    (`spec.identity.cidrs[i]`, `namespaces[i]`, `serviceAccounts[i]`), and its own claims
///    then count for nothing. Overlapping CIDRs of different lengths do not conflict: the
///    longest prefix wins.
///
/// Objects are not checked one by one here ([`super::validate`] does): an entry that does
/// not parse simply claims nothing, but an object with errors elsewhere still takes part.
/// A caller deciding what serves passes the objects that would serve (those `validate`
/// accepts, or their last good versions), so a broken object cannot push out a good one.
pub fn validate_set(rs: &[Resource]) -> Vec<(String, FieldError)> {
    validate_set_indexed(rs)
        .into_iter()
        .map(|(i, e)| (rs[i].key(), e))
        .collect()
}

/// [`validate_set`] with each rejected object named by its index in `rs` (a key given twice
/// names two objects; the index says which).
pub fn validate_set_indexed(rs: &[Resource]) -> Vec<(usize, FieldError)> {
    let mut out = Vec::new();
    let mut first: HashMap<(&str, String), usize> = HashMap::new();
    let mut policies = Vec::new();
    let mut tenants = Vec::new();
    for (i, r) in rs.iter().enumerate() {
        let key = r.key();
        if let Some(&j) = first.get(&(r.kind(), key.clone())) {
            out.push((
                i,
                FieldError {
                    path: "metadata.name".into(),
                    value: r.metadata().name.clone().unwrap_or_default(),
                    message: format!(
                        "{} {key} is given twice: the one read first (object {}) is used",
                        r.kind(),
                        j + 1
                    ),
                },
            ));
            continue;
        }
        first.insert((r.kind(), key), i);
        match r {
            Resource::RoutePolicy(p) => policies.push((i, p)),
            Resource::Tenant(t) => tenants.push((i, t)),
        }
    }
    route_conflicts(&policies, &mut out);
    tenant_conflicts(&tenants, &mut out);
    out.sort_by_key(|(i, _)| *i);
    out
}

fn route_conflicts(policies: &[(usize, &RoutePolicy)], out: &mut Vec<(usize, FieldError)>) {
    type Group = (String, NormalTarget, BTreeSet<NormalMatch>);
    let mut groups: BTreeMap<Group, Vec<(String, usize)>> = BTreeMap::new();
    for &(i, p) in policies {
        let ns = p
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let target = NormalTarget::of(&p.spec.target_ref);
        // No matches holds for every request, as one entry without conditions does.
        let mut matches: BTreeSet<NormalMatch> =
            p.spec.matches.iter().map(NormalMatch::of).collect();
        if matches.is_empty() {
            matches.insert(NormalMatch::of(&Default::default()));
        }
        let name = p.metadata.name.clone().unwrap_or_default();
        groups
            .entry((ns, target, matches))
            .or_default()
            .push((name, i));
    }
    for ((ns, _, _), mut members) in groups {
        members.sort();
        let Some(((winner, _), rest)) = members.split_first() else {
            continue;
        };
        for (_, i) in rest {
            out.push((
                *i,
                FieldError {
                    path: "spec.matches".into(),
                    value: String::new(),
                    message: format!(
                        "the same targetRef and matches as RoutePolicy {ns}/{winner}: both would apply to exactly the same requests (merge them, or make one more specific); the first by name is kept"
                    ),
                },
            ));
        }
    }
}

fn tenant_conflicts(tenants: &[(usize, &Tenant)], out: &mut Vec<(usize, FieldError)>) {
    let mut sorted: Vec<_> = tenants.to_vec();
    sorted.sort_by_key(|(_, t)| t.metadata.name.clone());
    // What each accepted tenant claims, by claim, and who claims it.
    let mut claimed: HashMap<(&str, String), &str> = HashMap::new();
    for (i, t) in sorted {
        let name = t.metadata.name.as_deref().unwrap_or("");
        let id = &t.spec.identity;
        let mut claims: Vec<(&str, usize, &String, String)> = Vec::new();
        for (j, s) in id.cidrs.iter().enumerate() {
            if let Ok(n) = super::tenant::net(s) {
                claims.push(("cidrs", j, s, n.to_string()));
            }
        }
        for (j, s) in id.namespaces.iter().enumerate() {
            claims.push(("namespaces", j, s, s.clone()));
        }
        for (j, s) in id.service_accounts.iter().enumerate() {
            claims.push(("serviceAccounts", j, s, s.clone()));
        }
        let before = out.len();
        for (field, j, written, claim) in &claims {
            if let Some(owner) = claimed.get(&(*field, claim.clone())) {
                out.push((
                    i,
                    FieldError {
                        path: format!("spec.identity.{field}[{j}]"),
                        value: (*written).clone(),
                        message: format!(
                            "also claimed by Tenant {owner}: a client belongs to one tenant (the first by name keeps it)"
                        ),
                    },
                ));
            }
        }
        if out.len() == before {
            for (field, _, _, claim) in claims {
                claimed.insert((field, claim), name);
            }
        }
    }
}

#[cfg(test)]
mod tests;
