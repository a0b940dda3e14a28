//! The one way a binding calls into the core for anything that may take long: [`blocking`]
//! releases the GIL, and while the core waits (a producer on a full ring, a sink's close) runs
//! Python's signal handlers every `interrupt::SLICE`, so Ctrl-C raises `KeyboardInterrupt`
//! within a slice instead of after the core's own timeout.

use std::sync::Mutex;

use pyo3::prelude::*;

use crate::error::Error;
use crate::interrupt::Interrupt;

/// Runs `f` with the GIL released, handing it an [`Interrupt`] that runs Python's signal handlers
/// (`Python::check_signals`; they run only on the main thread). A handler that raises (SIGINT's
/// `KeyboardInterrupt`, or `eagle_io.cli.interrupt`'s SIGTERM handler) makes the core's wait
/// return `Error::Interrupted` having changed nothing, and its exception is raised here; the
/// core's other errors become their Python classes (`From<Error> for PyErr`).
pub fn blocking<T, F>(py: Python<'_>, f: F) -> PyResult<T>
where
    T: Send,
    F: Send + FnOnce(&Interrupt<'_>) -> Result<T, Error>,
{
    let raised: Mutex<Option<PyErr>> = Mutex::new(None);
    let stop = || match Python::attach(|py| py.check_signals()) {
        Ok(()) => false,
        Err(e) => {
            *raised.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
            true
        }
    };
    let out = py.detach(|| f(&Interrupt::new(&stop)));
    out.map_err(|e| {
        let raised = raised.into_inner().unwrap_or_else(|p| p.into_inner());
        raised.unwrap_or_else(|| e.into())
    })
}
