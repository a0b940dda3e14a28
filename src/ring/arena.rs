//! A zeroed, page-aligned heap allocation with a stable address (so it can be registered
//! with CUDA as pinned memory by the Python side, and exported as a Python buffer).

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

/// Alignment of the arena: one page, as `cudaHostRegister` prefers.
pub const PAGE: usize = 4096;

pub struct Arena {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the arena is a plain byte allocation owned by this value; access to its bytes is
// coordinated by the ring's slot bookkeeping (disjoint slots, handed over under a mutex).
unsafe impl Send for Arena {}
// SAFETY: as above; `&Arena` only exposes the base pointer and length.
unsafe impl Sync for Arena {}

impl Arena {
    /// Allocates `capacity` zeroed bytes (at least one page).
    pub fn new(capacity: usize) -> Arena {
        let layout = Layout::from_size_align(capacity.max(PAGE).next_multiple_of(PAGE), PAGE).expect("arena layout");
        // SAFETY: `layout` has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        Arena { ptr, layout }
    }

    /// Usable bytes (the requested capacity rounded up to whole pages).
    pub fn capacity(&self) -> usize {
        self.layout.size()
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The bytes `[offset, offset + len)`.
    ///
    /// # Safety
    /// No one may write this range while the slice lives (the ring guarantees it for a
    /// committed slot until it is released).
    pub unsafe fn slice(&self, offset: usize, len: usize) -> &[u8] {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.capacity()),
            "slot out of the arena"
        );
        // SAFETY: in bounds (asserted), initialised (zeroed at allocation), and the caller
        // guarantees no concurrent writer.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(offset), len) }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this exact layout, freed once.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}
