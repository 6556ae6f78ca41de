//! The declarative resources, group `warmpath.dev`, version `v1alpha1`: [`RoutePolicy`]
//! (namespaced) and [`Tenant`] (cluster-scoped: a tenant's name is its identity in metrics
//! and quotas everywhere). The Rust types are the schema: `warmpath crds` prints the
//! CustomResourceDefinitions derived from them (kube + schemars), docs/policy.md's field
//! tables are generated from the same schema, and off-cluster the same YAML documents are
//! read from `--policy-dir`.
//!
//! Unknown fields are errors everywhere (`deny_unknown_fields`), so a typo is reported
//! with its field path instead of silently ignored.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group.
pub const GROUP: &str = "warmpath.dev";
/// The API version.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of every resource.
pub const API_VERSION: &str = "warmpath.dev/v1alpha1";

/// How requests to a pool are routed: which requests it applies to and what it does with
/// them. Of the policies that match a request, the most specific wins (docs/policy.md,
/// "Precedence"); the pool's own configuration applies when none matches.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "warmpath.dev",
    version = "v1alpha1",
    kind = "RoutePolicy",
    derive = "PartialEq",
    namespaced,
    status = "ResourceStatus",
    shortname = "wrp",
    printcolumn = r#"{"name":"Accepted","type":"string","jsonPath":".status.conditions[?(@.type==\"Accepted\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RoutePolicySpec {
    /// The pool the policy applies to: exactly one of `pool`, `service` or `selector`.
    pub target_ref: TargetRef,
    /// Requests the policy applies to: any one of these matches (OR); none listed: every
    /// request to the target.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub matches: Vec<Match>,
    /// What the policy does with a matching request.
    #[serde(default)]
    pub action: Action,
}

/// The pool a policy applies to.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TargetRef {
    /// A Gateway API Inference Extension `InferencePool` by name, in the policy's namespace:
    /// the configured pool that follows it (`inferencePool`); a pool that follows none (as
    /// off-cluster) by its `name` in the configuration file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<PoolRef>,
    /// A Service and port whose traffic the agent intercepts: the pool a
    /// `kubernetes.intercept` entry of the policy's namespace sends it to; off-cluster, a
    /// pool that lists it in its `services`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceRef>,
    /// Pools whose pods all carry these labels: whose `labels` (configuration file) or, for a
    /// `selector` pool, `matchLabels` include them; on Kubernetes only pools whose pods are
    /// in the policy's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// Only requests naming one of these models (base model or LoRA adapter); empty: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
}

/// A reference to an `InferencePool`.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolRef {
    /// Defaults to `inference.networking.k8s.io`.
    #[serde(default = "default_pool_group")]
    pub group: String,
    /// Defaults to `InferencePool`.
    #[serde(default = "default_pool_kind")]
    pub kind: String,
    /// The `InferencePool`'s name; off-cluster, the pool's `name` in the configuration file.
    pub name: String,
}

fn default_pool_group() -> String {
    "inference.networking.k8s.io".into()
}

fn default_pool_kind() -> String {
    "InferencePool".into()
}

/// A Service port.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceRef {
    /// The Service's name, in the policy's namespace.
    pub name: String,
    /// 1-65535.
    pub port: u16,
}

/// Label equality (the `matchLabels` of a Kubernetes label selector).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelector {
    /// Labels that must all be present, each with this value.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
}

/// One set of conditions a request must all meet (AND); absent ones always hold.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Match {
    /// The request's model is one of these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    /// The request's path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathMatch>,
    /// Request headers, each equal to its value (names are case-insensitive).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<HeaderMatch>,
    /// The request's tenant (a `Tenant` name, or `default`) is one of these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tenants: Vec<String>,
}

/// A path condition: exactly one of `exact` or `prefix`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PathMatch {
    /// The whole path, compared exactly (`/v1/chat/completions`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact: Option<String>,
    /// Matches whole segments: `/v1` matches `/v1/completions`, not `/v1x`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
}

/// A header equal to a value.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HeaderMatch {
    /// Header name (case-insensitive).
    pub name: String,
    /// Its value, compared byte for byte.
    pub value: String,
}

/// What a policy does. Every field is optional: absent ones keep the pool's configuration.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Action {
    /// The scorer weights to start from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<Preset>,
    /// Scorer weight overrides (>= 0): `prefix`, `queue`, `kvUsage`, `lora`, `session`,
    /// `inFlight`, `history`, `stall`, `kvRoom`, `evict` (docs/routing.md).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub weights: BTreeMap<String, f64>,
    /// The longest a cold request waits at the router, while the pod it was ranked to has
    /// no KV room, for warm requests to go first (presets precise and
    /// approximate; 0: never; default: the preset's, 150 ms; at most 10000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_yield_ms: Option<u64>,
    /// Where prompt tokens come from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<TokenSpec>,
    /// Session affinity key (the `session` preset and scorer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionSpec>,
    /// Other endpoints tried when one fails before the first response byte (0-16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeouts: Option<Timeouts>,
    /// When no pod can be scored (none ready, or a prefix preset with no trusted index):
    /// `failOpen` routes to any ready pod by load, `failClosed` answers 503.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_mode: Option<FailureMode>,
    /// Traffic split by weight across pools or model names (canary, blue/green); empty: the
    /// request stays on its pool and model.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub split: Vec<SplitTarget>,
    /// `proxy` (through the agent) or `steer` (connections steered in the kernel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<DataPathMode>,
    /// Add `x-warmpath-*` response headers explaining each decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explain: Option<bool>,
}

impl From<Preset> for crate::routing::Policy {
    /// The routing policy a preset names.
    fn from(p: Preset) -> Self {
        use crate::routing::Policy;
        match p {
            Preset::Precise => Policy::Precise,
            Preset::Approximate => Policy::Approximate,
            Preset::RoundRobin => Policy::RoundRobin,
            Preset::LeastLoaded => Policy::LeastLoaded,
            Preset::Session => Policy::Session,
        }
    }
}

/// The routing presets (docs/routing.md).
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Preset {
    Precise,
    Approximate,
    RoundRobin,
    LeastLoaded,
    Session,
}

/// A token source.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenSpec {
    pub source: TokenSourceKind,
    /// Tokenizer directory (`tokenizer.json`, `tokenizer_config.json`), source
    /// `huggingface` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<String>,
}

/// Where prompt tokens come from.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum TokenSourceKind {
    Builtin,
    Huggingface,
    Engine,
    Approximate,
}

/// Where a request's session key is read.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionSpec {
    /// Header carrying the session key (default `x-session-id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// Cookie carrying it when the header is absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie: Option<String>,
}

/// Engine timeouts, in milliseconds (> 0).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Timeouts {
    /// Longest wait per attempt for the engine's complete response head.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_head_ms: Option<u64>,
    /// An engine's response body silent this long is cut off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_idle_ms: Option<u64>,
}

/// What happens when no pod can be scored.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum FailureMode {
    /// Route to any ready pod by load (the default).
    #[default]
    FailOpen,
    /// Answer 503.
    FailClosed,
}

/// One way of a traffic split.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SplitTarget {
    /// The pool to send this share to (a pool name; default: the request's pool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// The model name to rewrite the request to (default: unchanged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Relative weight (0-10000; 0 drains this way). Requests with a session key always
    /// take the same way.
    pub weight: u32,
}

/// The data path of a route.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum DataPathMode {
    /// Through the agent's proxy (every request routed).
    #[default]
    Proxy,
    /// Whole connections steered in the kernel (docs/ebpf.md).
    Steer,
}

/// Who a tenant is, how much it may use, and whether it shares cached prefixes. The name
/// (`metadata.name`, 1-64 characters of `A-Za-z0-9._:/-`) is the `tenant` attribute of
/// every metric.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "warmpath.dev",
    version = "v1alpha1",
    kind = "Tenant",
    derive = "PartialEq",
    status = "ResourceStatus",
    shortname = "wtn",
    printcolumn = r#"{"name":"Priority","type":"integer","jsonPath":".spec.priority"}"#,
    printcolumn = r#"{"name":"Accepted","type":"string","jsonPath":".status.conditions[?(@.type==\"Accepted\")].status"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TenantSpec {
    /// Which requests belong to this tenant.
    #[serde(default)]
    pub identity: Identity,
    /// Higher is served first when tenants contend for capacity (-1000 to 1000).
    #[serde(default)]
    pub priority: i32,
    /// Share of contended capacity among tenants of equal priority (1-1000).
    #[serde(default = "default_weight")]
    pub weight: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quotas: Option<Quotas>,
    /// `shared`, or `isolated`: the router sets a per-tenant `cache_salt`, so this tenant
    /// never shares cached prefix blocks with another.
    #[serde(default)]
    pub cache_isolation: CacheIsolation,
}

fn default_weight() -> u32 {
    1
}

/// Identity selectors; a request is the tenant's when any one matches (workload identity
/// before the header: docs/telemetry.md).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Identity {
    /// Client pods in these namespaces (Kubernetes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// Client pods running as these service accounts, `namespace/name` (Kubernetes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_accounts: Vec<String>,
    /// Client pods with these labels (Kubernetes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_labels: Option<LabelSelector>,
    /// Client source addresses (longest prefix wins across tenants).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cidrs: Vec<String>,
    /// Sources (CIDRs) trusted to name this tenant in the tenant header (a gateway that
    /// authenticates users).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub header_sources: Vec<String>,
}

/// Rate limits, each a string `N/s`, `N/min` or `N/h` (N a positive number), and a cap on
/// concurrent requests. Enforced across every agent of a cluster (docs/policy.md).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Quotas {
    /// Requests (each admitted request counts one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<String>,
    /// Prompt tokens (charged when the request is admitted, corrected by the engine's usage).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<String>,
    /// Output tokens (charged from the usage the engine reports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<String>,
    /// Requests in progress at once (a stream until its body ends).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrent_streams: Option<u32>,
    /// Seconds of each rate that may be spent at once (burst), 0.05-60; default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst_seconds: Option<f64>,
}

/// Whether a tenant shares cached prefixes.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum CacheIsolation {
    #[default]
    Shared,
    Isolated,
}

/// Status of a [`RoutePolicy`] or [`Tenant`]: conditions `Accepted` and `ResolvedRefs`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceStatus {
    /// The generation these conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The latest observations, one per `type`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// A status condition (the shape of Kubernetes' `metav1.Condition`).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// `Accepted` or `ResolvedRefs`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// CamelCase reason: `Accepted`, `Invalid`, `Conflicted`, `ResolvedRefs`, `PoolNotFound`,
    /// ...
    pub reason: String,
    /// Human-readable detail: for a rejection, each error with its field path.
    pub message: String,
    /// The generation the condition was set from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// RFC 3339.
    pub last_transition_time: String,
}

/// One resource of either kind, as read from a document.
#[derive(Debug, Clone, PartialEq)]
pub enum Resource {
    RoutePolicy(RoutePolicy),
    Tenant(Tenant),
}

impl Resource {
    /// `RoutePolicy` or `Tenant`.
    pub fn kind(&self) -> &'static str {
        match self {
            Resource::RoutePolicy(_) => "RoutePolicy",
            Resource::Tenant(_) => "Tenant",
        }
    }

    /// `namespace/name` (policies) or `name` (tenants).
    pub fn key(&self) -> String {
        match self {
            Resource::RoutePolicy(p) => format!(
                "{}/{}",
                p.metadata.namespace.as_deref().unwrap_or("default"),
                p.metadata.name.as_deref().unwrap_or("")
            ),
            Resource::Tenant(t) => t.metadata.name.clone().unwrap_or_default(),
        }
    }

    pub fn metadata(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        match self {
            Resource::RoutePolicy(p) => &p.metadata,
            Resource::Tenant(t) => &t.metadata,
        }
    }
}

/// A problem with one field of a resource: where (a path such as
/// `spec.action.weights.prefix`), the value found, and why it cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub path: String,
    pub value: String,
    pub message: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.value.is_empty() {
            write!(f, "{}: {}", self.path, self.message)
        } else {
            write!(f, "{}: `{}`: {}", self.path, self.value, self.message)
        }
    }
}
