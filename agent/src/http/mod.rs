//! warmpath's own HTTP/1.1, on both legs of the data path: the server side to applications
//! ([`server`]) and the client side to engines ([`client`]). Each request is read, handed to
//! a [`server::Handler`], and answered on the task of its client connection: no connection
//! task per upstream, no channel between tasks, header values kept as slices of the bytes read
//! (no copy, no allocation per field).
//!
//! This layer knows HTTP only: it imports nothing from the application (routing, telemetry,
//! pools, the proxy). What both legs share lives in its own files: body framing and the
//! framing header fields ([`framing`]), header spans ([`headers`]), decimals ([`ascii`]),
//! the request head and answer types ([`message`]), the worker shard index the client pools
//! connections by ([`worker`]), and the SSE event splitter ([`sse`]).

pub mod ascii;
pub mod client;
pub mod framing;
pub mod headers;
pub mod message;
pub mod server;
pub mod sse;
pub mod worker;

use bytes::Bytes;

pub use client::{H1Body, H1Client, Outgoing};
pub use headers::Headers;
pub use message::{Answer, Refusal, RequestHead};

/// Largest message head accepted (request or response).
pub const MAX_HEAD: usize = 64 * 1024;
/// Most header fields in a message head.
pub const MAX_HEADERS: usize = 100;

/// Errors of streamed bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The body type of every answer.
pub type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;
