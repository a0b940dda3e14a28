//! `eagle_io._native.load_manifest` / `seal_manifest`: the manifest's checksum (FORMAT.md 2) for
//! Python code that reads or writes a manifest without opening its shards (`eagle_io.store.manifest`).

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::blocking::blocking;
use crate::dataset::Manifest;
use crate::error::Error;

/// Loads and checks the manifest at `path` (format, version, checksum, fields); returns it as
/// JSON without its `checksum` member.
#[pyfunction]
pub fn load_manifest(py: Python<'_>, path: PathBuf) -> PyResult<String> {
    let manifest = blocking(py, |_| Manifest::load(&path))?;
    Ok(serde_json::to_string(&manifest).expect("a manifest always serialises"))
}

/// The sealed file bytes of the manifest given as JSON (any `checksum` member is replaced).
#[pyfunction]
pub fn seal_manifest<'py>(py: Python<'py>, json: &str) -> PyResult<Bound<'py, PyBytes>> {
    let manifest: Manifest =
        serde_json::from_str(json).map_err(|e| Error::InvalidArgument(format!("not a valid manifest: {e}")))?;
    Ok(PyBytes::new(py, &manifest.to_sealed_bytes()))
}
