//! The consumer side of the ring: one thread takes committed slots in order, hands them to
//! the dataset writer as borrowed bytes (no copy before encoding), and releases them.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::slots::{Committed, Ring, RingStats, SharedPrefix};
use crate::dataset::{DatasetWriter, Manifest, SampleRef, StatsHandle, WriterStats};
use crate::error::{catch_panic, Error, Result};
use crate::format::record::prefix_key;
use crate::interrupt::Interrupt;

/// Ring and writer counters together.
#[derive(Debug, Clone, PartialEq)]
pub struct SinkStats {
    pub ring: RingStats,
    pub writer: WriterStats,
}

pub struct CaptureSink {
    ring: Arc<Ring>,
    token_bytes: u64,
    /// Bytes of a token whose FP8 tensors are given quantised (scales and FP8 bytes).
    stored_token_bytes: u64,
    writer_stats: StatsHandle,
    thread: Option<JoinHandle<Result<Manifest>>>,
    /// Disconnected when the sink thread ends (`close` waits on it in interruptible slices).
    finished: Mutex<Receiver<()>>,
    /// The writer's `DatasetWriter::completion` flag (the writer lives on the sink thread).
    complete_on_close: Arc<std::sync::atomic::AtomicBool>,
}

/// Splits a committed slot into the schema's tensors (`CaptureSink::commit` checked that its
/// rows fill it exactly).
fn sample_ref<'a>(ring: &'a Ring, writer: &DatasetWriter, c: &'a Committed) -> SampleRef<'a> {
    let schema = writer.schema();
    // SAFETY: a committed slot is not written again until `release`, which happens after
    // the references built here are dropped (end of `write_batch`).
    let mut rest = unsafe { ring.arena.slice(c.offset, c.len) };
    let tensors = schema
        .tensors
        .iter()
        .map(|t| {
            let row_bytes = SampleRef::given_row_bytes(t, c.prequantised.is_some());
            let (head, tail) = rest.split_at((c.n_tokens * row_bytes) as usize);
            rest = tail;
            head
        })
        .collect();
    SampleRef {
        sample_id: c.sample_id,
        key: &c.key,
        n_tokens: c.n_tokens,
        tensors,
        prequantised: c.prequantised,
        prefix: None,
    }
}

fn pump(ring: &Ring, mut writer: DatasetWriter, batch: usize) -> Result<Manifest> {
    loop {
        let taken = ring.take(batch);
        if taken.is_empty() {
            return writer.close();
        }
        let kept: Vec<_> = taken.iter().filter(|c| !c.cancelled).collect();
        let mut start = 0;
        while start < kept.len() {
            let written = write_run(ring, &mut writer, &kept[start..]);
            match written {
                Ok(n) => start += n,
                Err(e) => {
                    ring.fail(&e);
                    return Err(e);
                }
            }
        }
        ring.release(taken.len());
    }
}

/// Writes the longest run of `kept`'s first samples whose stored prefixes the writer holds before
/// the run is written (a sample referencing a prefix record that an earlier sample of the same
/// batch stores starts the next run); returns how many it wrote (at least one).
fn write_run(ring: &Ring, writer: &mut DatasetWriter, kept: &[&Committed]) -> Result<usize> {
    let (mut refs, mut shared) = (Vec::new(), Vec::new());
    for c in kept {
        let mut r = sample_ref(ring, writer, c);
        if let SharedPrefix::Stored(digest) = c.prefix {
            match writer.prefix_id(&digest) {
                Some(id) => r.prefix = Some(id),
                None if !refs.is_empty() => break,
                None => return Err(missing_prefix(c.sample_id, &digest)),
            }
        }
        refs.push(r);
        shared.push(match c.prefix {
            SharedPrefix::First(n) => n,
            _ => 0,
        });
    }
    writer.write_batch_sharing(&refs, &shared)?;
    Ok(refs.len())
}

/// A `SharedPrefix::Stored` sample whose prefix record the writer does not hold once every sample
/// committed before it is written: its producer commits it only after the sample that stores the
/// record (ring order is write order), so this is a producer's error, which stops the capture.
fn missing_prefix(sample_id: u64, digest: &[u8; 32]) -> Error {
    Error::Schema {
        sample_id,
        message: format!(
            "it references the prefix record {}, which the writer does not hold (a reference must be committed \
             after the sample that stores its prefix)",
            prefix_key(digest)
        ),
    }
}

impl CaptureSink {
    /// Starts the consumer thread over a ring of `ring_bytes`; it writes up to `batch`
    /// committed samples per `write_batch` (encoded in parallel).
    pub fn start(ring_bytes: usize, writer: DatasetWriter, batch: usize) -> Result<CaptureSink> {
        let ring = Arc::new(Ring::new(ring_bytes));
        let writer_stats = writer.stats_handle();
        let token_bytes = writer.schema().token_bytes();
        let stored_token_bytes = writer.schema().stored_token_bytes();
        let complete_on_close = writer.completion();
        let r = ring.clone();
        let (finishing, finished) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("eagle-io-capture-sink".into())
            .spawn(move || {
                let _finishing = finishing; // dropped when the thread ends, however it ends
                                            // A panic fails the ring too, so producers stop waiting for room at once.
                let out = catch_panic("the capture sink thread", || pump(&r, writer, batch.max(1)));
                if let Err(e @ Error::Internal(_)) = &out {
                    r.fail(e);
                }
                out
            })
            .map_err(|e| Error::Internal(format!("cannot start the capture sink thread: {e}")))?;
        Ok(CaptureSink {
            ring,
            token_bytes,
            stored_token_bytes,
            writer_stats,
            thread: Some(thread),
            finished: Mutex::new(finished),
            complete_on_close,
        })
    }

    /// Commits reserved slot `id` of `len` bytes holding `n_tokens` rows of the schema (or, with
    /// `cancelled`, abandons it); with `prequantised`, its FP8 tensors hold quantised rows
    /// (`SampleRef::prequantised`); `prefix` says what it shares with other samples
    /// (`SharedPrefix`: with `Stored`, its `n_tokens` rows are those after the prefix). `hand_over` runs once the rows are known to fill the slot exactly
    /// and before the sink thread can see it: the producer's last chance to stop writing the slot.
    ///
    /// Errors: `Schema` when `n_tokens` rows do not fill the slot exactly (nothing is handed over:
    /// the slot stays reserved and the sink keeps running); `hand_over`'s error; `InvalidArgument`
    /// for a slot that is not reserved.
    #[allow(clippy::too_many_arguments)]
    pub fn commit(
        &self,
        id: u64,
        len: usize,
        sample_id: u64,
        key: String,
        n_tokens: u64,
        cancelled: bool,
        prequantised: Option<u64>,
        prefix: SharedPrefix,
        hand_over: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        if prequantised.is_some() && self.stored_token_bytes == self.token_bytes {
            let message = "given quantised, but the schema stores no tensor as FP8".to_string();
            return Err(Error::Schema { sample_id, message });
        }
        let token_bytes = if prequantised.is_some() {
            self.stored_token_bytes
        } else {
            self.token_bytes
        };
        let need = n_tokens.checked_mul(token_bytes);
        if !cancelled && need != Some(len as u64) {
            let need = need.map_or("more than 2**64".into(), |n| n.to_string());
            let message = format!("ring slot {id} holds {len} bytes; {n_tokens} tokens of the schema need {need}");
            return Err(Error::Schema { sample_id, message });
        }
        hand_over()?;
        let refused = match prefix {
            SharedPrefix::First(n) if n >= n_tokens.max(1) => Some(format!("a shared prefix of {n} tokens")),
            SharedPrefix::Stored(_) if n_tokens == 0 => Some("a stored prefix".to_string()),
            _ => None,
        };
        if let (false, Some(what)) = (cancelled, refused) {
            let message = format!("{what} in a sample of {n_tokens} tokens: it must leave at least one token");
            return Err(Error::Schema { sample_id, message });
        }
        self.ring
            .commit(id, sample_id, key, n_tokens, cancelled, prequantised, prefix)
    }

    /// The ring: producers `reserve` slots on it (and `commit` them through the sink).
    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    pub fn stats(&self) -> SinkStats {
        SinkStats {
            ring: self.ring.stats(),
            writer: self.writer_stats.snapshot(),
        }
    }

    /// As `close`, leaving the manifest marked incomplete (an interrupted capture).
    pub fn close_incomplete(&mut self, interrupt: &Interrupt<'_>) -> Result<Manifest> {
        self.complete_on_close
            .store(false, std::sync::atomic::Ordering::Relaxed);
        self.close(interrupt)
    }

    /// Drains committed slots, commits the last shard, and returns the manifest. Asks
    /// `interrupt` every `interrupt::SLICE` of the wait; `Error::Interrupted` leaves the ring
    /// closed and the sink thread draining it: a later `close` (or the drop) waits for the rest.
    pub fn close(&mut self, interrupt: &Interrupt<'_>) -> Result<Manifest> {
        self.ring.close();
        if self.thread.is_none() {
            return Err(Error::InvalidArgument("the capture sink is closed".into()));
        }
        let finished = self.finished.get_mut().unwrap_or_else(|p| p.into_inner());
        while let Err(RecvTimeoutError::Timeout) = finished.recv_timeout(crate::interrupt::SLICE) {
            interrupt.check()?;
        }
        let thread = self.thread.take().expect("checked above");
        thread
            .join()
            .map_err(|payload| Error::panicked("the capture sink thread", &*payload))?
    }
}

impl Drop for CaptureSink {
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _ = self.close(&Interrupt::NEVER);
        }
    }
}
