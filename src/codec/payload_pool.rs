//! Recycled chunk payload buffers. Each encoded chunk's payload lives until the writer's I/O
//! thread has written its record; a fresh `Vec` per chunk cost a page fault (and the kernel's
//! zeroing) per 4 KiB page on every chunk, about a sixth of the encode CPU (benches/README.md).
//! The I/O thread hands written payloads back here and the encoders take them again, pages
//! already mapped. The pool is bounded: buffers beyond `MAX_POOLED_BYTES` are freed.

use std::sync::Mutex;

/// Capacity the pool keeps at most (the encoders of one writer have a few records in flight).
const MAX_POOLED_BYTES: usize = 64 << 20;
/// Buffers smaller than this (record tables, small chunks) are not worth pooling.
const MIN_POOLED_BYTES: usize = 64 << 10;

static POOL: Mutex<(Vec<Vec<u8>>, usize)> = Mutex::new((Vec::new(), 0));

/// An empty buffer with room for at least `capacity` bytes, recycled when the pool has one.
pub fn take(capacity: usize) -> Vec<u8> {
    let recycled = {
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        let v = pool.0.pop();
        if let Some(v) = &v {
            pool.1 -= v.capacity();
        }
        v
    };
    let mut v = recycled.unwrap_or_default();
    v.clear();
    v.reserve(capacity);
    v
}

/// Hands a buffer whose bytes are no longer needed back for a later [`take`].
pub fn give_back(v: Vec<u8>) {
    let cap = v.capacity();
    if cap < MIN_POOLED_BYTES {
        return;
    }
    let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    if pool.1 + cap <= MAX_POOLED_BYTES {
        pool.1 += cap;
        pool.0.push(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_empty_with_the_room_asked_for() {
        let mut v = take(1 << 20);
        assert!(v.is_empty() && v.capacity() >= 1 << 20);
        v.extend_from_slice(&[7u8; 100]);
        give_back(v);
        let w = take(10);
        assert!(w.is_empty() && w.capacity() >= 10);
        let small = take(2 << 20);
        assert!(small.capacity() >= 2 << 20);
    }

    #[test]
    fn the_pool_keeps_at_most_its_bound() {
        for _ in 0..2 * MAX_POOLED_BYTES / (1 << 20) {
            give_back(Vec::with_capacity(1 << 20));
        }
        let kept = POOL.lock().unwrap().1;
        assert!(kept <= MAX_POOLED_BYTES, "{kept}");
        give_back(Vec::with_capacity(16));
        assert!(POOL.lock().unwrap().1 <= MAX_POOLED_BYTES);
    }
}
