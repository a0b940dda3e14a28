//! Slot bookkeeping of the ring: slots are carved from the arena in reservation order,
//! wrapping at the end, and released in the same order (FIFO). Positions are virtual and
//! monotonic, so "how much is in use" never depends on comparing offsets (zero-byte slots
//! for empty samples make offsets ambiguous).

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::arena::Arena;
use crate::error::{Error, Result};
use crate::interrupt::Interrupt;

/// A committed sample waiting in the ring.
#[derive(Debug, Clone)]
pub struct Committed {
    pub offset: usize,
    pub len: usize,
    pub sample_id: u64,
    pub key: String,
    pub n_tokens: u64,
    /// A cancelled slot is released without being written.
    pub cancelled: bool,
    /// `Some(clamped)`: its FP8 tensors hold quantised rows (`SampleRef::prequantised`).
    pub prequantised: Option<u64>,
    /// What it shares with other samples: nothing, its first tokens, or a prefix stored already.
    pub prefix: SharedPrefix,
}

/// What a committed sample shares with other samples (docs/FORMAT.md 4.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SharedPrefix {
    /// Nothing: the slot holds the whole sample, stored whole.
    #[default]
    None,
    /// The slot holds the whole sample; its first `n` tokens (at least one token left after
    /// them) are stored once (`DatasetWriter::write_batch_sharing`).
    First(u64),
    /// The slot holds only the sample's rows after a prefix stored already: the prefix record
    /// whose token ids (int64 little-endian) have this SHA-256 digest, written before this slot
    /// was committed (by a `First` slot committed earlier, or in the dataset resumed).
    Stored([u8; 32]),
}

#[derive(Debug)]
struct Slot {
    id: u64,
    /// Virtual start position (see `Ring::fit`).
    vstart: u64,
    offset: usize,
    len: usize,
    /// Arena bytes taken: `len` rounded up to `SLOT_ALIGN`, so every slot starts aligned.
    span: usize,
    committed: Option<Committed>,
}

/// Slot start alignment in the arena (a cache line).
const SLOT_ALIGN: usize = 64;

/// Ring counters, as of the call.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RingStats {
    pub capacity: u64,
    pub bytes_in_use: u64,
    pub slots_in_use: u64,
    pub high_water_bytes: u64,
    /// Seconds producers spent blocked on a full ring.
    pub producer_stall_seconds: f64,
    /// Samples dropped because the ring was full and the producer chose to drop.
    pub dropped_samples: u64,
    /// Slots reserved but neither committed nor cancelled when the ring closed (not written).
    pub abandoned_slots: u64,
    pub committed_bytes: u64,
}

#[derive(Default)]
struct State {
    slots: VecDeque<Slot>,
    /// Virtual position where the next slot starts.
    write_pos: u64,
    next_id: u64,
    closed: bool,
    /// The sink's error: every later `reserve` returns it (same variant, path and errno).
    failed: Option<Error>,
    stats: RingStats,
}

/// A reserved slot: write the sample's bytes at `offset .. offset + len` of the arena, then commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reserved {
    pub id: u64,
    pub offset: usize,
}

pub struct Ring {
    pub arena: Arena,
    state: Mutex<State>,
    /// Signalled when space is released (producers wait on it).
    space: Condvar,
    /// Signalled when a slot is committed or the ring closes (the consumer waits on it).
    ready: Condvar,
}

impl Ring {
    pub fn new(capacity: usize) -> Ring {
        let arena = Arena::new(capacity);
        let state = State {
            stats: RingStats {
                capacity: arena.capacity() as u64,
                ..Default::default()
            },
            ..Default::default()
        };
        Ring {
            arena,
            state: Mutex::new(state),
            space: Condvar::new(),
            ready: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The virtual start of a slot spanning `span` bytes, if it fits now. Positions are
    /// virtual (monotonic; the arena offset is `position % capacity`); a slot that would run
    /// past the end of the arena starts at the next multiple of the capacity instead.
    fn fit(&self, st: &State, span: usize) -> Option<u64> {
        let cap = self.arena.capacity() as u64;
        let phys = st.write_pos % cap;
        let start = if phys + span as u64 > cap {
            st.write_pos + (cap - phys)
        } else {
            st.write_pos
        };
        // With no slot in use, skipping to the arena's start costs nothing.
        let read = st.slots.front().map_or(start, |s| s.vstart);
        (start + span as u64 - read <= cap).then_some(start)
    }

    /// Reserves `len` bytes. When the ring is full: with `drop_when_full`, returns `None` at
    /// once and counts the drop; otherwise waits up to `timeout` and then fails with
    /// `Error::Timeout`, asking `interrupt` every `interrupt::SLICE` of the wait (`Error::Interrupted`:
    /// nothing reserved). Fails at once when `len` exceeds the capacity or the sink failed.
    pub fn reserve(
        &self,
        len: usize,
        timeout: Duration,
        drop_when_full: bool,
        interrupt: &Interrupt<'_>,
    ) -> Result<Option<Reserved>> {
        let cap = self.arena.capacity();
        if len.next_multiple_of(SLOT_ALIGN) > cap {
            return Err(Error::InvalidArgument(format!(
                "a sample of {len} bytes does not fit in the capture ring of {cap} bytes; raise ring_bytes"
            )));
        }
        let start = Instant::now();
        let mut st = self.lock();
        loop {
            if let Some(err) = &st.failed {
                return Err(err.duplicate());
            }
            if st.closed {
                return Err(Error::InvalidArgument("the capture ring is closed".into()));
            }
            let span = len.next_multiple_of(SLOT_ALIGN);
            if let Some(vstart) = self.fit(&st, span) {
                let offset = (vstart % cap as u64) as usize;
                st.write_pos = vstart + span as u64;
                st.stats.producer_stall_seconds += start.elapsed().as_secs_f64();
                let id = st.next_id;
                st.next_id += 1;
                st.slots.push_back(Slot {
                    id,
                    vstart,
                    offset,
                    len,
                    span,
                    committed: None,
                });
                st.stats.bytes_in_use += span as u64;
                st.stats.slots_in_use += 1;
                st.stats.high_water_bytes = st.stats.high_water_bytes.max(st.stats.bytes_in_use);
                return Ok(Some(Reserved { id, offset }));
            }
            if drop_when_full {
                st.stats.dropped_samples += 1;
                return Ok(None);
            }
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                st.stats.producer_stall_seconds += start.elapsed().as_secs_f64();
                return Err(Error::Timeout(format!(
                    "the capture ring ({cap} bytes, {} slots in use) stayed full for {:.1} s: the shard writer \
                     is not keeping up (more writer threads, a faster disk, a larger ring, or drop_when_full)",
                    st.slots.len(),
                    timeout.as_secs_f64()
                )));
            }
            st = self
                .space
                .wait_timeout(st, Interrupt::slice(left))
                .unwrap_or_else(|p| p.into_inner())
                .0;
            // Asked without the ring's lock: the answer may run Python code that commits a slot.
            drop(st);
            let asked = interrupt.check();
            st = self.lock();
            if let Err(e) = asked {
                st.stats.producer_stall_seconds += start.elapsed().as_secs_f64();
                return Err(e);
            }
        }
    }

    /// Commits (or, with `cancelled`, abandons) reserved slot `id` once its bytes are written;
    /// `prequantised` as `SampleRef::prequantised`, `prefix` as `Committed::prefix`.
    #[allow(clippy::too_many_arguments)]
    pub fn commit(
        &self,
        id: u64,
        sample_id: u64,
        key: String,
        n_tokens: u64,
        cancelled: bool,
        prequantised: Option<u64>,
        prefix: SharedPrefix,
    ) -> Result<()> {
        let mut st = self.lock();
        let slot = st
            .slots
            .iter_mut()
            .find(|s| s.id == id && s.committed.is_none())
            .ok_or_else(|| Error::InvalidArgument(format!("ring slot {id} is not reserved")))?;
        slot.committed = Some(Committed {
            offset: slot.offset,
            len: slot.len,
            sample_id,
            key,
            n_tokens,
            cancelled,
            prequantised,
            prefix,
        });
        if !cancelled {
            st.stats.committed_bytes += slot.len as u64;
        }
        drop(st);
        self.ready.notify_all();
        Ok(())
    }

    /// Waits for committed slots at the front of the ring and returns up to `max` of them,
    /// in reservation order; empty once the ring is closed and drained.
    pub fn take(&self, max: usize) -> Vec<Committed> {
        let mut st = self.lock();
        loop {
            if st.closed {
                let mut abandoned = 0;
                for s in st.slots.iter_mut().filter(|s| s.committed.is_none()) {
                    s.committed = Some(Committed {
                        offset: s.offset,
                        len: s.len,
                        sample_id: 0,
                        key: String::new(),
                        n_tokens: 0,
                        cancelled: true,
                        prequantised: None,
                        prefix: SharedPrefix::None,
                    });
                    abandoned += 1;
                }
                st.stats.abandoned_slots += abandoned;
            }
            let ready: Vec<Committed> = st.slots.iter().map_while(|s| s.committed.clone()).take(max).collect();
            if !ready.is_empty() || st.closed {
                return ready;
            }
            st = self.ready.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Releases the `n` front slots (those `take` returned) and wakes blocked producers.
    pub fn release(&self, n: usize) {
        let mut st = self.lock();
        for _ in 0..n {
            if let Some(s) = st.slots.pop_front() {
                st.stats.bytes_in_use -= s.span as u64;
                st.stats.slots_in_use -= 1;
            }
        }
        drop(st);
        self.space.notify_all();
    }

    /// No more reservations; the consumer drains what is committed, then stops.
    /// Reserved slots never committed are abandoned.
    pub fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
        self.space.notify_all();
    }

    /// Marks the ring failed (the consumer hit `err`): producers get the same error.
    pub fn fail(&self, err: &Error) {
        let mut st = self.lock();
        st.failed = Some(err.duplicate());
        st.closed = true;
        drop(st);
        self.space.notify_all();
        self.ready.notify_all();
    }

    pub fn stats(&self) -> RingStats {
        self.lock().stats.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_millis(50);
    const NEVER: &Interrupt<'static> = &Interrupt::NEVER;

    fn commit(r: &Ring, s: Reserved, id: u64) {
        r.commit(s.id, id, String::new(), 1, false, None, SharedPrefix::None)
            .unwrap();
    }

    #[test]
    fn fifo_wraps_and_reuses_released_space() {
        let r = Ring::new(4096);
        let a = r.reserve(1500, T, false, NEVER).unwrap().unwrap();
        let b = r.reserve(1500, T, false, NEVER).unwrap().unwrap();
        assert_eq!((a.offset, b.offset), (0, 1536), "slots start 64-byte aligned");
        // 1024 bytes left at the end, none at the start: a 1500-byte slot must wait.
        assert!(matches!(r.reserve(1500, T, false, NEVER), Err(Error::Timeout(_))));
        commit(&r, b, 2);
        commit(&r, a, 1);
        let got = r.take(8);
        assert_eq!(
            got.iter().map(|c| c.sample_id).collect::<Vec<_>>(),
            vec![1, 2],
            "reservation order"
        );
        r.release(1);
        let c = r.reserve(1500, T, false, NEVER).unwrap().unwrap();
        assert_eq!(c.offset, 0, "wrapped into the released head");
        // Wrapped: the only free region is [1536, 1536) until b is released; the end is skipped.
        assert_eq!(r.reserve(100, T, true, NEVER).unwrap(), None);
        let st = r.stats();
        assert_eq!(st.slots_in_use, 2);
        assert_eq!(st.high_water_bytes, 3072);
        assert!(st.producer_stall_seconds >= 0.04);
    }

    #[test]
    fn zero_byte_slots_never_let_slots_overlap() {
        // Regression: an empty sample reserved right at the front slot's offset in a wrapped
        // ring made the ring look unwrapped, and later slots overlapped live ones.
        let r = Ring::new(4096);
        let a = r.reserve(3000, T, false, NEVER).unwrap().unwrap();
        commit(&r, a, 0);
        r.take(1);
        let b = r.reserve(320, T, false, NEVER).unwrap().unwrap(); // at 3008
        r.release(1);
        let c = r.reserve(3008, T, false, NEVER).unwrap().unwrap(); // wraps to 0, ends where b starts
        let z = r.reserve(0, T, false, NEVER).unwrap().unwrap(); // at 3008 == b's offset
        assert_eq!((b.offset, c.offset, z.offset), (3008, 0, 3008));
        // Nothing is free: a 200-byte slot must not fit anywhere (it would overlap b or c).
        assert_eq!(r.reserve(200, T, true, NEVER).unwrap(), None);
        assert_eq!(r.stats().bytes_in_use, 320 + 3008);
    }

    #[test]
    fn full_ring_drops_and_counts_when_asked() {
        let r = Ring::new(4096);
        r.reserve(4000, T, false, NEVER).unwrap().unwrap();
        assert_eq!(r.reserve(100, T, true, NEVER).unwrap(), None);
        assert_eq!(r.stats().dropped_samples, 1);
        assert!(matches!(
            r.reserve(5000, T, false, NEVER),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn blocked_producer_wakes_on_release() {
        let r = std::sync::Arc::new(Ring::new(4096));
        let a = r.reserve(4000, T, false, NEVER).unwrap().unwrap();
        let r2 = r.clone();
        let producer = std::thread::spawn(move || r2.reserve(4000, Duration::from_secs(10), false, NEVER));
        std::thread::sleep(Duration::from_millis(50));
        commit(&r, a, 7);
        assert_eq!(r.take(1).len(), 1);
        r.release(1);
        assert_eq!(producer.join().unwrap().unwrap().unwrap().offset, 0);
    }

    #[test]
    fn close_abandons_uncommitted_slots_and_counts_them() {
        let r = Ring::new(4096);
        let a = r.reserve(10, T, false, NEVER).unwrap().unwrap();
        r.reserve(10, T, false, NEVER).unwrap().unwrap();
        commit(&r, a, 1);
        r.close();
        let got = r.take(8);
        assert_eq!(got.iter().map(|c| c.cancelled).collect::<Vec<_>>(), vec![false, true]);
        assert_eq!(r.stats().abandoned_slots, 1);
        assert!(r.reserve(10, T, false, NEVER).is_err());
    }

    #[test]
    fn an_interrupted_wait_reserves_nothing_and_counts_its_stall() {
        let r = Ring::new(4096);
        r.reserve(4000, T, false, NEVER).unwrap().unwrap();
        let asked = std::sync::atomic::AtomicU32::new(0);
        let stop = || asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 2;
        let t0 = std::time::Instant::now();
        let got = r.reserve(4000, Duration::from_secs(60), false, &Interrupt::new(&stop));
        assert!(matches!(got, Err(Error::Interrupted)));
        assert!(
            t0.elapsed() < Duration::from_secs(1),
            "asked every slice, stopped at the third"
        );
        let stats = r.stats();
        assert_eq!((stats.slots_in_use, stats.bytes_in_use), (1, 4032));
        assert!(stats.producer_stall_seconds >= 2.0 * crate::interrupt::SLICE.as_secs_f64());
    }
}
