//! Tests of the policy store.
