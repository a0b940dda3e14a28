//! `eagle_io._native.CaptureSink`: the capture ring plus its writer thread. It exports the
//! ring's arena through the buffer protocol, so Python views it as one uint8 tensor and
//! copies each sample's states into the slot `reserve` returned.

use std::ffi::c_int;
use std::time::Duration;

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::errors::py_err;
use super::writer::{stats_dict, Writer};
use crate::ring::CaptureSink as CoreSink;

#[pyclass(module = "eagle_io._native")]
pub struct CaptureSink {
    inner: CoreSink,
}

#[pymethods]
impl CaptureSink {
    /// Takes ownership of `writer` and starts the sink thread over a ring of `ring_bytes`.
    #[new]
    fn new(py: Python<'_>, writer: &Bound<'_, Writer>, ring_bytes: usize, batch: usize) -> PyResult<CaptureSink> {
        let w = writer.borrow_mut().take().map_err(py_err(py))?;
        let inner = CoreSink::start(ring_bytes, w, batch).map_err(py_err(py))?;
        Ok(CaptureSink { inner })
    }

    /// Reserves `nbytes`; returns `(slot_id, offset)` into the arena, or `None` when the ring is
    /// full and `drop_when_full`. Waits (GIL released) up to `timeout_s` otherwise.
    fn reserve(
        &self,
        py: Python<'_>,
        nbytes: usize,
        timeout_s: f64,
        drop_when_full: bool,
    ) -> PyResult<Option<(u64, usize)>> {
        let timeout = Duration::from_secs_f64(timeout_s.max(0.0));
        let inner = &self.inner;
        let r = py
            .detach(|| inner.ring().reserve(nbytes, timeout, drop_when_full))
            .map_err(py_err(py))?;
        Ok(r.map(|s| (s.id, s.offset)))
    }

    /// Hands slot `slot_id` (its bytes fully written) to the writer, or abandons it with `cancelled`.
    #[pyo3(signature = (slot_id, sample_id, key, n_tokens, cancelled = false))]
    fn commit(
        &self,
        py: Python<'_>,
        slot_id: u64,
        sample_id: u64,
        key: String,
        n_tokens: u64,
        cancelled: bool,
    ) -> PyResult<()> {
        self.inner
            .ring()
            .commit(slot_id, sample_id, key, n_tokens, cancelled)
            .map_err(py_err(py))
    }

    /// Ring counters merged with the writer's.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let d = stats_dict(py, &s.writer)?;
        d.set_item("ring_capacity", s.ring.capacity)?;
        d.set_item("ring_bytes_in_use", s.ring.bytes_in_use)?;
        d.set_item("ring_slots_in_use", s.ring.slots_in_use)?;
        d.set_item("ring_high_water_bytes", s.ring.high_water_bytes)?;
        d.set_item("producer_stall_seconds", s.ring.producer_stall_seconds)?;
        d.set_item("dropped_samples", s.ring.dropped_samples)?;
        d.set_item("abandoned_slots", s.ring.abandoned_slots)?;
        d.set_item("committed_bytes", s.ring.committed_bytes)?;
        Ok(d)
    }

    /// Drains committed samples, commits the last shard and returns the manifest JSON.
    fn close(&mut self, py: Python<'_>) -> PyResult<String> {
        let inner = &mut self.inner;
        let manifest = py.detach(|| inner.close()).map_err(py_err(py))?;
        Ok(serde_json::to_string(&manifest).expect("a manifest always serialises"))
    }

    /// Exports the arena as a writable 1-D byte buffer.
    ///
    /// # Safety
    /// Called by CPython with a valid `view` to fill.
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let (ptr, len) = {
            let me = slf.borrow();
            let arena = &me.inner.ring().arena;
            (arena.as_ptr(), arena.capacity())
        };
        // SAFETY: `view` is valid per CPython's contract; the arena outlives the export because
        // the view holds a reference to `slf` (its `obj`), and the arena never moves or shrinks.
        let rc = unsafe { ffi::PyBuffer_FillInfo(view, slf.as_ptr(), ptr.cast(), len as ffi::Py_ssize_t, 0, flags) };
        if rc != 0 {
            return Err(PyBufferError::new_err("cannot export the capture ring"));
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}
