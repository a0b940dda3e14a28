//! `eagle_io._native.load_manifest` / `seal_manifest`: the manifest's checksum (FORMAT.md 2) for
//! Python code that reads or writes a manifest without opening its shards (`eagle_io.store.manifest`).

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::blocking::blocking;
use super::values::{json_to_py, py_to_json};
use crate::dataset::Manifest;
use crate::error::Error;

/// Loads and checks the manifest at `path` (format, version, checksum, fields); returns it as the
/// dict `json.loads` makes of its file, without its `checksum` member.
#[pyfunction]
pub fn load_manifest<'py>(py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyAny>> {
    let manifest = blocking(py, |_| Manifest::load(&path))?;
    manifest_to_py(py, &manifest)
}

/// The sealed file bytes of the manifest given as a dict (any `checksum` member is replaced).
#[pyfunction]
pub fn seal_manifest<'py>(py: Python<'py>, manifest: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    let value = py_to_json(manifest).map_err(|e| Error::InvalidArgument(format!("not a valid manifest: {e}")))?;
    let manifest: Manifest =
        serde_json::from_value(value).map_err(|e| Error::InvalidArgument(format!("not a valid manifest: {e}")))?;
    Ok(PyBytes::new(py, &manifest.to_sealed_bytes()))
}

/// A manifest as the dict `json.loads` makes of its file (without `checksum`).
pub fn manifest_to_py<'py>(py: Python<'py>, manifest: &Manifest) -> PyResult<Bound<'py, PyAny>> {
    json_to_py(
        py,
        &serde_json::to_value(manifest).expect("a manifest always serialises"),
    )
}
