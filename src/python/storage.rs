//! `eagle_io._native.storage_stats`: this process's object-storage counters (src/storage/).

use pyo3::prelude::*;

/// `{"requests", "retried", "bytes"}`: HTTP requests sent (retries included), requests that
/// failed transiently (5xx, 429, timeout) and were retried with backoff, payload bytes read.
#[pyfunction]
pub fn storage_stats() -> std::collections::BTreeMap<&'static str, u64> {
    let s = crate::storage::stats();
    [("requests", s.requests), ("retried", s.retried), ("bytes", s.bytes)]
        .into_iter()
        .collect()
}
