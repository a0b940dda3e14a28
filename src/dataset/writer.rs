//! The dataset writer. `write_batch` validates samples against the schema, encodes their
//! chunks in parallel on the writer's pool, and hands finished records to one I/O thread
//! through a bounded queue (a full queue blocks the caller: backpressure). The I/O thread
//! appends records in order, rotates shards at `shard_bytes`, commits each shard
//! atomically and rewrites the manifest after each commit, so a crash loses at most the
//! shard being written.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use rayon::prelude::*;

use super::manifest::{CodecInfo, Manifest, MANIFEST_FORMAT};
use super::options::WriterOptions;
use super::resume;
use crate::codec::{encode_chunk, encode_fp8_rows, recycle_payload, EncodedChunk, Fp8Input};
use crate::error::{catch_panic, Error, Result};
use crate::format::record::{self, prefix_key, token_digest, token_ids_tensor, PrefixRef};
use crate::format::{MAX_KEY_BYTES, PLAIN_VERSION, PREFIX_VERSION};
use crate::layout;
use crate::layout::PREFIX_SHARD_INFIX;
use crate::pool;
use crate::quant::QuantCounts;
use crate::schema::{Schema, TensorSpec};
use crate::shard::{ShardBuilder, MAX_EXPANSION};

/// One sample handed to the writer: its tensors' bytes in schema order, borrowed from the
/// caller (no copy is made before encoding).
pub struct SampleRef<'a> {
    pub sample_id: u64,
    /// The source record's id string (may be empty).
    pub key: &'a str,
    pub n_tokens: u64,
    pub tensors: Vec<&'a [u8]>,
    /// `Some(clamped)`: every tensor with FP8 storage is given quantised already, as its stored
    /// rows (per token `S` f32 scales then `W` e4m3fn bytes, docs/FORMAT.md 3.1), by a quantiser
    /// with the core's rules (`eagle_io.store.fp8`, on the source device before its copy) that
    /// saturated `clamped` values; the writer checks the rows (`codec::encode_fp8_rows`) and
    /// codes them as given. `None`: every tensor is given in its dtype (FP8 ones quantised here).
    pub prequantised: Option<u64>,
    /// `Some(id)`: the sample's first tokens are the prefix record `id` (written by
    /// [`DatasetWriter::write_prefix`]), and `n_tokens` and `tensors` hold only the rows after it;
    /// its record references the prefix (format version 3) and reads back whole.
    pub prefix: Option<u64>,
}

impl SampleRef<'_> {
    /// Bytes per token of `spec` as this sample gives it (`stored_row_bytes` when prequantised).
    pub fn given_row_bytes(spec: &TensorSpec, prequantised: bool) -> u64 {
        if prequantised {
            spec.stored_row_bytes()
        } else {
            spec.row_bytes()
        }
    }
}

/// Counters of a writer, as of the call.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WriterStats {
    pub samples: u64,
    pub tokens: u64,
    /// Decoded bytes accepted.
    pub raw_bytes: u64,
    /// Encoded record bytes written.
    pub stored_bytes: u64,
    pub shards_committed: u64,
    /// Seconds spent encoding (wall time of the parallel encode).
    pub encode_seconds: f64,
    /// Seconds `write_batch` was blocked on a full queue.
    pub blocked_seconds: f64,
    /// Seconds since the writer was created.
    pub elapsed_seconds: f64,
    /// Temporary files of uncommitted shards removed on resume.
    pub removed_temp_files: u64,
    /// Committed shards found on resume that the manifest did not list yet, verified and adopted.
    pub adopted_shards: u64,
    /// Values quantised to FP8 (tensors with FP8 storage).
    pub fp8_values: u64,
    /// FP8 values saturated at +-448 (`x / scale` rounded beyond the e4m3fn range).
    pub fp8_clamped: u64,
    /// FP8 scale blocks (a token's row, or a block of it) that were all zero: scale 0.
    pub fp8_zero_blocks: u64,
}

/// A cheap, cloneable view of a writer's counters, readable while another thread writes.
#[derive(Clone)]
pub struct StatsHandle {
    counters: Arc<Counters>,
    started: Instant,
    removed_temp_files: u64,
    adopted_shards: u64,
}

impl StatsHandle {
    pub fn snapshot(&self) -> WriterStats {
        let c = &self.counters;
        WriterStats {
            samples: c.samples.load(Relaxed),
            tokens: c.tokens.load(Relaxed),
            raw_bytes: c.raw_bytes.load(Relaxed),
            stored_bytes: c.stored_bytes.load(Relaxed),
            shards_committed: c.shards.load(Relaxed),
            encode_seconds: c.encode_ns.load(Relaxed) as f64 * 1e-9,
            blocked_seconds: c.blocked_ns.load(Relaxed) as f64 * 1e-9,
            elapsed_seconds: self.started.elapsed().as_secs_f64(),
            removed_temp_files: self.removed_temp_files,
            adopted_shards: self.adopted_shards,
            fp8_values: c.fp8_values.load(Relaxed),
            fp8_clamped: c.fp8_clamped.load(Relaxed),
            fp8_zero_blocks: c.fp8_zero_blocks.load(Relaxed),
        }
    }
}

#[derive(Default)]
struct Counters {
    samples: AtomicU64,
    tokens: AtomicU64,
    raw_bytes: AtomicU64,
    stored_bytes: AtomicU64,
    shards: AtomicU64,
    encode_ns: AtomicU64,
    blocked_ns: AtomicU64,
    fp8_values: AtomicU64,
    fp8_clamped: AtomicU64,
    fp8_zero_blocks: AtomicU64,
}

struct Record {
    sample_id: u64,
    key: String,
    /// A prefix record, committed in a prefix shard of its own (not a sample).
    is_prefix: bool,
    /// The whole sample's tokens (a prefix it references included).
    n_tokens: u64,
    raw_bytes: u64,
    parts: Vec<Vec<u8>>,
}

pub struct DatasetWriter {
    root: PathBuf,
    schema: Schema,
    opts: WriterOptions,
    pool: rayon::ThreadPool,
    tx: Option<SyncSender<Record>>,
    io: Option<JoinHandle<Result<Manifest>>>,
    stats: StatsHandle,
    seen: Mutex<HashSet<u64>>,
    /// The prefix records written or found on resume, by id, and their ids by digest.
    prefixes: HashMap<u64, PrefixRef>,
    prefix_ids: HashMap<[u8; 32], u64>,
    /// The error that stopped the I/O thread, raised again (same variant) by every later call.
    failed: Option<Error>,
    /// The root lock, released by `close`.
    lock: Option<File>,
    /// Whether closing marks the manifest complete (false after `close_incomplete` / `completion`'s
    /// store: an interrupted capture commits what it has and says it is not done).
    complete_on_close: Arc<AtomicBool>,
}

impl DatasetWriter {
    /// Creates a dataset at `root` (or resumes one, with `opts.resume`). Refuses a root that
    /// already has this writer's manifest or shards unless resuming, and a root another
    /// live writer holds with the same manifest name.
    pub fn create(
        root: &Path,
        schema: Schema,
        metadata: serde_json::Value,
        opts: WriterOptions,
    ) -> Result<DatasetWriter> {
        if opts.shard_prefix.contains('/') || opts.manifest_name.contains('/') {
            return Err(Error::InvalidArgument(
                "shard_prefix and manifest_name must be plain names".into(),
            ));
        }
        if opts.queue_depth == 0 || opts.chunk_bytes == 0 || opts.shard_bytes == 0 {
            return Err(Error::InvalidArgument(
                "queue_depth, chunk_bytes and shard_bytes must be positive".into(),
            ));
        }
        if opts.rank >= u64::MAX / PREFIX_IDS_PER_RANK {
            return Err(Error::InvalidArgument(format!(
                "rank {} is too large (ranks are below {})",
                opts.rank,
                u64::MAX / PREFIX_IDS_PER_RANK
            )));
        }
        let levels = zstd::compression_level_range();
        if !levels.contains(&opts.codec.zstd_level) {
            // zstd clamps an out-of-range level without a word: 99 would silently be 22.
            return Err(Error::InvalidArgument(format!(
                "zstd_level {} is outside zstd's {}..={}",
                opts.codec.zstd_level,
                levels.start(),
                levels.end()
            )));
        }
        let fresh = Manifest {
            format: MANIFEST_FORMAT.into(),
            format_version: PLAIN_VERSION,
            writer: concat!("eagle-io ", env!("CARGO_PKG_VERSION")).into(),
            schema: schema.clone(),
            metadata,
            codec: CodecInfo {
                zstd_level: opts.codec.zstd_level,
                chunk_bytes: opts.chunk_bytes,
            },
            shards: Vec::new(),
            prefixes: Vec::new(),
            complete: false,
        };
        // Never write a manifest no reader can load (e.g. metadata nested past serde_json's 128 levels).
        if let Err(e) = serde_json::from_slice::<Manifest>(&fresh.to_sealed_bytes()) {
            return Err(Error::InvalidArgument(format!(
                "metadata cannot be stored in a manifest that reads back: {e}"
            )));
        }
        let shard_dir = root.join(layout::SHARD_DIR);
        std::fs::create_dir_all(&shard_dir).map_err(|e| Error::io(&shard_dir, e))?;
        let lock = layout::lock_root(root, &opts.manifest_name)?;
        let manifest_path = root.join(&opts.manifest_name);
        let state = resume::prepare(root, &manifest_path, &opts, fresh)?;
        state.manifest.store(&manifest_path)?;
        let counters = Arc::new(Counters::default());
        let (tx, rx) = sync_channel(opts.queue_depth);
        let complete_on_close = Arc::new(AtomicBool::new(true));
        let io = IoThread {
            complete_on_close: complete_on_close.clone(),
            root: root.to_owned(),
            manifest_path,
            manifest: state.manifest,
            builder: None,
            next_seq: state.next_seq,
            opts: opts.clone(),
            counters: counters.clone(),
        };
        let io = std::thread::Builder::new()
            .name("eagle-io-shard-io".into())
            .spawn(move || catch_panic("the shard I/O thread", || io.run(rx)))
            .map_err(|e| Error::io(root, e))?;
        Ok(DatasetWriter {
            root: root.to_owned(),
            schema,
            pool: pool::build(opts.threads, "encode"),
            opts,
            tx: Some(tx),
            io: Some(io),
            stats: StatsHandle {
                counters,
                started: Instant::now(),
                removed_temp_files: state.removed_temp_files,
                adopted_shards: state.adopted_shards,
            },
            seen: Mutex::new(state.seen),
            prefix_ids: state.prefixes.iter().map(|p| (p.digest, p.id)).collect(),
            prefixes: state.prefixes.into_iter().map(|p| (p.id, p)).collect(),
            failed: None,
            lock: Some(lock),
            complete_on_close,
        })
    }

    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// True when `sample_id` is committed or queued (including samples found on resume).
    pub fn contains(&self, sample_id: u64) -> bool {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).contains(&sample_id)
    }

    /// Ids of every sample committed or queued (including samples found on resume), sorted.
    pub fn sample_ids(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .copied()
            .collect();
        ids.sort_unstable();
        ids
    }

    /// Validates every sample first (nothing is written if any is invalid), then encodes
    /// them in parallel and queues the records in the given order. Blocks while the queue
    /// is full.
    pub fn write_batch(&mut self, samples: &[SampleRef<'_>]) -> Result<()> {
        if let Some(err) = &self.failed {
            return Err(err.earlier("the writer failed earlier and accepts no more samples"));
        }
        if self.tx.is_none() {
            return Err(Error::InvalidArgument("the writer is closed".into()));
        }
        self.validate(samples)?;
        let t0 = Instant::now();
        let records = match self.encode(samples) {
            Ok(r) => r,
            Err(e) => {
                // Nothing of the batch was queued: its ids are free again.
                let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
                for s in samples {
                    seen.remove(&s.sample_id);
                }
                return Err(e);
            }
        };
        self.stats
            .counters
            .encode_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
        self.send(records)
    }

    /// `write_batch` of samples given whole, whose first `shared[i]` tokens (0: none) are a prefix
    /// other samples share (a system prompt): the first sample with those token ids stores them
    /// as a prefix record, numbered by the writer (`PREFIX_IDS_PER_RANK`), and every such sample
    /// stores its rows after them with a reference to it (docs/FORMAT.md 4.7); it reads back
    /// whole. A shared prefix leaves at least one token of its sample. Nothing is written when a
    /// sample is invalid (a prefix record already written for a sample before it stays, unreferenced
    /// when that sample is refused later by its encode).
    pub fn write_batch_sharing(&mut self, samples: &[SampleRef<'_>], shared: &[u64]) -> Result<()> {
        if shared.len() != samples.len() {
            return Err(Error::InvalidArgument(format!(
                "{} shared prefix counts given for {} samples",
                shared.len(),
                samples.len()
            )));
        }
        if shared.iter().all(|&p| p == 0) {
            return self.write_batch(samples);
        }
        self.check_ids(samples)?;
        for (s, &p) in samples.iter().zip(shared) {
            self.check_sample(s)?;
            if p > 0 && (s.prefix.is_some() || p >= s.n_tokens) {
                return Err(Error::Schema {
                    sample_id: s.sample_id,
                    message: format!(
                        "a shared prefix of {p} tokens in a sample of {}: it must leave at least one token, in a \
                         sample given whole",
                        s.n_tokens
                    ),
                });
            }
        }
        let mut split = Vec::with_capacity(samples.len());
        for (s, &p) in samples.iter().zip(shared) {
            if p == 0 {
                split.push(split_rows(&self.schema, s, 0).1);
                continue;
            }
            let (mut head, mut tail) = split_rows(&self.schema, s, p);
            let t = token_ids_tensor(&self.schema).ok_or_else(|| Error::Schema {
                sample_id: s.sample_id,
                message: "a shared prefix needs an int64 input_ids tensor of shape [L]".into(),
            })?;
            let id = match self.prefix_ids.get(&token_digest(head.tensors[t])) {
                Some(&id) => id,
                None => {
                    head.sample_id = self.next_prefix_id();
                    self.write_prefix(&head)?.id
                }
            };
            tail.prefix = Some(id);
            split.push(tail);
        }
        self.write_batch(&split)
    }

    /// The first free prefix id of this writer's range: `rank * PREFIX_IDS_PER_RANK` on.
    fn next_prefix_id(&self) -> u64 {
        let first = self.opts.rank * PREFIX_IDS_PER_RANK + self.prefixes.len() as u64;
        (first..)
            .find(|id| !self.prefixes.contains_key(id))
            .expect("fewer than 2**40 prefixes")
    }

    /// Stores the prefix `prefix` (its `sample_id` is the prefix record's id, unique among the
    /// dataset's prefixes; `key` is ignored: the record's key is `sha256:` and the digest of its
    /// `input_ids`, which the schema must hold as int64 `[L]`) once, in a prefix shard of its own,
    /// committed before any later sample's shard. Returns the reference a sample gives as
    /// `SampleRef::prefix` (its id). Refuses a prefix whose token ids are already stored.
    pub fn write_prefix(&mut self, prefix: &SampleRef<'_>) -> Result<PrefixRef> {
        if let Some(err) = &self.failed {
            return Err(err.earlier("the writer failed earlier and accepts no more samples"));
        }
        if self.tx.is_none() {
            return Err(Error::InvalidArgument("the writer is closed".into()));
        }
        let err = |message: String| Error::Schema {
            sample_id: prefix.sample_id,
            message,
        };
        if self.opts.uploaded_to.is_some() {
            // The upload follows the manifest's `shards` only: a listed prefix shard would never reach the object.
            return Err(Error::InvalidArgument(
                "prefix records are not uploaded to object storage yet: a capture to an object-storage root stores \
                 its samples whole"
                    .into(),
            ));
        }
        let t = token_ids_tensor(&self.schema)
            .ok_or_else(|| err("a prefix record needs an int64 input_ids tensor of shape [L]".into()))?;
        if prefix.prefix.is_some() || prefix.n_tokens == 0 {
            return Err(err(
                "a prefix record holds at least one token and references no prefix".into()
            ));
        }
        if self.prefixes.contains_key(&prefix.sample_id) {
            return Err(err(
                "this prefix id is already in the dataset (ids must be unique)".into()
            ));
        }
        self.check_sample(prefix)?;
        let digest = token_digest(prefix.tensors[t]);
        if let Some(id) = self.prefix_ids.get(&digest) {
            return Err(err(format!("these token ids are already stored as prefix record {id}")));
        }
        let mut records = self.encode(std::slice::from_ref(prefix))?;
        for rec in &mut records {
            rec.is_prefix = true;
            rec.key = prefix_key(&digest);
        }
        self.send(records)?;
        let p = PrefixRef {
            id: prefix.sample_id,
            n_tokens: prefix.n_tokens,
            digest,
        };
        self.prefixes.insert(p.id, p);
        self.prefix_ids.insert(digest, p.id);
        Ok(p)
    }

    /// The id of the prefix record whose token ids have SHA-256 `digest` (written by this writer or
    /// in the dataset it resumed), if any.
    pub fn prefix_id(&self, digest: &[u8; 32]) -> Option<u64> {
        self.prefix_ids.get(digest).copied()
    }

    /// The prefix records written or found on resume, by id.
    pub fn prefixes(&self) -> &HashMap<u64, PrefixRef> {
        &self.prefixes
    }

    /// Queues encoded records for the I/O thread, blocking while the queue is full.
    fn send(&mut self, records: Vec<Record>) -> Result<()> {
        let tx = self.tx.as_ref().expect("checked by the callers");
        for rec in records {
            let t1 = Instant::now();
            let sent = tx.send(rec);
            self.stats
                .counters
                .blocked_ns
                .fetch_add(t1.elapsed().as_nanos() as u64, Relaxed);
            if sent.is_err() {
                // The I/O thread stopped: its error says why.
                let err = self
                    .join_io()
                    .err()
                    .unwrap_or_else(|| Error::Internal("shard I/O thread stopped".into()));
                self.failed = Some(err.duplicate());
                return Err(err);
            }
        }
        Ok(())
    }

    fn validate(&self, samples: &[SampleRef<'_>]) -> Result<()> {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let batch = Self::new_ids(&seen, samples)?;
        for s in samples {
            self.check_sample(s)?;
        }
        seen.extend(batch);
        Ok(())
    }

    /// Refuses a sample id already in the dataset or given twice (nothing is recorded).
    fn check_ids(&self, samples: &[SampleRef<'_>]) -> Result<()> {
        Self::new_ids(&self.seen.lock().unwrap_or_else(|p| p.into_inner()), samples).map(drop)
    }

    fn new_ids(seen: &HashSet<u64>, samples: &[SampleRef<'_>]) -> Result<HashSet<u64>> {
        let mut batch = HashSet::with_capacity(samples.len());
        for s in samples {
            if seen.contains(&s.sample_id) || !batch.insert(s.sample_id) {
                return Err(Error::Schema {
                    sample_id: s.sample_id,
                    message: "this sample id is already in the dataset (ids must be unique)".into(),
                });
            }
        }
        Ok(batch)
    }

    /// Checks a sample's key, tensors and prefix reference against the schema and the prefixes.
    fn check_sample(&self, s: &SampleRef<'_>) -> Result<()> {
        let err = |message: String| Error::Schema {
            sample_id: s.sample_id,
            message,
        };
        if let Some(id) = s.prefix {
            if !self.prefixes.contains_key(&id) {
                return Err(err(format!(
                    "it references prefix record {id}, which this dataset does not hold"
                )));
            }
        }
        {
            if s.key.len() > MAX_KEY_BYTES {
                return Err(err(format!("key of {} bytes (at most {MAX_KEY_BYTES})", s.key.len())));
            }
            if s.tensors.len() != self.schema.tensors.len() {
                return Err(err(format!(
                    "{} tensors given, the schema has {}",
                    s.tensors.len(),
                    self.schema.tensors.len()
                )));
            }
            for (spec, data) in self.schema.tensors.iter().zip(&s.tensors) {
                let row_bytes = SampleRef::given_row_bytes(spec, s.prequantised.is_some());
                let expected = s.n_tokens.checked_mul(row_bytes);
                if expected != Some(data.len() as u64) {
                    let quantised = if row_bytes != spec.row_bytes() {
                        " (FP8 scales and bytes)"
                    } else {
                        ""
                    };
                    return Err(err(format!(
                        "tensor {:?} holds {} bytes; {} tokens x {} bytes per token{quantised} = {} expected",
                        spec.name,
                        data.len(),
                        s.n_tokens,
                        row_bytes,
                        s.n_tokens.saturating_mul(row_bytes)
                    )));
                }
            }
        }
        Ok(())
    }

    fn encode(&self, samples: &[SampleRef<'_>]) -> Result<Vec<Record>> {
        // One job per (sample, tensor, chunk of rows), all encoded in parallel.
        let mut jobs = Vec::new();
        for (si, s) in samples.iter().enumerate() {
            for (ti, spec) in self.schema.tensors.iter().enumerate() {
                // Chunks hold `chunk_bytes` of decoded bytes: FP8 rows (with their scales) as stored.
                let row_bytes = spec.stored_row_bytes();
                let rows_per_chunk = chunk_rows(self.opts.chunk_bytes, row_bytes, spec.precision.is_none());
                let mut row = 0;
                loop {
                    let rows = rows_per_chunk.min(s.n_tokens - row);
                    jobs.push((si, ti, row, rows));
                    row += rows;
                    if row >= s.n_tokens {
                        break;
                    }
                }
            }
        }
        let codec = self.opts.codec;
        let schema = &self.schema;
        let encoded: Vec<(EncodedChunk, QuantCounts)> = catch_panic("an encode thread", || {
            self.pool.install(|| {
                jobs.par_iter()
                    .map(|&(si, ti, row, rows)| {
                        let spec = &schema.tensors[ti];
                        let s = &samples[si];
                        let rb = SampleRef::given_row_bytes(spec, s.prequantised.is_some()) as usize;
                        let data = &s.tensors[ti][row as usize * rb..(row + rows) as usize * rb];
                        let schema_err = |message| Error::Schema {
                            sample_id: s.sample_id,
                            message,
                        };
                        match &spec.precision {
                            Some(p) => {
                                let input = match s.prequantised {
                                    Some(_) => Fp8Input::Quantised,
                                    None => Fp8Input::Unquantised,
                                };
                                encode_fp8_rows(data, input, row, rows as usize, spec, p, &codec).map_err(schema_err)
                            }
                            None => Ok((
                                encode_chunk(data, rows as u32, spec.dtype, &codec),
                                QuantCounts::default(),
                            )),
                        }
                    })
                    .collect::<Result<_>>()
            })
        })?;
        let mut counts = QuantCounts::default();
        for (_, c) in &encoded {
            counts.add(c);
        }
        if schema.tensors.iter().any(|t| t.precision.is_some()) {
            // Rows quantised on the source device: their quantiser counted the clamps.
            counts.clamped += samples.iter().filter_map(|s| s.prequantised).sum::<u64>();
        }
        let c = &self.stats.counters;
        c.fp8_values.fetch_add(counts.values, Relaxed);
        c.fp8_clamped.fetch_add(counts.clamped, Relaxed);
        c.fp8_zero_blocks.fetch_add(counts.zero_blocks, Relaxed);
        let mut per_sample: Vec<Vec<Vec<EncodedChunk>>> = samples
            .iter()
            .map(|_| schema.tensors.iter().map(|_| Vec::new()).collect())
            .collect();
        for (&(si, ti, _, _), (chunk, _)) in jobs.iter().zip(encoded) {
            per_sample[si][ti].push(chunk);
        }
        samples
            .iter()
            .zip(per_sample)
            .map(|(s, tensors)| {
                let prefix = s.prefix.map(|id| self.prefixes[&id]);
                let n_tokens = s.n_tokens + prefix.map_or(0, |p| p.n_tokens);
                let mut parts = vec![record::encode_table(s.sample_id, n_tokens, prefix, &tensors)];
                parts.extend(tensors.into_iter().flatten().map(|c| c.payload));
                // Decoded (dequantised) bytes of the whole sample, however the tensors were given.
                let raw_bytes = n_tokens * schema.token_bytes();
                let length: u64 = parts.iter().map(|p| p.len() as u64).sum();
                if raw_bytes > length.saturating_mul(MAX_EXPANSION) {
                    // Readers bound an entry's decoded size by its record's length (docs/FORMAT.md 4.3).
                    return Err(Error::Schema {
                        sample_id: s.sample_id,
                        message: format!(
                            "its suffix record of {length} bytes cannot carry a reference to a prefix of {} tokens \
                             (readers refuse {raw_bytes} decoded bytes from it); store it whole",
                            prefix.map_or(0, |p| p.n_tokens)
                        ),
                    });
                }
                Ok(Record {
                    sample_id: s.sample_id,
                    key: s.key.to_owned(),
                    is_prefix: false,
                    n_tokens,
                    raw_bytes,
                    parts,
                })
            })
            .collect()
    }

    pub fn stats(&self) -> WriterStats {
        self.stats.snapshot()
    }

    /// A handle to read the counters from another thread.
    pub fn stats_handle(&self) -> StatsHandle {
        self.stats.clone()
    }

    fn join_io(&mut self) -> Result<Manifest> {
        self.tx = None;
        match self.io.take() {
            Some(h) => h
                .join()
                .map_err(|payload| Error::panicked("the shard I/O thread", &*payload))?,
            None => Err(Error::InvalidArgument("the writer is closed".into())),
        }
    }

    /// The flag `close` reads to mark the manifest complete (true until set false): a consumer
    /// that owns the writer elsewhere (the capture sink's thread) can make its close incomplete.
    pub fn completion(&self) -> Arc<AtomicBool> {
        self.complete_on_close.clone()
    }

    /// Commits the last shard and returns the manifest, left marked incomplete (`complete:
    /// false`): an interrupted capture, which `resume` continues and a following reader waits on.
    pub fn close_incomplete(&mut self) -> Result<Manifest> {
        self.complete_on_close.store(false, Relaxed);
        self.close()
    }

    /// Commits the last shard, marks the manifest complete (unless `close_incomplete` /
    /// `completion` said otherwise) and returns it.
    pub fn close(&mut self) -> Result<Manifest> {
        // Whatever happens, the root is released: a caller may resume it at once.
        self.lock = None;
        if let Some(err) = &self.failed {
            return Err(err.earlier("the writer failed earlier"));
        }
        self.join_io()
    }
}

/// Prefix ids a writer numbers itself (`DatasetWriter::write_batch_sharing`) are `rank *
/// PREFIX_IDS_PER_RANK + n`, as live captures number sample ids: the ranks of one root never
/// number a prefix alike, so `eagle-io merge` carries every rank's prefix records.
pub const PREFIX_IDS_PER_RANK: u64 = 1 << 40;

/// `s` cut at token `at`: its first `at` rows (a prefix, same id) and the rows after them.
fn split_rows<'a>(schema: &Schema, s: &SampleRef<'a>, at: u64) -> (SampleRef<'a>, SampleRef<'a>) {
    let cut = |first: bool| SampleRef {
        sample_id: s.sample_id,
        key: s.key,
        n_tokens: if first { at } else { s.n_tokens - at },
        tensors: schema
            .tensors
            .iter()
            .zip(&s.tensors)
            .map(|(spec, data)| {
                let (head, tail) =
                    data.split_at((at * SampleRef::given_row_bytes(spec, s.prequantised.is_some())) as usize);
                if first {
                    head
                } else {
                    tail
                }
            })
            .collect(),
        // The clamps counted for the sample go with its own record (its prefix record counts none).
        prequantised: s.prequantised.map(|c| if first { 0 } else { c }),
        prefix: s.prefix,
    };
    (cut(true), cut(false))
}

/// Quantises `rows` rows (starting at row `first` of the sample) to FP8 and entropy-codes them
/// (chunk layout 3). The error names the first NaN/Inf.
/// Rows of `row_bytes` at or above which a chunk holds at least `MIN_WIDE_CHUNK_ROWS` rows
/// (8,192 bf16 channels: production-width states, e.g. Kimi-K2.5's 21,504-wide aux rows).
const WIDE_ROW_BYTES: u64 = 16 << 10;
/// Rows of a chunk of wide rows at least: each chunk estimates and stores its own channel
/// modes, which 24 rows (1 MiB of 21,504-wide rows) paid for in ratio and encode time
/// (at 64 rows: ratio 1.444 -> 1.465 and encode 539 -> 766 MB/CPU-s; benches/README.md).
const MIN_WIDE_CHUNK_ROWS: u64 = 64;

/// Rows per chunk of a tensor whose rows are `row_bytes` as stored: `chunk_bytes` of them, but
/// at least `MIN_WIDE_CHUNK_ROWS` wide rows (unquantised tensors: FP8 chunks keep `chunk_bytes`).
fn chunk_rows(chunk_bytes: u64, row_bytes: u64, unquantised: bool) -> u64 {
    let rows = chunk_bytes / row_bytes;
    let rows = if unquantised && row_bytes >= WIDE_ROW_BYTES {
        rows.max(MIN_WIDE_CHUNK_ROWS)
    } else {
        rows
    };
    rows.clamp(1, u32::MAX as u64 / row_bytes)
}

impl Drop for DatasetWriter {
    /// Dropping without `close` commits what was queued, as `close` does, so no accepted
    /// sample is lost when the caller unwinds.
    fn drop(&mut self) {
        self.tx = None;
        if let Some(h) = self.io.take() {
            let _ = h.join();
        }
    }
}

struct IoThread {
    root: PathBuf,
    manifest_path: PathBuf,
    manifest: Manifest,
    builder: Option<ShardBuilder>,
    next_seq: u64,
    opts: WriterOptions,
    counters: Arc<Counters>,
    complete_on_close: Arc<AtomicBool>,
}

impl IoThread {
    fn run(mut self, rx: Receiver<Record>) -> Result<Manifest> {
        for rec in rx {
            self.append(rec)?;
        }
        self.commit()?;
        self.manifest.complete = self.complete_on_close.load(Relaxed);
        self.manifest.store(&self.manifest_path)?;
        Ok(self.manifest)
    }

    fn append(&mut self, rec: Record) -> Result<()> {
        if rec.is_prefix {
            return self.commit_prefix(rec);
        }
        if self.builder.is_none() {
            let name = layout::shard_name(&self.opts.shard_prefix, self.next_seq);
            self.next_seq += 1;
            self.builder = Some(ShardBuilder::create(
                &self.root.join(layout::SHARD_DIR).join(name),
                &self.manifest.schema,
                self.manifest.format_version.max(PLAIN_VERSION),
            )?);
        }
        let b = self.builder.as_mut().expect("created above");
        let before = b.len();
        b.append(rec.sample_id, &rec.key, rec.n_tokens, rec.raw_bytes, &rec.parts)?;
        // Written: the payload buffers go back to the encoders, pages mapped (`codec::recycle_payload`).
        rec.parts.into_iter().for_each(recycle_payload);
        let c = &self.counters;
        c.samples.fetch_add(1, Relaxed);
        c.tokens.fetch_add(rec.n_tokens, Relaxed);
        c.raw_bytes.fetch_add(rec.raw_bytes, Relaxed);
        c.stored_bytes.fetch_add(b.len() - before, Relaxed);
        if b.len() >= self.opts.shard_bytes {
            self.commit()?;
        }
        Ok(())
    }

    /// Commits a prefix record in a prefix shard of its own (`{shard_prefix}prefix-NNNNNN.eio`) and
    /// lists it; the dataset becomes format version 3, and so does the next shard (the open one,
    /// of an older version, is committed first: it cannot hold references).
    fn commit_prefix(&mut self, rec: Record) -> Result<()> {
        if self.manifest.format_version < PREFIX_VERSION {
            self.commit()?;
            self.manifest.format_version = PREFIX_VERSION;
        }
        let name = layout::shard_name(
            &format!("{}{PREFIX_SHARD_INFIX}", self.opts.shard_prefix),
            self.manifest.prefixes.len() as u64,
        );
        let path = self.root.join(layout::SHARD_DIR).join(name);
        let mut b = ShardBuilder::create(&path, &self.manifest.schema, PREFIX_VERSION)?;
        b.append(rec.sample_id, &rec.key, rec.n_tokens, rec.raw_bytes, &rec.parts)?;
        rec.parts.into_iter().for_each(recycle_payload);
        self.counters.stored_bytes.fetch_add(b.len(), Relaxed);
        let summary = b.commit(&self.root)?;
        self.manifest.prefixes.push(summary);
        self.manifest.store(&self.manifest_path)
    }

    fn commit(&mut self) -> Result<()> {
        let Some(b) = self.builder.take().filter(|b| !b.is_empty()) else {
            return Ok(());
        };
        let summary = b.commit(&self.root)?;
        self.manifest.shards.push(summary);
        self.manifest.store(&self.manifest_path)?;
        self.counters.shards.fetch_add(1, Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::chunk_rows;

    #[test]
    fn wide_rows_are_chunked_at_least_64_at_a_time() {
        let mib = 1 << 20;
        assert_eq!(chunk_rows(mib, 2 * 1728, true), 303); // narrow: chunk_bytes of rows
        assert_eq!(chunk_rows(mib, 2 * 7168, true), 73);
        assert_eq!(chunk_rows(mib, 2 * 21_504, true), 64); // 24 rows fit; 64 at least
        assert_eq!(chunk_rows(mib, 2 * 21_504, false), 24); // FP8 chunks keep chunk_bytes
        assert_eq!(chunk_rows(4 << 20, 2 * 21_504, true), 97);
        assert_eq!(chunk_rows(100, 2 * 32, true), 1);
        assert_eq!(chunk_rows(1, 2 * 32, true), 1);
    }
}
