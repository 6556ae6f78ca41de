//! Certificates made at test time with rcgen (nothing private is committed): a CA, a server
//! certificate for `localhost` and `127.0.0.1` and a client certificate signed by it, as
//! PEM files in a directory removed on drop, plus the rustls server side a TLS collector
//! serves with.

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};

/// One CA and what it signed, written under `dir`.
#[derive(Debug)]
pub struct Pki {
    pub dir: PathBuf,
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn params(name: &str, sans: &[&str]) -> CertificateParams {
    let mut p = CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .expect("valid subject alternative names");
    p.distinguished_name.push(DnType::CommonName, name);
    p
}

impl Pki {
    /// A fresh CA (named `name`) with a server and a client certificate.
    pub fn generate(name: &str) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "warmpath-e2e-pki-{}-{}-{name}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create the certificate directory");
        let mut ca = params(&format!("warmpath test CA {name}"), &[]);
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().expect("CA key"))
            .expect("self-signed CA");
        let issue = |name: &str, sans: &[&str], usage| {
            let key = KeyPair::generate().expect("key");
            let mut p = params(name, sans);
            p.extended_key_usages = vec![usage];
            p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
            let cert = p.signed_by(&key, &ca).expect("signed by the CA");
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = issue(
            "collector",
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let (client_cert, client_key) =
            issue("warmpath-agent", &[], ExtendedKeyUsagePurpose::ClientAuth);
        let write = |file: &str, pem: &str| {
            let path = dir.join(file);
            std::fs::write(&path, pem).expect("write a PEM file");
            path
        };
        Self {
            ca: write("ca.pem", &ca.pem()),
            server_cert: write("server.pem", &server_cert),
            server_key: write("server.key", &server_key),
            client_cert: write("client.pem", &client_cert),
            client_key: write("client.key", &client_key),
            dir,
        }
    }

    /// The rustls configuration of a server presenting the server certificate; with
    /// `client_auth`, only clients with a certificate from this CA get through the handshake.
    pub fn server_config(&self, client_auth: bool, alpn: &[&[u8]]) -> rustls::ServerConfig {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("default protocol versions");
        let builder = if client_auth {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certs(&self.ca) {
                roots.add(cert).expect("the CA is a valid root");
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .expect("client verifier");
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let key = PrivateKeyDer::from_pem_file(&self.server_key).expect("server key");
        let mut config = builder
            .with_single_cert(certs(&self.server_cert), key)
            .expect("server certificate and key");
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        config
    }

    /// A file's bytes.
    pub fn read(path: &Path) -> Vec<u8> {
        std::fs::read(path).expect("read a PEM file")
    }
}

fn certs(path: &Path) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_file_iter(path)
        .expect("PEM file")
        .collect::<Result<_, _>>()
        .expect("PEM certificates")
}
