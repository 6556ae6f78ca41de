//! HTTP/1.1 conformance of the agent, both legs, as one table: each row is the bytes a
//! client sends (then a pipelined probe request), the status line it must get, whether the
//! connection is then closed or serves the probe, and the exact request bytes the engine
//! must have seen (or none). The engine is a raw TCP fake that records what it is sent and
//! answers scripted bytes; for the engine-leg rows it answers deliberately bad responses.
//! The cases and the decisions behind them are listed in docs/adr/0001-own-http1-data-path.md.
#![allow(clippy::unwrap_used)] // test binary: a failed unwrap is a failed test

use tokio::{io::AsyncWriteExt, net::TcpStream};
use warmpath_e2e::raw_http::{FakeEngine, ResponseReader, Scripted, agent_for};

/// The completion request body every row sends (50 bytes).
const BODY: &str = r#"{"model":"sim-llama","prompt":"hi","max_tokens":1}"#;
/// The same, streamed (64 bytes).
const STREAM_BODY: &str = r#"{"model":"sim-llama","prompt":"hi","max_tokens":1,"stream":true}"#;
/// The engine's good answer's body.
const ENGINE_BODY: &str = r#"{"id":"cmpl-1","object":"text_completion","model":"sim-llama","choices":[{"index":0,"text":"ok","finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;

/// The request the engine sees for a plain completion: the agent's own request line, host
/// and content-length, then the client's fields less hop-by-hop ones (`{engine}`: the
/// engine's address).
const SEEN: &str = "POST /v1/completions HTTP/1.1\r\nhost: {engine}\r\ncontent-length: 50\r\ncontent-type: application/json\r\n\r\n{\"model\":\"sim-llama\",\"prompt\":\"hi\",\"max_tokens\":1}";
const SEEN_STREAM: &str = "POST /v1/completions HTTP/1.1\r\nhost: {engine}\r\ncontent-length: 64\r\ncontent-type: application/json\r\n\r\n{\"model\":\"sim-llama\",\"prompt\":\"hi\",\"max_tokens\":1,\"stream\":true}";

const OK: &str = "HTTP/1.1 200 OK";
const BAD: &str = "HTTP/1.1 400 Bad Request";
const NOT_IMPLEMENTED: &str = "HTTP/1.1 501 Not Implemented";
const TOO_LARGE: &str = "HTTP/1.1 431 Request Header Fields Too Large";
const BAD_GATEWAY: &str = "HTTP/1.1 502 Bad Gateway";

/// The pipelined request sent after each case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probe {
    /// `GET /health`: the agent answers it itself (nothing reaches the engine).
    Health,
    /// A completion: it reaches the engine (seen as [`SEEN`]) and gets the good answer.
    Completion,
}

/// What follows the case's answer on the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    /// The probe is answered (200).
    Kept,
    /// EOF: the probe is never read.
    Closed,
}

#[derive(Debug)]
struct Row {
    name: &'static str,
    /// What the client sends; a second piece is sent after a `100 Continue` is read.
    wire: Vec<u8>,
    after_continue: Option<Vec<u8>>,
    probe: Probe,
    /// What the engine answers to the case's request (none: the good answer).
    engine: Option<Scripted>,
    status: &'static str,
    /// A part of the answer's body that must be there.
    body_has: &'static str,
    /// A field the answer must not carry.
    absent: Option<&'static str>,
    then: Then,
    /// The requests the engine saw for the case, exactly (`{engine}`: its address).
    seen: Vec<&'static str>,
}

fn row(name: &'static str, wire: impl Into<Vec<u8>>, status: &'static str, then: Then) -> Row {
    let ok = status == OK;
    Row {
        name,
        wire: wire.into(),
        after_continue: None,
        probe: Probe::Health,
        engine: None,
        status,
        body_has: if ok { "\"text\":\"ok\"" } else { "\"error\"" },
        absent: None,
        then,
        seen: if ok { vec![SEEN] } else { vec![] },
    }
}

/// A completion request with `fields` (each ending in CRLF) after `host` and before the
/// body, which is `body` as given (its framing is the fields').
fn post(fields: &str, body: &str) -> String {
    format!(
        "POST /v1/completions HTTP/1.1\r\nhost: app\r\ncontent-type: application/json\r\n{fields}\r\n{body}"
    )
}

/// A completion with a right `content-length` and `fields`.
fn post_len(fields: &str) -> String {
    post(&format!("{fields}content-length: 50\r\n"), BODY)
}

/// [`BODY`] as chunks: 5 bytes with an extension, then the rest, then a trailer.
fn chunked_body(size_line: &str) -> String {
    format!(
        "{size_line}\r\n{}\r\n2d\r\n{}\r\n0\r\nx-trailer: t\r\n\r\n",
        &BODY[..5],
        &BODY[5..]
    )
}

/// A request smuggled inside another's body: it must never reach the engine.
const SMUGGLED: &str = "POST /v1/completions HTTP/1.1\r\nhost: app\r\nx-smuggled: 1\r\ncontent-length: 50\r\n\r\n{\"model\":\"sim-llama\",\"prompt\":\"hi\",\"max_tokens\":1}";

fn engine_says(head: &str, body: &str, close: bool) -> Scripted {
    Scripted {
        bytes: format!("{head}\r\n\r\n{body}").into_bytes(),
        close,
    }
}

fn good_answer() -> Scripted {
    engine_says(
        &format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}",
            ENGINE_BODY.len()
        ),
        ENGINE_BODY,
        false,
    )
}

/// A row on the engine leg: a good request (then a completion probe), a bad answer.
fn engine_row(name: &'static str, answer: Scripted, status: &'static str) -> Row {
    Row {
        probe: Probe::Completion,
        engine: Some(answer),
        body_has: if status == OK {
            "\"text\":\"ok\""
        } else {
            "\"code\":502"
        },
        seen: vec![SEEN],
        ..row(name, post_len(""), status, Then::Kept)
    }
}

/// A streamed completion whose engine answer breaks its chunked framing: the client gets
/// the stream's events so far and an error event, then the connection serves the probe.
fn stream_row(name: &'static str, chunks: &str) -> Row {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked";
    Row {
        probe: Probe::Completion,
        engine: Some(engine_says(head, chunks, false)),
        body_has: "\"code\":502",
        seen: vec![SEEN_STREAM],
        ..row(
            name,
            post(
                &format!("content-length: {}\r\n", STREAM_BODY.len()),
                STREAM_BODY,
            ),
            OK,
            Then::Kept,
        )
    }
}

// One line per case: the table reads as one.
#[rustfmt::skip]
fn rows() -> Vec<Row> {
    use Then::{Closed, Kept};
    let many_fields: String = (0..101).map(|i| format!("x-f{i}: v\r\n")).collect();
    let big_field = format!("x-big: {}\r\n", "a".repeat(64 * 1024));
    let long_ext = format!("5;{}", "e".repeat(4096));
    let engine_event = "data: {\"choices\":[{\"text\":\"o\"}]}\n\n";
    let event_chunk = format!("{:x}\r\n{engine_event}\r\n", engine_event.len());
    let te = "transfer-encoding: chunked\r\n";
    vec![
        // --- Framing read one way only: answered.
        row("content-length", post_len(""), OK, Kept),
        row("chunked body, extension and trailer", post(te, &chunked_body("5;ext=1")), OK, Kept),
        row("TE value after a tab", post("transfer-encoding:\tchunked\r\n", &chunked_body("5")), OK, Kept),
        row("TE value after spaces (   chunked)", post("transfer-encoding:   chunked\r\n", &chunked_body("5")), OK, Kept),
        row("CL value with spaces around it", post("content-length:   50  \r\n", BODY), OK, Kept),
        row("identical duplicate CL fields", post("content-length: 50\r\ncontent-length: 50\r\n", BODY), OK, Kept),
        row("CL list of identical values (50, 50)", post("content-length: 50, 50\r\n", BODY), OK, Kept),
        row("HTTP/1.0 without host: answered, then closed", format!("POST /v1/completions HTTP/1.0\r\ncontent-type: application/json\r\ncontent-length: 50\r\n\r\n{BODY}"), OK, Closed),
        row("connection: close", post_len("connection: close\r\n"), OK, Closed),
        row("fields named by connection are not forwarded", post_len("connection: keep-alive, x-hop\r\nx-hop: secret\r\nkeep-alive: timeout=5\r\n"), OK, Kept),
        Row {
            after_continue: Some(BODY.into()),
            ..row("expect: 100-continue, body sent after the interim answer", post("expect: 100-continue\r\ncontent-length: 50\r\n", ""), OK, Kept)
        },
        // --- Framing that could be read two ways: refused and closed, nothing forwarded.
        row("bare LF after the last chunk (0\\r\\n\\n)", post(te, &format!("32\r\n{BODY}\r\n0\r\n\n{SMUGGLED}")), BAD, Closed),
        row("TE gzip then TE chunked (two fields, one list)", post("transfer-encoding: gzip\r\ntransfer-encoding: chunked\r\n", &chunked_body("5")), NOT_IMPLEMENTED, Closed),
        row("TE gzip, chunked", post("transfer-encoding: gzip, chunked\r\n", &chunked_body("5")), NOT_IMPLEMENTED, Closed),
        row("TE chunked, identity (chunked not last)", post("transfer-encoding: chunked, identity\r\n", &chunked_body("5")), BAD, Closed),
        row("TE chunked then TE x (TE.TE)", post("transfer-encoding: chunked\r\ntransfer-encoding: x\r\n", &chunked_body("5")), BAD, Closed),
        row("TE chunked twice", post("transfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n", &chunked_body("5")), BAD, Closed),
        row("TE xchunked", post("transfer-encoding: xchunked\r\n", &chunked_body("5")), BAD, Closed),
        row("TE with a space before the colon", post("transfer-encoding : chunked\r\n", &chunked_body("5")), BAD, Closed),
        row("TE folded onto a previous line (obs-fold)", post("x-a: 1\r\n transfer-encoding: chunked\r\n", &chunked_body("5")), BAD, Closed),
        row("TE on HTTP/1.0", format!("POST /v1/completions HTTP/1.0\r\n{te}\r\n{}", chunked_body("5")), BAD, Closed),
        row("CL.TE: content-length then chunked", post(&format!("content-length: 6\r\n{te}"), &format!("0\r\n\r\n{SMUGGLED}")), BAD, Closed),
        row("TE.CL: chunked then content-length", post(&format!("{te}content-length: 4\r\n"), &format!("{:x}\r\n{SMUGGLED}\r\n0\r\n\r\n", SMUGGLED.len())), BAD, Closed),
        row("CL with a leading +", post("content-length: +50\r\n", BODY), BAD, Closed),
        row("CL with a space inside (5 0)", post("content-length: 5 0\r\n", BODY), BAD, Closed),
        row("CL list of differing values (50, 51)", post("content-length: 50, 51\r\n", BODY), BAD, Closed),
        row("duplicate differing CL fields", post("content-length: 50\r\ncontent-length: 51\r\n", BODY), BAD, Closed),
        row("NUL in a field value", post_len("x-a: a\0b\r\n"), BAD, Closed),
        row("bare CR in a field value", post_len("x-a: a\rb\r\n"), BAD, Closed),
        row("obs-fold in a field", post_len("x-a: a\r\n b\r\n"), BAD, Closed),
        row("bare LF ending a field line", post_len("x-a: a\n"), BAD, Closed),
        row("no host on HTTP/1.1", format!("POST /v1/completions HTTP/1.1\r\ncontent-length: 50\r\n\r\n{BODY}"), BAD, Closed),
        row("two host fields", post_len("host: other\r\n"), BAD, Closed),
        row("head over 64 KiB", post_len(&big_field), TOO_LARGE, Closed),
        row("101 header fields", post_len(&many_fields), TOO_LARGE, Closed),
        row("chunk size of 17 hex digits", post(te, &chunked_body("00000000000000005")), BAD, Closed),
        row("chunk size with a leading space", post(te, &chunked_body(" 5")), BAD, Closed),
        row("chunk size with trailing whitespace", post(te, &chunked_body("5 ")), BAD, Closed),
        row("chunk line over 4 KiB (extension)", post(te, &chunked_body(&long_ext)), BAD, Closed),
        // --- The engine leg: a bad response is a 502 (an error event in a stream), and the
        // agent goes on serving (the probe reaches the engine and is answered).
        engine_row("engine: TE gzip then TE chunked", engine_says("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\ntransfer-encoding: chunked", "0\r\n\r\n", true), BAD_GATEWAY),
        engine_row("engine: TE chunked twice", engine_says("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked", "0\r\n\r\n", true), BAD_GATEWAY),
        engine_row("engine: TE with CL", engine_says("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 5", "0\r\n\r\n", true), BAD_GATEWAY),
        engine_row("engine: TE on HTTP/1.0", engine_says("HTTP/1.0 200 OK\r\ntransfer-encoding: chunked", "0\r\n\r\n", true), BAD_GATEWAY),
        engine_row("engine: differing CL fields", engine_says("HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3", "ok", true), BAD_GATEWAY),
        engine_row("engine: obs-fold", engine_says("HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-a: 1\r\n folded", "ok", true), BAD_GATEWAY),
        engine_row("engine: bare LF in the head", engine_says("HTTP/1.1 200 OK\ncontent-length: 2", "ok", true), BAD_GATEWAY),
        engine_row("engine: head over 64 KiB", engine_says(&format!("HTTP/1.1 200 OK\r\n{big_field}content-length: 2"), "ok", true), BAD_GATEWAY),
        Row {
            absent: Some("x-engine-hop"),
            ..engine_row("engine: fields named by connection are not forwarded", engine_says(&format!("HTTP/1.1 200 OK\r\nconnection: x-engine-hop\r\nx-engine-hop: 1\r\ncontent-type: application/json\r\ncontent-length: {}", ENGINE_BODY.len()), ENGINE_BODY, false), OK)
        },
        stream_row("engine stream: bad chunk size", &format!("{event_chunk}zz\r\n")),
        stream_row("engine stream: chunk size of 16 hex digits", &format!("{event_chunk}0000000000000001\r\nx\r\n0\r\n\r\n")),
        stream_row("engine stream: chunk size with a leading space", &format!("{event_chunk} 1\r\nx\r\n0\r\n\r\n")),
        stream_row("engine stream: bare LF after the last chunk", &format!("{event_chunk}0\r\n\n")),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_conformance_case_is_answered_as_the_table_says() {
    assert_eq!((BODY.len(), STREAM_BODY.len()), (50, 64));
    let engine = FakeEngine::start(good_answer()).await;
    let agent = agent_for(&engine, &["--no-inject-usage"]).await;
    let engine_addr = engine.addr.to_string();
    let rows = rows();
    for row in &rows {
        let what = row.name;
        engine.script(row.engine.clone());
        let mut conn = TcpStream::connect(agent.listen).await.unwrap();
        let probe = match row.probe {
            Probe::Health => "GET /health HTTP/1.1\r\nhost: app\r\n\r\n".to_string(),
            Probe::Completion => post_len(""),
        };
        let mut reader = ResponseReader::new();
        let first = match &row.after_continue {
            None => [&row.wire[..], probe.as_bytes()].concat(),
            Some(_) => row.wire.clone(),
        };
        // A refused request's connection may close before all is written: what matters is
        // what comes back.
        let _ = conn.write_all(&first).await;
        if let Some(rest) = &row.after_continue {
            let interim = reader.next(&mut conn, false).await.expect(what);
            assert_eq!(interim.status_line, "HTTP/1.1 100 Continue", "{what}");
            conn.write_all(&[&rest[..], probe.as_bytes()].concat())
                .await
                .unwrap();
        }
        let answer = reader
            .next(&mut conn, false)
            .await
            .unwrap_or_else(|| panic!("{what}: closed without an answer"));
        assert_eq!(answer.status_line, row.status, "{what}: {answer:?}");
        let body = String::from_utf8_lossy(&answer.body);
        assert!(body.contains(row.body_has), "{what}: {body}");
        if let Some(field) = row.absent {
            assert_eq!(answer.field(field), None, "{what}: {answer:?}");
        }
        match row.then {
            Then::Closed => {
                assert!(
                    reader.closes(&mut conn).await,
                    "{what}: the connection stayed open"
                );
            }
            Then::Kept => {
                let next = reader.next(&mut conn, false).await;
                let next = next.unwrap_or_else(|| panic!("{what}: closed before the probe"));
                assert_eq!(next.status_line, OK, "{what}: the probe: {next:?}");
                if row.probe == Probe::Completion {
                    assert_eq!(String::from_utf8_lossy(&next.body), ENGINE_BODY, "{what}");
                }
            }
        }
        drop(conn);
        let mut want: Vec<String> = row
            .seen
            .iter()
            .map(|s| s.replace("{engine}", &engine_addr))
            .collect();
        if row.probe == Probe::Completion && row.then == Then::Kept {
            want.push(SEEN.replace("{engine}", &engine_addr));
        }
        let seen: Vec<String> = engine
            .take_seen()
            .iter()
            .map(|r| String::from_utf8_lossy(r).into_owned())
            .collect();
        assert_eq!(seen, want, "{what}: what reached the engine");
    }
    assert_eq!(rows.len(), 52, "the row count docs/reliability.md states");
}
