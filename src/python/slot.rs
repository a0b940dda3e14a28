//! `eagle_io._native.RingSlot`: one reserved slot of the capture ring, the only part of the
//! arena Python can write. It exports exactly the slot's bytes through the buffer protocol,
//! and no new export once the slot is handed back (committed or abandoned): from then on its
//! bytes belong to the writer thread until the ring releases them.
//!
//! The producer's contract (kept by `eagle_io.capturing.ring.RingSink.put`): write a slot only
//! between `reserve` and `commit`, and let every view of it die before the commit. Exports
//! cannot be counted to enforce this: `torch.frombuffer` releases its export at once and keeps
//! only a reference to the slot object.

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

use pyo3::ffi;
use pyo3::prelude::*;

use super::errors;
use crate::error::Error;

#[pyclass(module = "eagle_io._native", frozen)]
pub struct RingSlot {
    /// The `CaptureSink` that reserved the slot: keeps it, hence the arena, alive while this slot
    /// (or a view of it) lives. Held as any object, so this module needs nothing of the sink's.
    sink: Py<PyAny>,
    id: u64,
    /// Address of the slot's first byte in the arena.
    addr: usize,
    len: usize,
    handed_over: AtomicBool,
}

impl RingSlot {
    pub fn new(sink: Py<PyAny>, id: u64, addr: usize, len: usize) -> RingSlot {
        RingSlot {
            sink,
            id,
            addr,
            len,
            handed_over: AtomicBool::new(false),
        }
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// Bytes in the slot.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether `sink` reserved this slot (a slot id of another sink names other bytes here).
    pub fn reserved_by(&self, sink: &Bound<'_, PyAny>) -> bool {
        self.sink.as_ptr() == sink.as_ptr()
    }

    /// Marks the slot handed back to the ring (committed, or abandoned with `cancelled`): no new
    /// view of it can be taken, and it cannot be handed back twice.
    pub fn hand_over(&self) -> Result<(), Error> {
        if self.handed_over.swap(true, SeqCst) {
            return Err(Error::InvalidArgument(format!(
                "ring slot {} was already committed",
                self.id
            )));
        }
        Ok(())
    }
}

#[pymethods]
impl RingSlot {
    /// Bytes in the slot.
    fn __len__(&self) -> usize {
        self.len
    }

    /// Exports the slot's bytes as a writable 1-D byte buffer.
    ///
    /// # Safety
    /// Called by CPython with a valid `view` to fill.
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let me = slf.get();
        if me.handed_over.load(SeqCst) {
            let msg = format!("ring slot {} was committed: its bytes belong to the writer", me.id);
            return Err(errors::ring_slot_error(slf.py(), msg));
        }
        let (ptr, len) = (me.addr as *mut u8, me.len);
        // SAFETY: `view` is valid per CPython's contract. The range `[addr, addr + len)` lies
        // inside the arena (the ring reserved it for this slot alone) and is not handed over yet
        // (checked above), so no other party reads or writes it until the producer commits; the
        // producer's contract (module doc) keeps its writes before the commit. The arena outlives
        // the export: the view holds a reference to `slf` (its `obj`), which holds the sink, and
        // the arena never moves or shrinks.
        let rc = unsafe { ffi::PyBuffer_FillInfo(view, slf.as_ptr(), ptr.cast(), len as ffi::Py_ssize_t, 0, flags) };
        if rc != 0 {
            let msg = format!("ring slot {}: PyBuffer_FillInfo refused the export", me.id);
            return Err(errors::ring_slot_error(slf.py(), msg));
        }
        Ok(())
    }
}
