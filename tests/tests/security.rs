//! Trust boundaries end to end (docs/security.md): the admin API's bearer token (required
//! off loopback, checked on every guarded path, sent by `warmpath status`) and secrets kept
//! out of the agent's logs at debug level.
#![allow(clippy::unwrap_used)] // test binary: a failed unwrap is a failed test

use std::time::Duration;

use clap::Parser as _;
use serde_json::json;
use warmpath_agent::{args::AgentArgs, status::StatusArgs};
use warmpath_e2e::{
    agent::proxy,
    agent_process::{AgentProcess, child_main},
    otlp::Receiver,
    sim::{Fleet, wait_for},
};

const WAIT: Duration = Duration::from_secs(30);
const ADMIN_TOKEN: &str = "admin-token-secret-5f2c9a7e41";

#[test]
#[ignore = "entry point of the agent child process (tests/src/agent_process.rs)"]
fn agent_process() {
    child_main();
}

/// A file under the temporary directory, removed on drop.
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new(name: &str, content: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("warmpath-security-{}-{name}", std::process::id()));
        std::fs::write(&path, content).unwrap();
        Self(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

async fn fleet() -> Fleet {
    Fleet::start(&["--port", "0", "--replicas", "1", "--profile", "tiny"]).await
}

#[test]
fn an_admin_listener_off_loopback_needs_a_token() {
    // Only validated, never bound: the error comes before any listener.
    let args = AgentArgs::try_parse_from([
        "agent",
        "--admin",
        "0.0.0.0:9090",
        "--endpoint",
        "http://127.0.0.1:1",
    ])
    .unwrap();
    let e = args.config().unwrap_err().to_string();
    assert!(
        e.contains("--admin: 0.0.0.0:9090 is not a loopback address")
            && e.contains("--admin-token-file PATH"),
        "{e}"
    );
    let file = TempFile::new(
        "no-token.yaml",
        "version: 1\nadmin: \"[::]:9090\"\npools:\n- name: p\n  model: m\n  endpoints: [{url: http://127.0.0.1:1}]\n",
    );
    let e = warmpath_agent::config::load(&file.0)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("admin: [::]:9090 is not a loopback address") && e.contains("adminTokenFile"),
        "{e}"
    );
    // With a token the same address is accepted (still not bound here).
    let token = TempFile::new("off-loopback.token", &format!("{ADMIN_TOKEN}\n"));
    let args = AgentArgs::try_parse_from([
        "agent",
        "--admin",
        "0.0.0.0:9090",
        "--admin-token-file",
        token.path(),
        "--endpoint",
        "http://127.0.0.1:1",
    ])
    .unwrap();
    assert!(args.config().unwrap().admin_token.is_some());
    // A token too short to be a secret is refused, without echoing it.
    let weak = TempFile::new("weak.token", "hunter2\n");
    let e = AgentArgs::try_parse_from([
        "agent",
        "--admin-token-file",
        weak.path(),
        "--endpoint",
        "http://127.0.0.1:1",
    ])
    .unwrap()
    .config()
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("--admin-token-file") && e.contains("at least 16") && !e.contains("hunter2"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_answers_only_with_the_bearer_token() {
    let fleet = fleet().await;
    let token = TempFile::new("admin.token", &format!("{ADMIN_TOKEN}\n"));
    let routing = proxy(&fleet, &["--admin-token-file", token.path()]).await;
    let admin = format!("http://{}", routing.admin);
    let c = reqwest::Client::new();
    for path in ["/status", "/metrics", "/no-such-path"] {
        for auth in [
            None,
            Some("Bearer wrong-token-wrong-token".to_string()),
            Some(format!("Basic {ADMIN_TOKEN}")),
        ] {
            let mut req = c.get(format!("{admin}{path}"));
            if let Some(a) = &auth {
                req = req.header("authorization", a);
            }
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), 401, "{path} with {auth:?}");
            let challenge = r.headers()["www-authenticate"]
                .to_str()
                .unwrap()
                .to_string();
            assert!(challenge.starts_with("Bearer "), "{challenge}");
            let body: serde_json::Value = r.json().await.unwrap();
            assert_eq!(body["error"]["code"], 401, "{body}");
        }
    }
    let r = c
        .get(format!("{admin}/status"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let status: serde_json::Value = r.json().await.unwrap();
    assert_eq!(status["model"], "sim-llama");
    let r = c
        .get(format!("{admin}/metrics"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let prom = r.text().await.unwrap();
    assert!(prom.contains("warmpath_index_entries"), "{prom}");
    // Three paths, three refusals each.
    assert!(
        prom.lines().any(
            |l| l.starts_with("warmpath_admin_unauthorized_requests_total") && l.ends_with(" 9")
        ),
        "{prom}"
    );
    // The kubelet's probes carry no token.
    for probe in ["/live", "/ready"] {
        assert_eq!(
            c.get(format!("{admin}{probe}"))
                .send()
                .await
                .unwrap()
                .status(),
            200
        );
    }

    // `warmpath status`: with the file it reads the status, without it says what to give.
    let status = |file: Option<&str>| StatusArgs {
        admin: routing.admin.to_string(),
        admin_token_file: file.map(Into::into),
        json: true,
    };
    warmpath_agent::status::run(&status(Some(token.path())))
        .await
        .unwrap();
    let e = warmpath_agent::status::run(&status(None))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("401")
            && e.contains("--admin-token-file")
            && e.contains("WARMPATH_ADMIN_TOKEN_FILE"),
        "{e}"
    );
    let wrong = TempFile::new("wrong.token", "wrong-token-wrong-token\n");
    let e = warmpath_agent::status::run(&status(Some(wrong.path())))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("refused the admin token"), "{e}");
}

/// Asserts none of `secrets` is in `log`, and that the log is the debug-level one (so the
/// check covers what debug logging prints).
fn assert_no_secret(log: &str, secrets: &[&str]) {
    assert!(
        log.contains(" DEBUG "),
        "the agent logged at debug level:\n{log}"
    );
    for s in secrets {
        assert!(!log.contains(s), "`{s}` appears in the agent's log:\n{log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_reach_the_logs_at_debug_level() {
    const OTLP_AUTH: &str = "otlp-bearer-secret-8d1e55";
    const OTLP_KEY: &str = "otlp-api-key-secret-37ab02";
    const CLIENT_KEY: &str = "sk-client-api-key-secret-c0ffee";
    const WRONG_TOKEN: &str = "presented-wrong-token-0a9b8c";
    const URL_PASSWORD: &str = "url-password-secret-6e4f";
    let secrets = [
        ADMIN_TOKEN,
        OTLP_AUTH,
        OTLP_KEY,
        CLIENT_KEY,
        WRONG_TOKEN,
        URL_PASSWORD,
    ];
    let fleet = fleet().await;
    let receiver = Receiver::start().await;
    let token = TempFile::new("logs.token", ADMIN_TOKEN);
    let headers = format!("authorization=Bearer%20{OTLP_AUTH},x-api-key={OTLP_KEY}");
    let http_endpoint = format!("http://{}", receiver.http);
    let agent = AgentProcess::start(
        &[
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--admin-token-file",
            token.path(),
            "--endpoint",
            &fleet.url(0),
        ],
        &[
            ("RUST_LOG", "debug"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &http_endpoint),
            ("OTEL_EXPORTER_OTLP_HEADERS", &headers),
            ("OTEL_METRIC_EXPORT_INTERVAL", "200"),
        ],
    )
    .unwrap();
    let c = reqwest::Client::new();
    let admin = format!("http://{}", agent.admin);
    for auth in [ADMIN_TOKEN, WRONG_TOKEN] {
        c.get(format!("{admin}/status"))
            .bearer_auth(auth)
            .send()
            .await
            .unwrap();
    }
    let r = c
        .post(format!("http://{}/v1/chat/completions", agent.listen))
        .bearer_auth(CLIENT_KEY)
        .json(&json!({"model": "sim-llama", "max_tokens": 3,
            "messages": [{"role": "user", "content": "hello there"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // The headers were really sent: the secret was in the agent's hands, just not its log.
    wait_for("an export carrying the OTLP headers", WAIT, || async {
        receiver
            .saw_header("x-api-key", OTLP_KEY)
            .then_some(())
            .filter(|()| receiver.saw_header("authorization", &format!("Bearer {OTLP_AUTH}")))
    })
    .await;
    agent
        .wait_for_log(&["DEBUG", "routing decision"], WAIT)
        .await;
    assert_no_secret(&agent.stderr(), &secrets);
    drop(agent);

    // The next two agents: the simulator and loopback ports, no other flag.
    let sim = fleet.url(0);
    let plain = [
        "--endpoint",
        &sim,
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
    ];

    // A push that fails (gRPC to a port nobody listens on) logs the failure, not the headers.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let dead_endpoint = format!("http://{dead}");
    let agent = AgentProcess::start(
        &plain,
        &[
            ("RUST_LOG", "debug"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &dead_endpoint),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_HEADERS", &headers),
            ("OTEL_METRIC_EXPORT_INTERVAL", "100"),
        ],
    )
    .unwrap();
    agent.wait_for_log(&["OTLP push failed again"], WAIT).await;
    assert_no_secret(&agent.stderr(), &secrets);
    drop(agent);

    // Credentials in the collector's URL: refused at start-up, the password not repeated.
    let with_password = format!("http://otel:{URL_PASSWORD}@{}", receiver.http);
    let exited = AgentProcess::start(
        &plain,
        &[
            ("RUST_LOG", "debug"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &with_password),
        ],
    )
    .unwrap_err();
    assert!(!exited.status.success());
    assert!(
        exited
            .stderr
            .contains("credentials in the URL are not supported")
            && exited.stderr.contains("http://***@127.0.0.1"),
        "{}",
        exited.stderr
    );
    for s in secrets {
        assert!(!exited.stderr.contains(s), "`{s}` in:\n{}", exited.stderr);
    }
}
