//! `eagle_io._native.CaptureSink`: the capture ring plus its writer thread. `reserve` hands
//! out one slot at a time (`RingSlot`, a buffer of exactly the slot's bytes); Python copies a
//! sample's states into it and commits it. The arena itself is never exported.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::args::{seconds, unsigned, unsigned_opt};
use super::blocking::blocking;
use super::manifest::manifest_to_py;
use super::slot::RingSlot;
use super::writer::{stats_dict, Writer};
use crate::error::Error;
use crate::ring::{CaptureSink as CoreSink, SharedPrefix};

#[pyclass(module = "eagle_io._native")]
pub struct CaptureSink {
    inner: CoreSink,
}

#[pymethods]
impl CaptureSink {
    /// Takes ownership of `writer` and starts the sink thread over a ring of `ring_bytes`.
    /// Raises `InvalidArgumentError` naming a negative or too large `ring_bytes` or `batch`.
    #[new]
    fn new(
        writer: &Bound<'_, Writer>,
        ring_bytes: &Bound<'_, PyAny>,
        batch: &Bound<'_, PyAny>,
    ) -> PyResult<CaptureSink> {
        let (ring_bytes, batch) = (unsigned(ring_bytes, "ring_bytes")?, unsigned(batch, "batch")?);
        let w = writer.borrow_mut().take()?;
        let inner = CoreSink::start(ring_bytes, w, batch)?;
        Ok(CaptureSink { inner })
    }

    /// Reserves `nbytes`; returns the slot, or `None` when the ring is full and
    /// `drop_when_full`. Waits (GIL released) up to `timeout_s` otherwise (negative: 0).
    /// Raises `InvalidArgumentError` naming a negative or too large `nbytes`, or a NaN or
    /// infinite `timeout_s`.
    fn reserve(
        slf: &Bound<'_, Self>,
        nbytes: &Bound<'_, PyAny>,
        timeout_s: f64,
        drop_when_full: bool,
    ) -> PyResult<Option<RingSlot>> {
        let py = slf.py();
        let nbytes: usize = unsigned(nbytes, "nbytes")?;
        let timeout = seconds(timeout_s, "timeout_s")?;
        let me = slf.borrow();
        let ring = me.inner.ring();
        let r = blocking(py, |interrupt| ring.reserve(nbytes, timeout, drop_when_full, interrupt))?;
        let base = ring.arena.as_ptr() as usize;
        Ok(r.map(|s| RingSlot::new(slf.clone().into_any().unbind(), s.id, base + s.offset, nbytes)))
    }

    /// Hands `slot` (its bytes fully written, no view of it written again) to the writer, or
    /// abandons it with `cancelled`. A slot is handed back once. `fp8_clamped` (an int) says the
    /// slot's FP8 tensors hold quantised rows (scales then e4m3fn bytes per token, as
    /// `eagle_io.store.fp8.quantize_rows` makes them on the source device) whose quantiser
    /// saturated that many values; the writer checks and stores them without quantising again.
    /// `shared_prefix` (tokens): the sample's first tokens that other samples share, stored once as a
    /// prefix record (docs/FORMAT.md 4.7), the sample as its rows after them and a reference.
    /// `stored_prefix` (32 bytes): the SHA-256 digest of a prefix record's token ids, written
    /// before this slot is committed; the slot holds only the `n_tokens` rows after that prefix.
    #[pyo3(signature = (slot, sample_id, key, n_tokens, cancelled = false, fp8_clamped = None, shared_prefix = None, stored_prefix = None))]
    ///
    /// Raises `InvalidArgumentError` for a slot another sink reserved or a negative or too
    /// large `sample_id`, `n_tokens` or `fp8_clamped` (each in `[0, 2**64)`), both `shared_prefix`
    /// and `stored_prefix`, or a `stored_prefix` of other than 32 bytes, and `SchemaError` when
    /// `n_tokens` rows of the schema do not fill the slot exactly (all before anything is
    /// handed over: the slot stays reserved, and the sink keeps running).
    #[allow(clippy::too_many_arguments)]
    fn commit(
        slf: &Bound<'_, Self>,
        slot: &RingSlot,
        sample_id: &Bound<'_, PyAny>,
        key: String,
        n_tokens: &Bound<'_, PyAny>,
        cancelled: bool,
        fp8_clamped: Option<&Bound<'_, PyAny>>,
        shared_prefix: Option<&Bound<'_, PyAny>>,
        stored_prefix: Option<&[u8]>,
    ) -> PyResult<()> {
        let sample_id: u64 = unsigned(sample_id, "sample_id")?;
        let n_tokens: u64 = unsigned(n_tokens, "n_tokens")?;
        let fp8_clamped: Option<u64> = unsigned_opt(fp8_clamped, "fp8_clamped")?;
        let shared_prefix: u64 = unsigned_opt(shared_prefix, "shared_prefix")?.unwrap_or(0);
        let prefix = match (shared_prefix, stored_prefix) {
            (0, None) => SharedPrefix::None,
            (n, None) => SharedPrefix::First(n),
            (0, Some(d)) => SharedPrefix::Stored(d.try_into().map_err(|_| {
                Error::InvalidArgument(format!(
                    "stored_prefix is a 32-byte SHA-256 digest, not {} bytes",
                    d.len()
                ))
            })?),
            (_, Some(_)) => {
                let e = "a sample gives either its shared_prefix or a stored_prefix, not both";
                return Err(PyErr::from(Error::InvalidArgument(e.into())));
            }
        };
        if !slot.reserved_by(slf.as_any()) {
            let e = Error::InvalidArgument(format!("ring slot {} was reserved by another capture sink", slot.id()));
            return Err(PyErr::from(e));
        }
        let me = slf.borrow();
        let (id, len) = (slot.id(), slot.len());
        me.inner
            .commit(
                id,
                len,
                sample_id,
                key,
                n_tokens,
                cancelled,
                fp8_clamped,
                prefix,
                || slot.hand_over(),
            )
            .map_err(PyErr::from)
    }

    /// `(address, nbytes)` of the whole arena, for registering it as pinned memory with CUDA
    /// (`cudaHostRegister`); write through `reserve`'s slots only.
    fn arena_span(&self) -> (usize, usize) {
        let arena = &self.inner.ring().arena;
        (arena.as_ptr() as usize, arena.capacity())
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

    /// Drains committed samples, commits the last shard and returns the manifest (a dict); with
    /// `complete=False` the manifest stays marked incomplete (an interrupted capture).
    #[pyo3(signature = (complete = true))]
    fn close<'py>(&mut self, py: Python<'py>, complete: bool) -> PyResult<Bound<'py, PyAny>> {
        let inner = &mut self.inner;
        let manifest = blocking(py, |interrupt| {
            if complete {
                inner.close(interrupt)
            } else {
                inner.close_incomplete(interrupt)
            }
        })?;
        manifest_to_py(py, &manifest)
    }
}
