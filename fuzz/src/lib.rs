//! What the fuzz targets share: a KV batch encoder (the agent's is test-only) and a loopback
//! harness for the HTTP/1.1 targets (warmpath's HTTP/1.1 reads from real TCP streams).

pub mod kv_encode;
pub mod net;
