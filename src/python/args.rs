//! Integer and float arguments of the bindings (counts, sizes, positions, ids, timeouts).
//! PyO3's own conversion of a negative or too large int to an unsigned type raises a bare
//! `OverflowError` naming neither the argument nor the range; these raise
//! `InvalidArgumentError` naming both (and `ArgumentTypeError` for a value that is no int).

use std::time::Duration;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

use crate::error::Error;

/// An unsigned integer type an argument converts to, with its range as the error names it.
pub trait Unsigned: for<'a, 'py> FromPyObject<'a, 'py> {
    const RANGE: &'static str;
}

impl Unsigned for u64 {
    const RANGE: &'static str = "[0, 2**64)";
}

impl Unsigned for usize {
    #[cfg(target_pointer_width = "64")]
    const RANGE: &'static str = "[0, 2**64)";
    #[cfg(not(target_pointer_width = "64"))]
    const RANGE: &'static str = "[0, 2**32)";
}

impl Unsigned for u32 {
    const RANGE: &'static str = "[0, 2**32)";
}

/// `value` (the argument `name`) as a `T`: an int, or any integer with `__index__` (numpy's).
pub fn unsigned<T: Unsigned>(value: &Bound<'_, PyAny>, name: &str) -> PyResult<T> {
    if let Ok(v) = value.extract::<T>() {
        return Ok(v);
    }
    let py = value.py();
    let index = py.import("operator")?.getattr("index")?;
    match index.call1((value,)) {
        Ok(int) => Err(PyErr::from(Error::InvalidArgument(format!(
            "{name} must be an integer in {}, not {int}",
            T::RANGE
        )))),
        Err(_) => {
            let kind = value.get_type().name().map_or_else(|_| "?".into(), |n| n.to_string());
            Err(argument_type_error(py, format!("{name} must be an int, not {kind}")))
        }
    }
}

/// `value` (the argument `name`), when given, as a `T`.
pub fn unsigned_opt<T: Unsigned>(value: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<Option<T>> {
    value.map(|v| unsigned(v, name)).transpose()
}

/// `seconds` (the argument `name`) as a duration: negative counts as 0; NaN, infinite or
/// beyond `Duration`'s range (about 5.8e11 years) is an `InvalidArgumentError`.
pub fn seconds(seconds: f64, name: &str) -> PyResult<Duration> {
    let duration = match seconds.is_nan() {
        true => None,
        false => Duration::try_from_secs_f64(seconds.max(0.0)).ok(),
    };
    duration.ok_or_else(|| {
        PyErr::from(Error::InvalidArgument(format!(
            "{name} must be a finite number of seconds, not {seconds}"
        )))
    })
}

/// `eagle_io.errors.ArgumentTypeError` (an `InvalidArgumentError` and a `TypeError`) with `msg`.
fn argument_type_error(py: Python<'_>, msg: String) -> PyErr {
    static CLASS: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    match CLASS.import(py, "eagle_io.errors", "ArgumentTypeError") {
        Ok(class) => PyErr::from_type(class.clone(), msg),
        Err(e) => e,
    }
}
