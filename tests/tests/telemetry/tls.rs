//! OTLP over TLS against a collector that serves TLS (the in-process receiver: rotel's
//! receivers have no TLS): a custom CA over gRPC and HTTP/protobuf, mTLS with and without
//! the client certificate, a CA that did not sign the collector's certificate, and TLS
//! files that cannot be used. Certificates are made per test (`warmpath_e2e::pki`).

use warmpath_e2e::{
    agent::proxy,
    agent_process::AgentProcess,
    otlp::{Receiver, Tls},
    pki::Pki,
};

use super::{WAIT, complete, export_with, fleet};

fn path(p: &std::path::Path) -> &str {
    p.to_str().expect("temporary paths are UTF-8")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_ca_delivers_over_grpc_and_http_protobuf() {
    let pki = Pki::generate("custom");
    let fleet = fleet().await;
    let c = reqwest::Client::new();
    // gRPC to the IP address (an IP SAN), HTTP to the name (a DNS SAN); gzip and not.
    for (protocol, host, compression) in [
        ("grpc", "127.0.0.1", "gzip"),
        ("http/protobuf", "localhost", "gzip"),
        ("http/protobuf", "127.0.0.1", "none"),
    ] {
        let receiver = Receiver::start_tls(Tls {
            pki: &pki,
            client_auth: false,
        })
        .await;
        let port = if protocol == "grpc" {
            receiver.grpc.port()
        } else {
            receiver.http.port()
        };
        let endpoint = format!("https://{host}:{port}");
        let routing = proxy(
            &fleet,
            &[
                "--otlp-endpoint",
                &endpoint,
                "--otlp-protocol",
                protocol,
                "--otlp-certificate",
                path(&pki.ca),
                "--otlp-compression",
                compression,
                "--otlp-interval-ms",
                "200",
            ],
        )
        .await;
        let base = format!("http://{}", routing.listen);
        complete(&c, &base, "over tls", None).await;
        complete(&c, &base, "over tls again", None).await;
        let snapshot = export_with(&receiver, 2).await;
        assert_eq!(
            snapshot.sum("warmpath.requests", &[("outcome", "ok")]),
            2,
            "{protocol} {host} {compression}"
        );
        assert_eq!(receiver.handshake_failures(), 0);
    }
}

/// The agent as a child process (its log is what the user sees), pushing gRPC or HTTP to
/// `receiver` with `env` on top of the endpoint and a short interval.
fn agent(fleet_url: &str, receiver: &Receiver, grpc: bool, env: &[(&str, &str)]) -> AgentProcess {
    let (protocol, port) = if grpc {
        ("grpc", receiver.grpc.port())
    } else {
        ("http/protobuf", receiver.http.port())
    };
    let endpoint = format!("https://127.0.0.1:{port}");
    let mut all = vec![
        ("RUST_LOG", "info"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
        ("OTEL_METRIC_EXPORT_INTERVAL", "200"),
    ];
    all.extend_from_slice(env);
    AgentProcess::start(
        &[
            "--endpoint",
            fleet_url,
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
        ],
        &all,
    )
    .unwrap_or_else(|e| panic!("the agent did not start: {e:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_needs_the_client_certificate_and_the_right_ca() {
    let pki = Pki::generate("mtls");
    let stranger = Pki::generate("stranger");
    let fleet = fleet().await;
    let receiver = Receiver::start_tls(Tls {
        pki: &pki,
        client_auth: true,
    })
    .await;
    let c = reqwest::Client::new();
    for grpc in [true, false] {
        // No client certificate: the collector ends the handshake; the agent says why.
        let a = agent(
            &fleet.url(0),
            &receiver,
            grpc,
            &[("OTEL_EXPORTER_OTLP_CERTIFICATE", path(&pki.ca))],
        );
        let line = a.wait_for_log(&["WARN", "OTLP push failed"], WAIT).await;
        assert!(
            line.contains("requires client certificates (mTLS)")
                && line.contains("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"),
            "grpc={grpc}: {line}"
        );
        assert!(receiver.handshake_failures() > 0);
        assert_eq!(receiver.exports(), 0, "grpc={grpc}");
        drop(a);

        // Trusting another CA: the agent refuses the collector's certificate.
        let a = agent(
            &fleet.url(0),
            &receiver,
            grpc,
            &[
                ("OTEL_EXPORTER_OTLP_CERTIFICATE", path(&stranger.ca)),
                (
                    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                    path(&pki.client_cert),
                ),
                ("OTEL_EXPORTER_OTLP_CLIENT_KEY", path(&pki.client_key)),
            ],
        );
        let line = a.wait_for_log(&["WARN", "OTLP push failed"], WAIT).await;
        assert!(
            line.contains("invalid peer certificate") && line.contains("UnknownIssuer"),
            "grpc={grpc}: {line}"
        );
        assert_eq!(receiver.exports(), 0, "grpc={grpc}");
        drop(a);
    }

    // With the client certificate (the metrics-specific variables, gzip): metrics arrive.
    // Totals are cumulative per agent: the gRPC agent sends one request, the HTTP one two.
    for (requests, grpc) in [(1, true), (2, false)] {
        let a = agent(
            &fleet.url(0),
            &receiver,
            grpc,
            &[
                ("OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE", path(&pki.ca)),
                (
                    "OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE",
                    path(&pki.client_cert),
                ),
                (
                    "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY",
                    path(&pki.client_key),
                ),
                ("OTEL_EXPORTER_OTLP_METRICS_COMPRESSION", "gzip"),
            ],
        );
        for _ in 0..requests {
            complete(&c, &format!("http://{}", a.listen), "mutual", None).await;
        }
        export_with(&receiver, requests).await;
        assert!(
            !a.stderr().contains("OTLP push failed"),
            "grpc={grpc}: {}",
            a.stderr()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_tls_files_stop_the_agent_with_the_setting_named() {
    let pki = Pki::generate("files");
    let receiver = Receiver::start_tls(Tls {
        pki: &pki,
        client_auth: false,
    })
    .await;
    let endpoint = format!("https://127.0.0.1:{}", receiver.http.port());
    let flags = [
        "--endpoint",
        "http://127.0.0.1:1",
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
    ];
    for (env, says) in [
        (
            // The certificate where the key should be.
            vec![
                (
                    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                    path(&pki.client_cert),
                ),
                ("OTEL_EXPORTER_OTLP_CLIENT_KEY", path(&pki.client_cert)),
            ],
            "(OTEL_EXPORTER_OTLP_CLIENT_KEY): no private key found",
        ),
        (
            vec![("OTEL_EXPORTER_OTLP_CERTIFICATE", path(&pki.server_key))],
            "(OTEL_EXPORTER_OTLP_CERTIFICATE): no certificate in it",
        ),
        (
            // The server's key does not belong to the client's certificate.
            vec![
                (
                    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                    path(&pki.client_cert),
                ),
                ("OTEL_EXPORTER_OTLP_CLIENT_KEY", path(&pki.server_key)),
            ],
            "client certificate and key do not make an identity",
        ),
        (
            vec![("OTEL_EXPORTER_OTLP_COMPRESSION", "brotli")],
            "OTEL_EXPORTER_OTLP_COMPRESSION=brotli: supported are gzip and none",
        ),
    ] {
        let mut all = vec![("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str())];
        all.extend(env);
        let exited = AgentProcess::start(&flags, &all).unwrap_err();
        assert!(!exited.status.success());
        assert!(
            exited.stderr.contains("agent failed to start") && exited.stderr.contains(says),
            "{says}: {}",
            exited.stderr
        );
    }
}
