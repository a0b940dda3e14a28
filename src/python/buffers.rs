//! Borrowing the bytes of Python buffers (numpy arrays, `memoryview`s of torch tensors)
//! without copying them.

use pyo3::buffer::PyUntypedBuffer;
use pyo3::prelude::*;

use crate::error::Error;

/// A C-contiguous buffer export, held for as long as its bytes are borrowed.
pub struct Borrowed(PyUntypedBuffer);

impl Borrowed {
    /// Takes a buffer export of `obj`; `writable` requires a writable buffer. `what` names
    /// the tensor in errors.
    pub fn get(obj: &Bound<'_, PyAny>, writable: bool, what: &str) -> Result<Borrowed, Error> {
        let buf = PyUntypedBuffer::get(obj)
            .map_err(|e| Error::InvalidArgument(format!("{what}: does not export a buffer ({e})")))?;
        if !buf.is_c_contiguous() {
            return Err(Error::InvalidArgument(format!(
                "{what}: not C-contiguous (call .contiguous() first)"
            )));
        }
        if writable && buf.readonly() {
            return Err(Error::InvalidArgument(format!("{what}: buffer is read-only")));
        }
        Ok(Borrowed(buf))
    }

    pub fn len(&self) -> usize {
        self.0.len_bytes()
    }

    /// The exported bytes.
    pub fn bytes(&self) -> &[u8] {
        if self.len() == 0 {
            return &[];
        }
        // SAFETY: the export is C-contiguous and `len_bytes` long, and the exporter keeps
        // the memory alive and unmoved until the export is released (when `self` drops).
        // The slice borrows `self`, so it cannot outlive the export.
        unsafe { std::slice::from_raw_parts(self.0.buf_ptr() as *const u8, self.len()) }
    }

    /// The exported bytes, for writing. Only for exports taken with `writable`.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        assert!(!self.0.readonly(), "bytes_mut on a read-only export");
        if self.len() == 0 {
            return &mut [];
        }
        // SAFETY: as in `bytes`; the export is writable (asserted above),
        // and `&mut self` makes this the only slice over it from Rust.
        unsafe { std::slice::from_raw_parts_mut(self.0.buf_ptr() as *mut u8, self.len()) }
    }
}
