//! `eagle_io._native.storage_stats` (this process's object-storage counters) and
//! `upload_dataset`, `list_objects`, `put_manifest` (src/storage/).

use std::path::PathBuf;

use pyo3::prelude::*;

use super::blocking::blocking;
/// `{"requests", "retried", "bytes", "cache_*"}`: HTTP requests sent (retries included), requests
/// that failed transiently (5xx, 429, timeout) and were retried with backoff, payload bytes read;
/// the read-through cache's `cache_hits`, `cache_fills`, `cache_evicted` (LRU), `cache_refetched`
/// (a copy that failed a check) and `cache_too_big` (shards over the cap, read uncached).
#[pyfunction]
pub fn storage_stats() -> std::collections::BTreeMap<&'static str, u64> {
    let s = crate::storage::stats();
    let c = crate::storage::cache_stats();
    [
        ("requests", s.requests),
        ("retried", s.retried),
        ("bytes", s.bytes),
        ("cache_hits", c.hits),
        ("cache_fills", c.fills),
        ("cache_evicted", c.evicted),
        ("cache_refetched", c.refetched),
        ("cache_too_big", c.too_big),
    ]
    .into_iter()
    .collect()
}

/// Uploads the committed dataset whose manifest is `manifest` to the object prefix `url`:
/// shards the remote manifest does not list yet (multipart), then the manifest (conditional
/// PUT). Returns `(uploaded shard files, skipped shard files, bytes uploaded)`.
#[pyfunction]
pub fn upload_dataset(py: Python<'_>, manifest: PathBuf, url: String) -> PyResult<(Vec<String>, Vec<String>, u64)> {
    let r = blocking(py, |_| {
        crate::storage::upload_dataset(&manifest, std::path::Path::new(&url))
    })?;
    Ok((r.uploaded, r.skipped, r.bytes))
}

/// `[(url, bytes)]` of the objects directly under the prefix `url` and under `url/{sub}` for
/// each of `subs`, in key order.
#[pyfunction]
pub fn list_objects(py: Python<'_>, url: String, subs: Vec<String>) -> PyResult<Vec<(String, u64)>> {
    let subs: Vec<&str> = subs.iter().map(String::as_str).collect();
    blocking(py, |_| crate::storage::list_objects(std::path::Path::new(&url), &subs))
}

/// Puts the manifest `data` at the object URL `url` with a conditional PUT (create-only, or
/// if-match on the ETag of the one there now): `IncompatibleDatasetError` when another writer
/// got in between.
#[pyfunction]
pub fn put_manifest(py: Python<'_>, data: &[u8], url: String) -> PyResult<()> {
    let data = data.to_vec();
    blocking(py, |_| crate::storage::put_manifest(data, std::path::Path::new(&url)))
}
