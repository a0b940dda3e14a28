//! Borrowing the bytes of Python buffers (numpy arrays, `memoryview`s of torch tensors)
//! without copying them.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

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
        let borrowed = Borrowed(buf);
        if writable && borrowed.len() > 0 {
            let (ptr, len) = (borrowed.0.buf_ptr() as *mut u8, borrowed.len());
            let probe = kernel_can_write(ptr, len).map_err(|e| Error::io(format!("<pipe probing {what}>"), e))?;
            if !probe {
                return Err(Error::InvalidArgument(format!(
                    "{what}: the memory is read-only though its buffer says writable (e.g. a tensor made \
                     by torch.from_numpy over a read-only memory map); writing it would crash"
                )));
            }
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

/// Whether the first and last byte of `[ptr, ptr + len)` (readable memory, `len > 0`) can be
/// written, asked of the kernel rather than found by a fault: each byte goes through a pipe and
/// back to where it was, and `read` fails with `EFAULT` instead of writing where the memory is
/// not writable. The bytes keep their values. A torch tensor made by `torch.from_numpy` over a
/// read-only memory map exports a writable buffer (torch has no read-only tensors), so the
/// export's flag alone would let the decode write there and the process die of `SIGSEGV`.
fn kernel_can_write(ptr: *mut u8, len: usize) -> io::Result<bool> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is an array of two ints for `pipe` to fill.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `pipe` succeeded: both are new descriptors owned by nothing else, closed on drop.
    let (read_end, write_end) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let ends = if len == 1 { vec![0] } else { vec![0, len - 1] };
    for at in ends {
        // SAFETY: `at < len`, so the byte lies inside the caller's readable range.
        let p = unsafe { ptr.add(at) };
        // SAFETY: `write` reads one byte at `p` (readable, above) into the pipe's kernel buffer.
        if unsafe { libc::write(write_end.as_raw_fd(), p.cast(), 1) } != 1 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `read` stores that same byte back at `p`; where `p` is not writable the kernel
        // fails with EFAULT and stores nothing (no fault reaches this process).
        if unsafe { libc::read(read_end.as_raw_fd(), p.cast(), 1) } != 1 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EFAULT) => Ok(false),
                _ => Err(e),
            };
        }
    }
    Ok(true)
}
