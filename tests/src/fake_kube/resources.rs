//! The resource kinds the fake serves (group, version, plural, kind, scope) and how a
//! request path names one of them.

/// One kind of object the fake stores and serves, as the API server's discovery names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceType {
    /// API group; empty for the core group (`/api/v1`).
    pub group: &'static str,
    pub version: &'static str,
    /// The path segment (`pods`).
    pub plural: &'static str,
    /// `kind` of one object (`Pod`); the list is `{kind}List`.
    pub kind: &'static str,
    pub namespaced: bool,
    /// Whether `/status` is a subresource: writes to the object keep its old `status`, and
    /// writes to `/status` change nothing but `status` (as for CRDs declaring the
    /// subresource, and for pods).
    pub status_subresource: bool,
    /// Field selector keys accepted besides `metadata.name` and `metadata.namespace`; any
    /// other key is refused with 400, as the real server refuses unsupported field labels.
    pub extra_fields: &'static [&'static str],
}

pub const PODS: ResourceType = ResourceType {
    group: "",
    version: "v1",
    plural: "pods",
    kind: "Pod",
    namespaced: true,
    status_subresource: true,
    extra_fields: &[
        "spec.nodeName",
        "spec.serviceAccountName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "status.phase",
        "status.podIP",
    ],
};

pub const SERVICES: ResourceType = ResourceType {
    group: "",
    version: "v1",
    plural: "services",
    kind: "Service",
    namespaced: true,
    status_subresource: true,
    extra_fields: &["spec.type", "spec.clusterIP"],
};

pub const INFERENCE_POOLS: ResourceType = ResourceType {
    group: "inference.networking.k8s.io",
    version: "v1",
    plural: "inferencepools",
    kind: "InferencePool",
    namespaced: true,
    status_subresource: true,
    extra_fields: &[],
};

pub const ROUTE_POLICIES: ResourceType = ResourceType {
    group: "warmpath.dev",
    version: "v1alpha1",
    plural: "routepolicies",
    kind: "RoutePolicy",
    namespaced: true,
    status_subresource: true,
    extra_fields: &[],
};

pub const TENANTS: ResourceType = ResourceType {
    group: "warmpath.dev",
    version: "v1alpha1",
    plural: "tenants",
    kind: "Tenant",
    namespaced: false,
    status_subresource: true,
    extra_fields: &[],
};

pub const LEASES: ResourceType = ResourceType {
    group: "coordination.k8s.io",
    version: "v1",
    plural: "leases",
    kind: "Lease",
    namespaced: true,
    status_subresource: false,
    extra_fields: &[],
};

/// The kinds a fake serves unless its builder is given others.
pub const DEFAULT_RESOURCES: [ResourceType; 6] = [
    PODS,
    SERVICES,
    INFERENCE_POOLS,
    ROUTE_POLICIES,
    TENANTS,
    LEASES,
];

impl ResourceType {
    /// `apiVersion` of its objects: `v1` or `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Whether `key` may be used in a field selector on this kind.
    pub(crate) fn supports_field(&self, key: &str) -> bool {
        key == "metadata.name" || key == "metadata.namespace" || self.extra_fields.contains(&key)
    }
}

/// What a request path names, once its kind is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// Index into the fake's resource table.
    pub kind: usize,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub status: bool,
}

/// What a path under `/api` or `/apis` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PathKind<'a> {
    /// `/api`, `/apis`, `/apis/{group}` or `/apis/{group}/{version}`: discovery.
    Discovery {
        group: Option<&'a str>,
        version: Option<&'a str>,
    },
    /// A resource collection, object or subresource.
    Resource {
        group: &'a str,
        version: &'a str,
        namespace: Option<&'a str>,
        plural: &'a str,
        name: Option<&'a str>,
        subresource: Option<&'a str>,
    },
}

/// Splits a request path into what it names; None when it is no API path at all.
pub(crate) fn parse_path(path: &str) -> Option<PathKind<'_>> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segments.as_slice() {
        ["api"] => {
            return Some(PathKind::Discovery {
                group: Some(""),
                version: None,
            });
        }
        ["apis"] => {
            return Some(PathKind::Discovery {
                group: None,
                version: None,
            });
        }
        ["api", "v1"] => {
            return Some(PathKind::Discovery {
                group: Some(""),
                version: Some("v1"),
            });
        }
        ["apis", group] => {
            return Some(PathKind::Discovery {
                group: Some(group),
                version: None,
            });
        }
        ["apis", group, version] => {
            return Some(PathKind::Discovery {
                group: Some(group),
                version: Some(version),
            });
        }
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, plural, rest @ ..] => (Some(*ns), [&[*plural][..], rest].concat()),
        _ => (None, rest.to_vec()),
    };
    let (plural, name, subresource) = match rest.as_slice() {
        [plural] => (*plural, None, None),
        [plural, name] => (*plural, Some(*name), None),
        [plural, name, sub] => (*plural, Some(*name), Some(*sub)),
        _ => return None,
    };
    if [Some(plural), namespace, name]
        .into_iter()
        .flatten()
        .any(str::is_empty)
    {
        return None;
    }
    Some(PathKind::Resource {
        group,
        version,
        namespace,
        plural,
        name,
        subresource,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_collections_objects_and_status() {
        assert_eq!(
            parse_path("/api/v1/namespaces/ns1/pods/p1/status"),
            Some(PathKind::Resource {
                group: "",
                version: "v1",
                namespace: Some("ns1"),
                plural: "pods",
                name: Some("p1"),
                subresource: Some("status"),
            })
        );
        assert_eq!(
            parse_path("/apis/warmpath.dev/v1alpha1/tenants"),
            Some(PathKind::Resource {
                group: "warmpath.dev",
                version: "v1alpha1",
                namespace: None,
                plural: "tenants",
                name: None,
                subresource: None,
            })
        );
        assert_eq!(
            parse_path("/apis/warmpath.dev/v1alpha1"),
            Some(PathKind::Discovery {
                group: Some("warmpath.dev"),
                version: Some("v1alpha1"),
            })
        );
        assert_eq!(parse_path("/healthz"), None);
        assert_eq!(parse_path("/api/v1/namespaces//pods"), None);
        assert_eq!(parse_path("/api/v1/a/b/c/d"), None);
    }
}
