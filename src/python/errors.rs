//! Maps each core `Error` variant to its Python exception class (defined in
//! `python/eagle_io/errors.py`, so classes can also derive from `ValueError`, `OSError`...)
//! and attaches the fields (path, sample id, byte offset) as attributes.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::error::Error;

fn build(py: Python<'_>, err: &Error) -> PyResult<PyErr> {
    let attrs = PyDict::new(py);
    let class = match err {
        Error::Io { path, source } => {
            attrs.set_item("path", path.to_string_lossy())?;
            attrs.set_item("errno", source.raw_os_error())?;
            "StorageError"
        }
        Error::Corrupt {
            path,
            sample_id,
            offset,
            ..
        } => {
            attrs.set_item("path", path.to_string_lossy())?;
            attrs.set_item("sample_id", sample_id)?;
            attrs.set_item("offset", offset)?;
            "CorruptRecordError"
        }
        Error::FormatVersion { path, found, supported } => {
            attrs.set_item("path", path.to_string_lossy())?;
            attrs.set_item("found", found)?;
            attrs.set_item("supported", supported)?;
            "FormatVersionError"
        }
        Error::Schema { sample_id, .. } => {
            attrs.set_item("sample_id", sample_id)?;
            "SchemaError"
        }
        Error::Incompatible(_) => "IncompatibleDatasetError",
        Error::NotFound(_) => "SampleNotFoundError",
        Error::InvalidArgument(_) => "InvalidArgumentError",
        Error::Timeout(_) => "RingTimeoutError",
        Error::Internal(_) => "InternalError",
    };
    let exc = py
        .import("eagle_io.errors")?
        .getattr(class)?
        .call1((err.to_string(),))?;
    for (k, v) in attrs.iter() {
        exc.setattr(k.extract::<String>()?, v)?;
    }
    Ok(PyErr::from_value(exc))
}

/// The Python exception for a core error.
pub fn to_py(py: Python<'_>, err: Error) -> PyErr {
    build(py, &err).unwrap_or_else(|e| e)
}

/// `map_err` helper: `result.map_err(py_err(py))`.
pub fn py_err(py: Python<'_>) -> impl Fn(Error) -> PyErr + '_ {
    move |e| to_py(py, e)
}
