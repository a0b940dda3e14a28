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

/// Pooled buffers and their total capacity.
struct Pool(Mutex<(Vec<Vec<u8>>, usize)>);

static POOL: Pool = Pool(Mutex::new((Vec::new(), 0)));

/// A buffer with room for at least `capacity` bytes, recycled when the pool has one. A recycled
/// buffer keeps the length and bytes its last user left (initialised, contents unspecified), so
/// a caller that resizes it to what it then overwrites zero-fills only the growth.
pub fn take(capacity: usize) -> Vec<u8> {
    POOL.take(capacity)
}

/// Hands a buffer whose bytes are no longer needed back for a later [`take`].
pub fn give_back(v: Vec<u8>) {
    POOL.give_back(v)
}

impl Pool {
    fn take(&self, capacity: usize) -> Vec<u8> {
        let recycled = {
            let mut pool = self.0.lock().unwrap_or_else(|e| e.into_inner());
            let v = pool.0.pop();
            if let Some(v) = &v {
                pool.1 -= v.capacity();
            }
            v
        };
        let mut v = recycled.unwrap_or_default();
        v.reserve(capacity.saturating_sub(v.len()));
        v
    }

    fn give_back(&self, v: Vec<u8>) {
        let cap = v.capacity();
        if cap < MIN_POOLED_BYTES {
            return;
        }
        let mut pool = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if pool.1 + cap <= MAX_POOLED_BYTES {
            pool.1 += cap;
            pool.0.push(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool() -> Pool {
        Pool(Mutex::new((Vec::new(), 0)))
    }

    #[test]
    fn buffers_come_back_with_the_room_asked_for_and_their_bytes() {
        let p = pool();
        let mut v = p.take(1 << 20);
        assert!(v.is_empty() && v.capacity() >= 1 << 20);
        v.extend_from_slice(&[7u8; 100]);
        p.give_back(v);
        // The buffer given back is the next taken, its bytes as left (not zeroed, not cleared).
        let w = p.take(10);
        assert_eq!(w, vec![7u8; 100]);
        assert!(w.capacity() >= 1 << 20);
        p.give_back(w);
        let big = p.take(4 << 20);
        assert!(big.capacity() >= 4 << 20 && big.len() == 100);
        assert!(p.take(1).is_empty(), "the pool held one buffer");
    }

    #[test]
    fn the_pool_keeps_at_most_its_bound() {
        let p = pool();
        for _ in 0..2 * MAX_POOLED_BYTES / (1 << 20) {
            p.give_back(Vec::with_capacity(1 << 20));
        }
        let kept = p.0.lock().unwrap().1;
        assert_eq!(kept, MAX_POOLED_BYTES);
        p.give_back(Vec::with_capacity(16));
        assert_eq!(p.0.lock().unwrap().1, MAX_POOLED_BYTES, "small buffers are not pooled");
    }
}
