//! Borrowing the bytes of Python buffers (numpy arrays, `memoryview`s of torch tensors)
//! without copying them.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use pyo3::buffer::PyUntypedBuffer;
use pyo3::prelude::*;

use crate::error::Error;

/// A C-contiguous buffer export, held for as long as its bytes are borrowed.
pub struct Borrowed(PyUntypedBuffer);

impl Borrowed {
    /// Takes a buffer export of `obj` to read. `what` names the tensor in errors.
    pub fn get(obj: &Bound<'_, PyAny>, what: &str) -> Result<Borrowed, Error> {
        let buf = PyUntypedBuffer::get(obj)
            .map_err(|e| Error::InvalidArgument(format!("{what}: does not export a buffer ({e})")))?;
        if !buf.is_c_contiguous() {
            return Err(Error::InvalidArgument(format!(
                "{what}: not C-contiguous (call .contiguous() first)"
            )));
        }
        Ok(Borrowed(buf))
    }

    /// Takes a buffer export of `obj` to write: the export must be writable, and `probe` must
    /// find its memory writable (see [`WriteProbe`]). `what` names the tensor in errors.
    pub fn get_writable(obj: &Bound<'_, PyAny>, what: &str, probe: &WriteProbe) -> Result<Borrowed, Error> {
        let borrowed = Borrowed::get(obj, what)?;
        if borrowed.0.readonly() {
            return Err(Error::InvalidArgument(format!("{what}: buffer is read-only")));
        }
        let (ptr, len) = (borrowed.0.buf_ptr() as *mut u8, borrowed.len());
        if len > 0
            && !probe
                .can_write(ptr, len)
                .map_err(|e| Error::io("<write probe pipe>", e))?
        {
            return Err(Error::InvalidArgument(format!(
                "{what}: the memory is read-only though its buffer says writable (e.g. a tensor made \
                 by torch.from_numpy over a read-only memory map); writing it would crash"
            )));
        }
        Ok(borrowed)
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

    /// The exported bytes, for writing. Only for exports taken with `get_writable`.
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

/// Asks the kernel, not a fault, whether output memory can be written: a torch tensor made by
/// `torch.from_numpy` over a read-only memory map exports a writable buffer (torch has no
/// read-only tensors), so the export's flag alone would let the decode write there and the
/// process die of `SIGSEGV`. A byte goes through a pipe and back to where it was: `read` fails
/// with `EFAULT` instead of storing where the memory is not writable. One pipe serves the
/// outputs of one call (closed when dropped, so no descriptor outlives the call or crosses a
/// fork); bytes keep their values.
pub struct WriteProbe {
    read_end: OwnedFd,
    write_end: OwnedFd,
}

/// The smallest page size: bytes this far apart may lie on pages of different protection.
const MIN_PAGE: usize = 4096;

impl WriteProbe {
    pub fn new() -> io::Result<WriteProbe> {
        // std's pipe is close-on-exec: a process another thread spawns meanwhile inherits neither end.
        let (read_end, write_end) = io::pipe()?;
        Ok(WriteProbe {
            read_end: read_end.into(),
            write_end: write_end.into(),
        })
    }

    /// Whether the first and last byte of `[ptr, ptr + len)` (readable memory of one export,
    /// `len > 0`) can be written; the last only when it may lie on another page.
    fn can_write(&self, ptr: *mut u8, len: usize) -> io::Result<bool> {
        let last = len - 1;
        let same_page = (ptr as usize) / MIN_PAGE == (ptr as usize + last) / MIN_PAGE;
        for at in if same_page { vec![0] } else { vec![0, last] } {
            // SAFETY: `at < len`, so the byte lies inside the caller's readable range.
            let p = unsafe { ptr.add(at) };
            // SAFETY: `write` reads one byte at `p` (readable, above) into the pipe's kernel buffer.
            if unsafe { libc::write(self.write_end.as_raw_fd(), p.cast(), 1) } != 1 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: `read` stores that same byte back at `p`; where `p` is not writable the
            // kernel fails with EFAULT and stores nothing (no fault reaches this process).
            if unsafe { libc::read(self.read_end.as_raw_fd(), p.cast(), 1) } != 1 {
                let e = io::Error::last_os_error();
                return match e.raw_os_error() {
                    Some(libc::EFAULT) => Ok(false),
                    _ => Err(e),
                };
            }
        }
        Ok(true)
    }
}
