//! The API client: `KUBECONFIG` (or `~/.kube/config`) when there is one, else the pod's
//! service account (`KUBERNETES_SERVICE_HOST`, the token and CA under
//! `/var/run/secrets/kubernetes.io/serviceaccount/`), through [`kube::Config::infer`].
//! TLS is rustls with ring (docs/security.md).

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(
        "no Kubernetes API configuration: {0} (in a pod: KUBERNETES_SERVICE_HOST and the service account token; elsewhere: KUBECONFIG)"
    )]
    Infer(#[source] kube::config::InferConfigError),
    #[error("cannot build the Kubernetes client for {url}: {source}")]
    Build {
        url: String,
        #[source]
        source: kube::Error,
    },
}

/// The client for the API server this process is configured for.
pub async fn client() -> Result<kube::Client, ClientError> {
    let config = kube::Config::infer().await.map_err(ClientError::Infer)?;
    from_config(config)
}

/// The client for `config` (tests: a fake API server's URL).
pub fn from_config(config: kube::Config) -> Result<kube::Client, ClientError> {
    let url = config.cluster_url.to_string();
    kube::Client::try_from(config).map_err(|source| ClientError::Build { url, source })
}

/// What `kubernetes.enabled: auto` finds in this process's environment: in a pod
/// (`KUBERNETES_SERVICE_HOST` and a service account token), or `KUBECONFIG` set.
pub fn detect() -> bool {
    crate::config::Environment::process().detects_kubernetes()
}
