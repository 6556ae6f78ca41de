//! The kernel's per-cgroup counters exported per tenant while interception runs
//! (`telemetry::kernel`; docs/ebpf.md, docs/telemetry.md).

use std::sync::Arc;

use super::Routing;
use crate::telemetry::kernel::{self, KernelTraffic, Read, Resolve};

/// Starts reading the programs' per-cgroup counters into the routing proxy's telemetry
/// (`warmpath.kernel.*`); the task ends when the returned handle is aborted. A client cgroup's
/// tenant is the current policy's (`TenantPolicy::tenant_of_cgroup`: the pods' cgroups on
/// Kubernetes, the file's `tenants.cgroups`); cgroups it does not know count in the default
/// tenant.
pub fn export(
    redirector: &Arc<parking_lot::Mutex<crate::ebpf::Redirector>>,
    routing: &Routing,
) -> tokio::task::JoinHandle<()> {
    let telemetry = &routing.proxy.telemetry;
    let traffic = Arc::new(KernelTraffic::new(telemetry.max_tenants()));
    traffic.observe(telemetry.meter());
    let redirector = redirector.clone();
    let read: Read = Arc::new(move || redirector.lock().cgroup_stats().map_err(|e| e.to_string()));
    let policy = routing.proxy.policy.clone();
    let resolve: Resolve = Arc::new(move |id| policy.current().identity.tenant_of_cgroup(id));
    let policy = routing.proxy.policy.clone();
    let default = Arc::new(move || policy.current().identity.default_tenant.clone());
    kernel::spawn(traffic, read, resolve, default, kernel::DEFAULT_INTERVAL)
}
