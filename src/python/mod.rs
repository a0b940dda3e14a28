//! PyO3 bindings: `eagle_io._native`. Thin: argument conversion, buffer access, GIL release
//! around every heavy call, and error mapping. All logic lives in the core.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::dataset::WriterOptions;
use crate::ring::{DEFAULT_DROP_WHEN_FULL, DEFAULT_RESERVE_TIMEOUT_S, DEFAULT_RING_BATCH, DEFAULT_RING_BYTES};

mod args;
mod blocking;
mod buffers;
mod errors;
mod layout;
mod manifest;
mod reader;
mod sink;
mod slot;
mod storage;
mod values;
mod writer;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<writer::Writer>()?;
    m.add_class::<reader::Reader>()?;
    m.add_class::<sink::CaptureSink>()?;
    m.add_class::<slot::RingSlot>()?;
    m.add_class::<layout::RootLock>()?;
    m.add_function(wrap_pyfunction!(layout::manifest_name, m)?)?;
    m.add_function(wrap_pyfunction!(layout::shard_prefix, m)?)?;
    m.add_function(wrap_pyfunction!(manifest::load_manifest, m)?)?;
    m.add_function(wrap_pyfunction!(manifest::seal_manifest, m)?)?;
    m.add_function(wrap_pyfunction!(storage::storage_stats, m)?)?;
    m.add_function(wrap_pyfunction!(storage::upload_dataset, m)?)?;
    m.add_function(wrap_pyfunction!(storage::list_objects, m)?)?;
    m.add_function(wrap_pyfunction!(storage::put_manifest, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("FORMAT_VERSION", crate::format::FORMAT_VERSION)?;
    m.add("DEFAULTS", defaults(m.py())?)?;
    m.add("LAYOUT", layout::constants(m.py())?)?;
    Ok(())
}

/// Seconds between two looks at a followed capture's manifest (`ShardDataset(..., follow=True)`).
const FOLLOW_POLL_S: f64 = 1.0;
/// Seconds a followed capture may go without committing a shard before the reader gives up.
const FOLLOW_TIMEOUT_S: f64 = 3600.0;
/// Seconds `stop_capture` waits for every SGLang scheduler to drain, commit and answer.
const STOP_TIMEOUT_S: f64 = 600.0;
/// Seconds between two progress lines of a command whose stderr is not a terminal (a log file, CI): each a
/// full line, where a terminal gets one bar redrawn in place.
const PROGRESS_LOG_S: f64 = 30.0;
/// Bytes of committed shards a capture to object storage may keep staged, awaiting upload,
/// before it blocks (on top of the shard being written): four default shards.
const STAGING_BYTES: u64 = 4 << 30;

/// Every tunable's default, defined once in the core (`WriterOptions::default`, `FetchOptions::default`,
/// `src/ring/mod.rs`, the feed's follow, SGLang stop, progress and upload staging constants above); `eagle_io.defaults` reads
/// them from here.
fn defaults(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let w = WriterOptions::default();
    let d = PyDict::new(py);
    d.set_item("shard_bytes", w.shard_bytes)?;
    d.set_item("chunk_bytes", w.chunk_bytes)?;
    d.set_item("threads", w.threads)?;
    d.set_item("zstd_level", w.codec.zstd_level)?;
    d.set_item("queue_depth", w.queue_depth)?;
    d.set_item("ring_bytes", DEFAULT_RING_BYTES)?;
    d.set_item("ring_batch", DEFAULT_RING_BATCH)?;
    d.set_item("ring_timeout_s", DEFAULT_RESERVE_TIMEOUT_S)?;
    d.set_item("drop_when_full", DEFAULT_DROP_WHEN_FULL)?;
    d.set_item("follow_poll_s", FOLLOW_POLL_S)?;
    d.set_item("follow_timeout_s", FOLLOW_TIMEOUT_S)?;
    d.set_item("stop_timeout_s", STOP_TIMEOUT_S)?;
    d.set_item("progress_log_s", PROGRESS_LOG_S)?;
    let fetch = crate::storage::FetchOptions::default();
    d.set_item("remote_in_flight", fetch.in_flight)?;
    d.set_item("remote_coalesce_gap", fetch.coalesce_gap)?;
    d.set_item("remote_part_bytes", fetch.part_bytes)?;
    d.set_item("cache_bytes", crate::storage::DEFAULT_CACHE_BYTES)?;
    d.set_item("staging_bytes", STAGING_BYTES)?;
    Ok(d)
}
