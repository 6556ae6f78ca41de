//! Kubernetes: the agent finds its pods, pools, Services and policies itself (docs/install.md).
//!
//! Watchers ([`kube::runtime`] reflectors with backoff, relisting on `410 Gone`) turn the
//! cluster's objects into the agent's inputs, data flowing one way:
//!
//! - [`pods`] and [`inference_pool`]: each configured pool's endpoints
//!   ([`crate::discovery::EndpointSpec`]), from the pods its `InferencePool` or selector
//!   picks, with where each publishes KV events and serves metrics (pod annotations);
//! - [`services`]: the Service VIPs the eBPF programs intercept;
//! - [`policies`]: `RoutePolicy` and `Tenant` objects, validated into the active policy, with
//!   [`status`] conditions written by exactly one agent per object;
//! - [`identity`]: client pod IP -> namespace, service account and labels, so `Tenant`
//!   selectors match workloads.
//!
//! [`client`] builds the API client: in-cluster service account, or `KUBECONFIG`.

pub mod client;
pub mod identity;
pub mod inference_pool;
pub mod pods;
pub mod policies;
pub mod services;
pub mod status;
