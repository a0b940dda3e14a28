//! `From<Error> for PyErr`: maps each core `Error` variant to its Python exception class
//! (defined in `python/eagle_io/errors.py`, so classes can also derive from `ValueError`,
//! `OSError`...) and attaches the fields (path, sample id, byte offset) as attributes. An
//! `Error::Earlier` (an error raised again under a context) takes its cause's class and fields;
//! `Error::Interrupted` (a wait cut short by a signal) is a `KeyboardInterrupt`, no error.
//! Bindings raise core errors with `?`.

use pyo3::exceptions::PyKeyboardInterrupt;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyType};

use crate::error::Error;

/// The Python class of each variant, in `class_of`'s order, imported once per process.
static CLASSES: [PyOnceLock<Py<PyType>>; 10] = [const { PyOnceLock::new() }; 10];

/// The Python class of `err`'s variant (of its cause, for `Error::Earlier`): an
/// `eagle_io.errors` class, imported once into its slot of `CLASSES`.
fn class_of<'py>(py: Python<'py>, err: &Error) -> PyResult<Bound<'py, PyType>> {
    let (index, name) = match err.root() {
        Error::Earlier { .. } => unreachable!("root() unwraps Earlier"),
        Error::Interrupted => return Ok(py.get_type::<PyKeyboardInterrupt>()),
        Error::Io { .. } => (0, "StorageError"),
        Error::Corrupt { .. } => (1, "CorruptRecordError"),
        Error::FormatVersion { .. } => (2, "FormatVersionError"),
        Error::Schema { .. } => (3, "SchemaError"),
        Error::Incompatible(_) => (4, "IncompatibleDatasetError"),
        Error::NotFound(_) => (5, "SampleNotFoundError"),
        Error::InvalidArgument(_) => (6, "InvalidArgumentError"),
        Error::Timeout(_) => (7, "RingTimeoutError"),
        Error::Internal(_) => (8, "InternalError"),
        Error::Storage { .. } => (9, "ObjectStorageError"),
    };
    CLASSES[index].import(py, "eagle_io.errors", name).cloned()
}

fn build(py: Python<'_>, err: &Error) -> PyResult<PyErr> {
    let attrs = PyDict::new(py);
    match err.root() {
        Error::Io { path, source } => {
            attrs.set_item("path", path.to_string_lossy())?;
            attrs.set_item("errno", source.raw_os_error())?;
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
        }
        Error::FormatVersion { path, found, supported } => {
            attrs.set_item("path", path.to_string_lossy())?;
            attrs.set_item("found", found)?;
            attrs.set_item("supported", supported)?;
        }
        Error::Schema { sample_id, .. } => attrs.set_item("sample_id", sample_id)?,
        Error::Storage { url, status, .. } => {
            attrs.set_item("path", url)?;
            attrs.set_item("url", url)?;
            attrs.set_item("status", status)?;
            attrs.set_item("errno", None::<i32>)?;
        }
        Error::Incompatible(_)
        | Error::NotFound(_)
        | Error::InvalidArgument(_)
        | Error::Timeout(_)
        | Error::Internal(_)
        | Error::Interrupted
        | Error::Earlier { .. } => {}
    }
    let exc = class_of(py, err)?.call1((err.to_string(),))?;
    for (k, v) in attrs.iter() {
        exc.setattr(k.extract::<String>()?, v)?;
    }
    Ok(PyErr::from_value(exc))
}

impl From<Error> for PyErr {
    /// The Python exception for a core error.
    fn from(err: Error) -> PyErr {
        Python::attach(|py| build(py, &err).unwrap_or_else(|e| e))
    }
}

/// `eagle_io.errors.RingSlotError` (a `BufferError`: raised from the buffer protocol) with `msg`.
pub fn ring_slot_error(py: Python<'_>, msg: String) -> PyErr {
    static CLASS: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    match CLASS.import(py, "eagle_io.errors", "RingSlotError") {
        Ok(class) => PyErr::from_type(class.clone(), msg),
        Err(e) => e,
    }
}
