//! (being written: see agent/src/k8s.rs)
