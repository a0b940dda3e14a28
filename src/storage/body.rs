//! Receive buffers for ranged GETs. A response body is copied chunk by chunk, as it arrives, into
//! a buffer taken from a small process-wide pool, and the buffer goes back to the pool when the
//! last view of it is dropped. A fresh buffer per GET (a record is several MB) meant fresh pages
//! for every response: page faults and the kernel zeroing them cost about a sixth of a remote
//! reader's CPU (benches/README.md, object-storage section).

use std::ops::{Deref, Range};
use std::sync::{Arc, Mutex};

/// At most this many bytes of idle buffers are kept for reuse.
const POOL_BYTES: usize = 64 << 20;

static POOL: Pool = Pool::new(POOL_BYTES);

/// Idle buffers, at most `max_bytes` of capacity in all.
struct Pool {
    idle: Mutex<Vec<Vec<u8>>>,
    max_bytes: usize,
}

impl Pool {
    const fn new(max_bytes: usize) -> Pool {
        Pool {
            idle: Mutex::new(Vec::new()),
            max_bytes,
        }
    }

    /// An empty buffer with room for `len` bytes: an idle one that large when there is one.
    fn take(&self, len: usize) -> Vec<u8> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        match idle.iter().position(|b| b.capacity() >= len) {
            Some(at) => idle.swap_remove(at),
            None => Vec::with_capacity(len),
        }
    }

    /// Keeps `bytes` for reuse (emptied) while the pool has room for it.
    fn give(&self, mut bytes: Vec<u8>) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let kept: usize = idle.iter().map(Vec::capacity).sum();
        if bytes.capacity() > 0 && kept + bytes.capacity() <= self.max_bytes {
            bytes.clear();
            idle.push(bytes);
        }
    }
}

/// One response body (or the parts of one span joined), in a pooled buffer.
pub struct Body {
    bytes: Vec<u8>,
    pool: &'static Pool,
}

impl Body {
    /// An empty body with room for `len` bytes, from the process's pool.
    pub fn with_capacity(len: usize) -> Body {
        Body {
            bytes: POOL.take(len),
            pool: &POOL,
        }
    }

    pub fn extend_from_slice(&mut self, chunk: &[u8]) {
        self.bytes.extend_from_slice(chunk);
    }
}

impl Deref for Body {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for Body {
    fn drop(&mut self) {
        self.pool.give(std::mem::take(&mut self.bytes));
    }
}

/// A record's bytes inside a fetched body, shared with the other records of its span.
#[derive(Clone)]
pub struct Fetched {
    body: Arc<Body>,
    range: Range<usize>,
}

impl Fetched {
    /// Bytes `range` of `body` (`range` must lie inside it).
    pub fn new(body: Arc<Body>, range: Range<usize>) -> Fetched {
        assert!(range.end <= body.len(), "a record's range lies inside its span");
        Fetched { body, range }
    }
}

impl Deref for Fetched {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.body[self.range.clone()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_body_is_reused_empty_and_the_pool_stays_bounded() {
        let pool: &'static Pool = Box::leak(Box::new(Pool::new(5 << 20)));
        let mut first = Body {
            bytes: pool.take(3 << 20),
            pool,
        };
        first.extend_from_slice(&[7; 100]);
        let at = first.as_ptr();
        drop(first);
        let second = Body {
            bytes: pool.take(1 << 20),
            pool,
        };
        assert_eq!((second.len(), second.as_ptr()), (0, at));
        // A buffer too large for what is left of the bound is dropped, not kept.
        let big = Body {
            bytes: pool.take(4 << 20),
            pool,
        };
        drop(second);
        drop(big);
        let idle = pool.idle.lock().unwrap();
        assert_eq!(idle.iter().map(Vec::capacity).collect::<Vec<_>>(), vec![3 << 20]);
    }

    #[test]
    fn views_share_one_body() {
        let mut body = Body::with_capacity(10);
        body.extend_from_slice(b"0123456789");
        let body = Arc::new(body);
        let (a, b) = (Fetched::new(body.clone(), 0..4), Fetched::new(body, 4..10));
        assert_eq!((&*a, &*b), (&b"0123"[..], &b"456789"[..]));
        assert_eq!(Arc::strong_count(&a.body), 2);
    }
}
