//! Declarative policy: `RoutePolicy` and `Tenant` resources (group `warmpath.dev`,
//! `v1alpha1`), from Kubernetes or, off-cluster, from YAML files in `--policy-dir`
//! (docs/policy.md).
//!
//! Data flows one way: documents ([`documents`]) are read into resources
//! ([`resources`]), checked ([`validate`]), compiled with the agent's own configuration
//! into one immutable [`compiled::PolicySet`], and published to the data path by the
//! [`store`], which keeps the last good version of each object when an update is invalid.
//! The proxy reads the current set once per request.

pub mod cli;
pub mod convert;
pub mod crds;
pub mod documents;
pub mod quota;
pub mod resources;
pub mod schema_docs;
pub mod store;
pub mod usage;
pub mod validate;
