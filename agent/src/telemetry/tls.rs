//! TLS for the OTLP push: the CAs trusted for the collector and the client identity for
//! mTLS, read and checked at start-up, and the rustls client configuration built from them
//! (ring is the one crypto provider). Errors name the setting a file came from, never a
//! key's content.

use std::{path::Path, sync::Arc};

use rustls::{
    RootCertStore,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _},
};

/// A file named by a setting (a flag, a configuration field or a standard variable).
#[derive(Debug, Clone, Copy)]
pub struct Setting<'a> {
    /// What the user set, e.g. `OTEL_EXPORTER_OTLP_CERTIFICATE`.
    pub name: &'a str,
    pub path: &'a Path,
}

/// The collector's trust and this agent's identity, as PEM read at start-up.
#[derive(Clone, PartialEq, Eq)]
pub struct OtlpTls {
    /// Certificates trusted for the collector instead of the system's roots.
    pub ca: Option<Vec<u8>>,
    /// Presented to the collector when it asks (mTLS).
    pub client: Option<ClientIdentity>,
}

/// A client certificate chain and its private key (PEM).
#[derive(Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    pub chain: Vec<u8>,
    pub key: Vec<u8>,
}

impl std::fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientIdentity(<key redacted>)")
    }
}

impl std::fmt::Debug for OtlpTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtlpTls")
            .field("ca", &self.ca.as_ref().map(|_| "custom"))
            .field("client", &self.client.as_ref().map(|_| "<key redacted>"))
            .finish()
    }
}

impl OtlpTls {
    /// Reads and checks the files: every certificate parses, the key parses and belongs to
    /// the certificate, and some root is trusted (the system's when no CA is given).
    pub fn load(
        ca: Option<Setting<'_>>,
        certificate: Option<Setting<'_>>,
        key: Option<Setting<'_>>,
    ) -> Result<Self, String> {
        let ca = ca
            .map(|s| {
                let pem = read(s)?;
                let mut roots = RootCertStore::empty();
                for cert in certificates(s, &pem)? {
                    roots
                        .add(cert)
                        .map_err(|e| format!("{}: not a usable CA certificate: {e}", shown(s)))?;
                }
                Ok::<_, String>(pem)
            })
            .transpose()?;
        let client = match (certificate, key) {
            (None, None) => None,
            (Some(c), None) => {
                return Err(format!(
                    "{} is set without a client key: mTLS needs both",
                    c.name
                ));
            }
            (None, Some(k)) => {
                return Err(format!(
                    "{} is set without a client certificate: mTLS needs both",
                    k.name
                ));
            }
            (Some(c), Some(k)) => {
                let chain = read(c)?;
                certificates(c, &chain)?;
                let key = read(k)?;
                PrivateKeyDer::from_pem_slice(&key).map_err(|_| {
                    format!(
                        "{}: no private key found (expected a PKCS#8, PKCS#1 or SEC1 PEM key)",
                        shown(k)
                    )
                })?;
                Some(ClientIdentity { chain, key })
            }
        };
        let tls = Self { ca, client };
        tls.client_config()?;
        Ok(tls)
    }

    /// The rustls configuration the HTTP/protobuf push connects with (tonic builds its own
    /// from the same PEM for gRPC).
    pub fn client_config(&self) -> Result<rustls::ClientConfig, String> {
        let mut roots = RootCertStore::empty();
        match &self.ca {
            Some(pem) => {
                for cert in CertificateDer::pem_slice_iter(pem).flatten() {
                    roots
                        .add(cert)
                        .map_err(|e| format!("OTLP CA certificate: {e}"))?;
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                let (added, _) = roots.add_parsable_certificates(found.certs);
                if added == 0 {
                    return Err(
                        "https OTLP endpoint, but no system CA certificates were found: name the collector's CA with OTEL_EXPORTER_OTLP_CERTIFICATE (or --otlp-certificate)"
                            .into(),
                    );
                }
            }
        }
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots);
        match &self.client {
            None => Ok(builder.with_no_client_auth()),
            Some(id) => {
                let chain = CertificateDer::pem_slice_iter(&id.chain)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| "OTLP client certificate: not PEM".to_string())?;
                let key = PrivateKeyDer::from_pem_slice(&id.key)
                    .map_err(|_| "OTLP client key: not a PEM private key".to_string())?;
                builder.with_client_auth_cert(chain, key).map_err(|e| {
                    format!(
                        "OTLP client certificate and key do not make an identity (is the key the certificate's?): {e}"
                    )
                })
            }
        }
    }
}

fn shown(s: Setting<'_>) -> String {
    format!("{} ({})", s.path.display(), s.name)
}

fn read(s: Setting<'_>) -> Result<Vec<u8>, String> {
    std::fs::read(s.path).map_err(|e| format!("{}: cannot read: {e}", shown(s)))
}

fn certificates(s: Setting<'_>, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: not a PEM certificate file: {e}", shown(s)))?;
    if certs.is_empty() {
        return Err(format!(
            "{}: no certificate in it (expected PEM `BEGIN CERTIFICATE` blocks)",
            shown(s)
        ));
    }
    Ok(certs)
}
