//! PyO3 bindings: `eagle_io._native`. Thin: argument conversion, buffer access, GIL release
//! around every heavy call, and error mapping. All logic lives in the core.

use pyo3::prelude::*;

mod buffers;
mod errors;
mod manifest;
mod reader;
mod sink;
mod writer;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<writer::Writer>()?;
    m.add_class::<reader::Reader>()?;
    m.add_class::<sink::CaptureSink>()?;
    m.add_function(wrap_pyfunction!(manifest::load_manifest, m)?)?;
    m.add_function(wrap_pyfunction!(manifest::seal_manifest, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("FORMAT_VERSION", crate::format::FORMAT_VERSION)?;
    Ok(())
}
