//! `eagle_io._native.LAYOUT`, `manifest_name`, `shard_prefix` and `RootLock`: the core's file
//! names and writer lock (`src/layout.rs`) for `eagle_io.store.layout`, so both languages name
//! and lock files the same way.

use std::fs::File;
use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::args::unsigned;
use crate::error::Error;
use crate::layout;

/// The layout's constants as a dict.
pub fn constants(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("manifest", layout::MANIFEST_NAME)?;
    d.set_item("shard_dir", layout::SHARD_DIR)?;
    d.set_item("shard_suffix", layout::SHARD_SUFFIX)?;
    d.set_item("temp_prefix", layout::TEMP_PREFIX)?;
    d.set_item("temp_suffix", layout::TEMP_SUFFIX)?;
    d.set_item("rank_digits", layout::RANK_DIGITS)?;
    d.set_item("seq_digits", layout::SEQ_DIGITS)?;
    Ok(d)
}

/// The manifest name of writer `rank` of `world_size`; `InvalidArgumentError` unless
/// `rank < world_size` (`manifest_name(3, 2)` named a file merge never reads).
#[pyfunction]
pub fn manifest_name(rank: &Bound<'_, PyAny>, world_size: &Bound<'_, PyAny>) -> PyResult<String> {
    let (rank, world_size): (u32, u32) = (unsigned(rank, "rank")?, unsigned(world_size, "world_size")?);
    if rank >= world_size {
        let e = Error::InvalidArgument(format!("rank {rank} is outside [0, world_size = {world_size})"));
        return Err(PyErr::from(e));
    }
    Ok(layout::manifest_name(rank, world_size))
}

/// The shard-name prefix of writer `rank` (`InvalidArgumentError` outside `[0, 2**32)`).
#[pyfunction]
pub fn shard_prefix(rank: &Bound<'_, PyAny>) -> PyResult<String> {
    Ok(layout::shard_prefix(unsigned(rank, "rank")?))
}

/// The writer lock of one manifest in a dataset root, held until `release` (or until the
/// object is collected, or the process ends).
#[pyclass(module = "eagle_io._native")]
pub struct RootLock {
    file: Option<File>,
}

#[pymethods]
impl RootLock {
    /// Takes the lock the writer of `manifest_name` in `root` holds; fails at once (an
    /// `InvalidArgumentError` naming the manifest) when a live writer holds it.
    #[new]
    fn new(root: PathBuf, manifest_name: &str) -> PyResult<RootLock> {
        let file = layout::lock_root(&root, manifest_name)?;
        Ok(RootLock { file: Some(file) })
    }

    /// Releases the lock (closing its file); later calls do nothing.
    fn release(&mut self) {
        self.file = None;
    }
}
