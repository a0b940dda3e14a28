//! Opening a dataset reads the manifest and each shard's header, footer and index: two
//! small reads per shard and no payload, so start-up does not grow with the sample count
//! beyond the index itself. Reads are positioned (`pread`) and checksummed; decoding runs
//! on a process-wide pool that is rebuilt after `fork`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rayon::prelude::*;

use super::decode::{check_output_len, decode_record, decode_tensor};
use super::manifest::Manifest;
use super::options::ReadOptions;
use super::prefix::Prefixes;
use crate::error::{lock, Error, Result};
use crate::pool;
use crate::quant;
use crate::schema::Schema;
use crate::shard::{ShardFile, ShardSummary};
use crate::storage::{self, CacheOptions, CachedObject, FetchOptions, Fetcher};

/// Output bytes per dequantisation job.
const DEQUANT_JOB_BYTES: usize = 256 * 1024;

thread_local! {
    /// The calling thread's stored rows of FP8 tensors (one buffer per schema tensor), reused
    /// across reads.
    static STORED: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
    /// The calling thread's record buffer, reused across reads (its memory is already mapped).
    static RECORD: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Where a sample is and what its index says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<'a> {
    pub sample_id: u64,
    pub n_tokens: u64,
    pub key: &'a str,
    pub shard: usize,
    pub record: usize,
    /// Byte offset of the record in its shard.
    pub offset: u64,
}

/// One problem `verify` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRecord {
    pub shard: PathBuf,
    /// `None` when the whole shard is unreadable (bad header, index or manifest entry).
    pub sample_id: Option<u64>,
    pub offset: u64,
    pub error: String,
}

pub struct Dataset {
    manifest_path: PathBuf,
    manifest: Manifest,
    shards: Vec<ShardFile>,
    /// The prefix records samples reference, and the cache of their decoded rows.
    prefixes: Prefixes,
    /// Position of each shard's first record.
    starts: Vec<u64>,
    by_id: HashMap<u64, u64>,
    threads: usize,
    /// Fetches a batch's records from object storage (coalesced, bounded concurrency).
    fetcher: Fetcher,
}

/// `path` itself when it is a file (or a `.json` object), else `path/manifest.json`.
pub fn manifest_path(path: &Path) -> PathBuf {
    crate::storage::resolve(path, crate::layout::MANIFEST_NAME)
}

/// A shard's copy in a read-through cache, and how to fill it.
type Cached<'a> = Option<(&'a CacheOptions, FetchOptions)>;

/// Opens the shard `summary` lists (one of `manifest`'s shards or prefix shards) and checks it
/// against that entry.
fn open_listed(
    manifest_path: &Path,
    manifest: &Manifest,
    summary: &ShardSummary,
    cache: Cached<'_>,
) -> Result<ShardFile> {
    let escapes = Path::new(&summary.file)
        .components()
        .any(|c| !matches!(c, std::path::Component::Normal(_)));
    if escapes {
        return Err(Error::corrupt(
            manifest_path,
            None,
            0,
            format!(
                "manifest (shard path {:?} is not relative to the dataset)",
                summary.file
            ),
        ));
    }
    let path = Manifest::shard_path(manifest_path, summary);
    let shard = match cache.filter(|_| storage::is_url(&path)) {
        None => ShardFile::open(&path)?,
        Some((cache, fetch)) => {
            // (the shard or its open error, whether it came from a cached copy)
            let open = || -> Result<(Result<ShardFile>, bool)> {
                let source = CachedObject::open(&path, cache, summary.bytes, fetch)?;
                let hit = source.is_cached();
                Ok((ShardFile::from_source(&path, Box::new(source)), hit))
            };
            match open()? {
                (Ok(shard), false) => shard,
                (Ok(shard), true) if mismatch(manifest, summary, &shard).is_none() => shard,
                // A cached copy that fails its checks: deleted, and the object read again.
                (Ok(_) | Err(Error::Corrupt { .. }), true) => {
                    storage::discard_cached(&path, cache)?;
                    open()?.0?
                }
                (Err(e), _) => return Err(e),
            }
        }
    };
    match mismatch(manifest, summary, &shard) {
        Some(what) => Err(Error::corrupt(
            &path,
            None,
            0,
            format!("shard ({what} differs from {})", manifest_path.display()),
        )),
        None => Ok(shard),
    }
}

/// What of `shard` differs from its entry `summary` in `manifest`, if anything.
fn mismatch(manifest: &Manifest, summary: &ShardSummary, shard: &ShardFile) -> Option<&'static str> {
    if shard.version > manifest.format_version {
        Some("its format version, newer than the manifest's,")
    } else if shard.schema != manifest.schema {
        Some("its schema")
    } else if shard.file_len != summary.bytes {
        Some("its size")
    } else if shard.entries.len() as u64 != summary.samples {
        Some("its sample count")
    } else if shard.footer.index_crc32 != summary.index_crc32 {
        Some("its index checksum")
    } else if shard.entries.iter().map(|e| e.n_tokens).sum::<u64>() != summary.tokens {
        Some("its token count")
    } else if shard
        .entries
        .iter()
        .map(|e| e.n_tokens * shard.schema.token_bytes())
        .sum::<u64>()
        != summary.raw_bytes
    {
        Some("its decoded size")
    } else {
        None
    }
}

impl Dataset {
    /// Opens the dataset whose manifest is `path` (or `path/manifest.json`). `threads`
    /// decode threads per read (0 = one per CPU); the other reader settings at their defaults.
    pub fn open(path: &Path, threads: usize) -> Result<Dataset> {
        Self::open_with(
            path,
            &ReadOptions {
                threads,
                ..ReadOptions::default()
            },
        )
    }

    /// Opens the dataset whose manifest is `path` (or `path/manifest.json`) with `options`.
    pub fn open_with(path: &Path, options: &ReadOptions) -> Result<Dataset> {
        let fetcher = Fetcher::new(options.fetch)?;
        let manifest_path = manifest_path(path);
        let manifest = Manifest::load(&manifest_path)?;
        let cache = options.cache.as_ref().map(|c| (c, options.fetch));
        let open = |list: &[ShardSummary]| -> Result<Vec<ShardFile>> {
            list.iter()
                .map(|s| open_listed(&manifest_path, &manifest, s, cache))
                .collect()
        };
        let shards = open(&manifest.shards)?;
        let prefixes = Prefixes::new(open(&manifest.prefixes)?)?;
        let mut starts = Vec::with_capacity(shards.len());
        let mut by_id = HashMap::new();
        let mut pos = 0u64;
        for s in &shards {
            starts.push(pos);
            for e in &s.entries {
                if let Some(first) = by_id.insert(e.sample_id, pos) {
                    return Err(Error::corrupt(
                        &s.path,
                        Some(e.sample_id),
                        e.offset,
                        format!("record (sample id also stored at dataset position {first})"),
                    ));
                }
                pos += 1;
            }
        }
        Ok(Dataset {
            manifest_path,
            manifest,
            shards,
            prefixes,
            starts,
            by_id,
            threads: options.threads,
            fetcher,
        })
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Every prefix record (docs/FORMAT.md 4.7), in manifest order: `(prefix id, tokens, key
    /// "sha256:<hex>", its prefix shard's file as the manifest lists it)`.
    pub fn prefix_records(&self) -> Vec<(u64, u64, String, String)> {
        let files = self.manifest.prefixes.iter().map(|s| &s.file);
        let mut out = Vec::new();
        for (shard, file) in self.prefixes.shards().iter().zip(files) {
            for (r, e) in shard.entries.iter().enumerate() {
                out.push((e.sample_id, e.n_tokens, shard.key(r).to_owned(), file.clone()));
            }
        }
        out
    }

    pub fn manifest_path(&self) -> &Path {
        &self.manifest_path
    }

    pub fn schema(&self) -> &Schema {
        &self.manifest.schema
    }

    /// Number of samples.
    pub fn len(&self) -> u64 {
        self.by_id.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// The index entry at `pos` (0-based over all shards in manifest order).
    pub fn entry(&self, pos: u64) -> Result<Entry<'_>> {
        if pos >= self.len() {
            return Err(Error::NotFound(format!(
                "position {pos} is out of range (dataset has {} samples)",
                self.len()
            )));
        }
        let shard = self.starts.partition_point(|&s| s <= pos) - 1;
        let record = (pos - self.starts[shard]) as usize;
        let s = &self.shards[shard];
        let e = &s.entries[record];
        Ok(Entry {
            sample_id: e.sample_id,
            n_tokens: e.n_tokens,
            key: s.key(record),
            shard,
            record,
            offset: e.offset,
        })
    }

    /// Position of the sample with this id, if the dataset holds it.
    pub fn position(&self, sample_id: u64) -> Option<u64> {
        self.by_id.get(&sample_id).copied()
    }

    /// Reads, checksums and decodes the sample at `pos` into `outs` (one buffer per schema
    /// tensor, each exactly `n_tokens x row_bytes`). FP8 tensors are dequantised into their
    /// schema dtype on the reader's threads (`read_stored_into` leaves them quantised).
    pub fn read_into(&self, pos: u64, outs: &mut [&mut [u8]]) -> Result<()> {
        self.read_into_with(pos, outs, None)
    }

    /// `read_into`, from the record's bytes when `fetched` holds them (a batch's fetch).
    fn read_into_with(&self, pos: u64, outs: &mut [&mut [u8]], fetched: Option<&[u8]>) -> Result<()> {
        let schema = self.schema();
        if !schema.has_fp8() {
            return self.read_stored_with(pos, outs, fetched);
        }
        let n_tokens = self.entry(pos)?.n_tokens;
        // A pool thread may start another read while waiting inside this one: that read gets
        // buffers of its own.
        STORED.with(|cell| match cell.try_borrow_mut() {
            Ok(mut stored) => self.read_fp8_into(pos, n_tokens, outs, fetched, &mut stored),
            Err(_) => self.read_fp8_into(pos, n_tokens, outs, fetched, &mut Vec::new()),
        })
    }

    /// `read_into` of a schema with FP8 tensors, their stored rows decoded into `stored` (the
    /// calling thread's buffers, resized: decoding writes every byte).
    fn read_fp8_into(
        &self,
        pos: u64,
        n_tokens: u64,
        outs: &mut [&mut [u8]],
        fetched: Option<&[u8]>,
        stored: &mut Vec<Vec<u8>>,
    ) -> Result<()> {
        let schema = self.schema();
        stored.resize_with(outs.len(), Vec::new);
        for (i, (spec, out)) in schema.tensors.iter().zip(outs.iter()).enumerate() {
            let want = n_tokens * spec.row_bytes();
            if spec.precision.is_some() && out.len() as u64 != want {
                return Err(Error::InvalidArgument(format!(
                    "output for tensor {:?} is {} bytes; it needs {n_tokens} tokens x {} bytes = {want}",
                    spec.name,
                    out.len(),
                    spec.row_bytes()
                )));
            }
            let n = if spec.precision.is_some() {
                n_tokens * spec.stored_row_bytes()
            } else {
                0
            };
            stored[i].resize(n as usize, 0);
        }
        {
            let mut views: Vec<&mut [u8]> = schema
                .tensors
                .iter()
                .zip(outs.iter_mut())
                .zip(stored.iter_mut())
                .map(|((spec, out), buf)| match spec.precision {
                    Some(_) => buf.as_mut_slice(),
                    None => &mut **out,
                })
                .collect();
            self.read_stored_with(pos, &mut views, fetched)?;
        }
        let pool = pool::shared(self.threads);
        for ((spec, out), buf) in schema.tensors.iter().zip(outs.iter_mut()).zip(stored.iter()) {
            if let Some(p) = &spec.precision {
                let width = spec.elems_per_row() as usize;
                // Jobs of about 256 KiB of output.
                let rows = (DEQUANT_JOB_BYTES / spec.row_bytes() as usize).max(1);
                let (src_step, dst_step) = (
                    rows * spec.stored_row_bytes() as usize,
                    rows * spec.row_bytes() as usize,
                );
                pool.install(|| {
                    buf.par_chunks(src_step)
                        .zip(out.par_chunks_mut(dst_step))
                        .for_each(|(s, d)| {
                            let n = d.len() / spec.row_bytes() as usize;
                            quant::dequantize(s, n, width, p, spec.dtype, d)
                        })
                });
            }
        }
        Ok(())
    }

    /// Reads, checksums and decodes the sample at `pos` into `outs` as stored (one buffer per
    /// schema tensor, each exactly `n_tokens x stored_row_bytes`: FP8 tensors as rows of f32
    /// scales then FP8 bytes, `crate::quant`).
    pub fn read_stored_into(&self, pos: u64, outs: &mut [&mut [u8]]) -> Result<()> {
        self.read_stored_with(pos, outs, None)
    }

    /// `read_stored_into`, from the record's bytes when `fetched` holds them (checksummed here).
    fn read_stored_with(&self, pos: u64, outs: &mut [&mut [u8]], fetched: Option<&[u8]>) -> Result<()> {
        let e = self.entry(pos)?;
        let shard = &self.shards[e.shard];
        if let Some(rec) = fetched {
            shard.check_record(e.record, rec)?;
            return self.decode_whole(shard, e.record, rec, outs);
        }
        // A pool thread waiting inside a decode may steal another read of the same batch: that
        // read gets a buffer of its own (borrowing the thread's again panicked).
        RECORD.with(|cell| {
            let (mut own, mut reused) = (Vec::new(), cell.try_borrow_mut().ok());
            let buf = reused.as_deref_mut().unwrap_or(&mut own);
            let rec = shard.read_record(e.record, buf)?;
            self.decode_whole(shard, e.record, rec, outs)
        })
    }

    /// Decodes record `record` of `shard` (checksummed bytes `rec`) into `outs` as stored, the rows
    /// of a prefix it references included: the whole sample.
    fn decode_whole(&self, shard: &ShardFile, record: usize, rec: &[u8], outs: &mut [&mut [u8]]) -> Result<()> {
        match decode_record(shard, record, rec, outs, &pool::shared(self.threads))? {
            Some(p) => self.prefixes.fill(shard, record, &p, outs),
            None => Ok(()),
        }
    }

    /// Reads, checksums and decodes several samples in one call, all on the decode pool: `items`
    /// pairs a position with its output buffers, as for `read_into`. Records in local files are
    /// read on the pool (one positioned read each, into its thread's reused buffer); records in
    /// objects are fetched first, all together ([`Fetcher`]: adjacent records coalesced into one
    /// ranged GET, several GETs in flight). Every item is attempted; on failure the error of the
    /// first failing item in `items` order is returned.
    pub fn read_batch(&self, items: &mut [(u64, Vec<&mut [u8]>)]) -> Result<()> {
        self.each_record(
            items,
            |item: &mut BatchItem<'_>| item.0,
            |item, rec| self.read_into_with(item.0, &mut item.1, rec),
        )
        .into_iter()
        .collect()
    }

    /// Reads, checksums and decodes one tensor, `name`, of several records: `items` pairs a
    /// position with its output buffer (exactly `n_tokens x row_bytes` of that tensor; an FP8
    /// tensor comes out dequantised into its schema dtype). The CRC-32 covers the whole record,
    /// so each record is read whole (where it lies in a mapped local shard, else one positioned
    /// read; from object storage, the batch's records fetched together as by `read_batch`) and
    /// checked; only `name`'s chunks are decoded. Every item is attempted: the result has one
    /// entry per item. `Err` only for a tensor the schema lacks.
    pub fn read_tensor_batch(&self, name: &str, items: &mut [(u64, &mut [u8])]) -> Result<Vec<Result<()>>> {
        let schema = self.schema();
        let t = schema.tensors.iter().position(|s| s.name == name).ok_or_else(|| {
            let names: Vec<&str> = schema.tensors.iter().map(|s| s.name.as_str()).collect();
            Error::InvalidArgument(format!("the schema has no tensor {name:?} (it has {names:?})"))
        })?;
        Ok(self.each_record(
            items,
            |item: &mut (u64, &mut [u8])| item.0,
            |item, rec| self.read_tensor_into(item.0, t, item.1, rec),
        ))
    }

    /// The one batch scheduler of `read_batch` and `read_tensor_batch`: runs `read(item, record)`
    /// for every item on the decode pool, one result each in `items` order. Items whose record
    /// lies in a local file get `None` (`read` reads it itself, on the pool); the records of the
    /// others are fetched from object storage by the calling thread, all together ([`Fetcher`]:
    /// adjacent records coalesced, several GETs in flight), and each is decoded as it arrives.
    fn each_record<I: Send>(
        &self,
        items: &mut [I],
        pos: impl Fn(&mut I) -> u64,
        read: impl Fn(&mut I, Option<&[u8]>) -> Result<()> + Sync,
    ) -> Vec<Result<()>> {
        let pool = pool::shared(self.threads);
        let results: Vec<Mutex<Result<()>>> = items.iter().map(|_| Mutex::new(Ok(()))).collect();
        let (requests, remote): (Vec<_>, Vec<usize>) = items
            .iter_mut()
            .enumerate()
            .filter_map(|(k, item)| {
                let e = self.entry(pos(item)).ok()?;
                let shard = &self.shards[e.shard];
                let ie = &shard.entries[e.record];
                Some(((shard.remote()?, ie.offset, ie.length), k))
            })
            .unzip();
        let mut slots: Vec<Option<&mut I>> = items.iter_mut().map(Some).collect();
        let read = &read;
        // The calling thread fetches (blocked outside the pool) while the pool decodes what is in.
        pool.in_place_scope(|scope| {
            let is_remote: std::collections::HashSet<usize> = remote.iter().copied().collect();
            for (k, slot) in slots.iter_mut().enumerate() {
                if !is_remote.contains(&k) {
                    let (item, result) = (slot.take().expect("each item once"), &results[k]);
                    scope.spawn(move |_| *lock(result) = read(item, None));
                }
            }
            self.fetcher.fetch_each(&requests, |j, rec| {
                let k = remote[j];
                let (item, result) = (slots[k].take().expect("each item once"), &results[k]);
                scope.spawn(move |_| *lock(result) = rec.and_then(|rec| read(item, Some(&rec))));
            });
        });
        results
            .into_iter()
            .map(|r| r.into_inner().unwrap_or_else(|p| p.into_inner()))
            .collect()
    }

    /// Tensor `t` of the sample at `pos` into `out` (`read_tensor_batch`), from the record's bytes
    /// when `fetched` holds them.
    fn read_tensor_into(&self, pos: u64, t: usize, out: &mut [u8], fetched: Option<&[u8]>) -> Result<()> {
        let e = self.entry(pos)?;
        let shard = &self.shards[e.shard];
        let spec = &self.schema().tensors[t];
        // The tensor's stored rows, the rows of a prefix the record references included.
        let stored_rows = |rec: &[u8], stored: &mut [u8]| -> Result<()> {
            match decode_tensor(shard, e.record, rec, t, stored)? {
                Some(p) => self.prefixes.fill_tensor(shard, e.record, &p, t, stored),
                None => Ok(()),
            }
        };
        let mut decode = |rec: &[u8]| -> Result<()> {
            let Some(p) = &spec.precision else {
                return stored_rows(rec, out);
            };
            check_output_len(&shard.entries[e.record], spec, spec.row_bytes(), out)?;
            let mut stored = vec![0u8; (e.n_tokens * spec.stored_row_bytes()) as usize];
            stored_rows(rec, &mut stored)?;
            let width = spec.elems_per_row() as usize;
            quant::dequantize(&stored, e.n_tokens as usize, width, p, spec.dtype, out);
            Ok(())
        };
        if let Some(rec) = fetched {
            shard.check_record(e.record, rec)?;
            return decode(rec);
        }
        RECORD.with(|cell| {
            let (mut own, mut reused) = (Vec::new(), cell.try_borrow_mut().ok());
            let buf = reused.as_deref_mut().unwrap_or(&mut own);
            decode(shard.read_record(e.record, buf)?)
        })
    }

    /// Reads the sample at `pos` into new buffers, one per schema tensor.
    pub fn read(&self, pos: u64) -> Result<Vec<Vec<u8>>> {
        let n_tokens = self.entry(pos)?.n_tokens;
        let mut bufs: Vec<Vec<u8>> = self
            .schema()
            .tensors
            .iter()
            .map(|t| vec![0u8; (n_tokens * t.row_bytes()) as usize])
            .collect();
        let mut outs: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
        self.read_into(pos, &mut outs)?;
        Ok(bufs)
    }

    /// Checks a dataset end to end: the manifest, every shard and prefix shard it lists, every
    /// record's checksum and decoding, every prefix record's digest of its token ids, and every
    /// sample's prefix reference (it resolves, to a prefix of its token count and digest, which is
    /// itself sound: a corrupt prefix record is named in every sample referencing it). Returns
    /// every problem found (empty when all is well); `Err` only when the manifest itself cannot be
    /// read.
    pub fn verify(path: &Path, threads: usize) -> Result<Vec<BadRecord>> {
        let manifest_path = manifest_path(path);
        let manifest = Manifest::load(&manifest_path)?;
        let pool = pool::shared(threads);
        let mut bad = Vec::new();
        let mut open = |summary: &ShardSummary| match open_listed(&manifest_path, &manifest, summary, None) {
            Ok(s) => Some(s),
            Err(err) => {
                bad.push(BadRecord {
                    shard: Manifest::shard_path(&manifest_path, summary),
                    sample_id: None,
                    offset: corrupt_offset(&err),
                    error: err.to_string(),
                });
                None
            }
        };
        let prefix_shards: Vec<ShardFile> = manifest.prefixes.iter().filter_map(&mut open).collect();
        let shards: Vec<ShardFile> = manifest.shards.iter().filter_map(&mut open).collect();
        let prefixes = Prefixes::new(prefix_shards).unwrap_or_else(|err| {
            bad.push(BadRecord {
                shard: manifest_path.clone(),
                sample_id: None,
                offset: corrupt_offset(&err),
                error: err.to_string(),
            });
            Prefixes::new(Vec::new()).expect("no prefix records")
        });
        // Prefix id -> why its record is unsound.
        let mut broken = HashMap::new();
        for (s, shard) in prefixes.shards().iter().enumerate() {
            for (r, e) in shard.entries.iter().enumerate() {
                let checked = prefixes
                    .decode(s, r)
                    .and_then(|rows| prefixes.check_digest(s, r, &rows));
                if let Err(err) = checked {
                    broken.insert(e.sample_id, err.to_string());
                    bad.push(BadRecord {
                        shard: shard.path.clone(),
                        sample_id: Some(e.sample_id),
                        offset: corrupt_offset(&err).max(e.offset),
                        error: err.to_string(),
                    });
                }
            }
        }
        for shard in shards {
            let found: Vec<BadRecord> = pool.install(|| {
                (0..shard.entries.len())
                    .into_par_iter()
                    .filter_map(|r| {
                        let e = &shard.entries[r];
                        let check = || -> Result<()> {
                            let mut buf = Vec::new();
                            let rec = shard.read_record(r, &mut buf)?;
                            let mut bufs: Vec<Vec<u8>> = shard
                                .schema
                                .tensors
                                .iter()
                                .map(|t| vec![0u8; (e.n_tokens * t.stored_row_bytes()) as usize])
                                .collect();
                            let mut outs: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
                            let Some(p) = decode_record(&shard, r, rec, &mut outs, &pool)? else {
                                return Ok(());
                            };
                            prefixes.resolve(&shard, r, &p)?;
                            match broken.get(&p.id) {
                                None => Ok(()),
                                Some(why) => Err(Error::corrupt(
                                    &shard.path,
                                    Some(e.sample_id),
                                    e.offset,
                                    format!("record (its prefix record {} is corrupt: {why})", p.id),
                                )),
                            }
                        };
                        check().err().map(|err| BadRecord {
                            shard: shard.path.clone(),
                            sample_id: Some(e.sample_id),
                            offset: corrupt_offset(&err).max(e.offset),
                            error: err.to_string(),
                        })
                    })
                    .collect()
            });
            bad.extend(found);
        }
        Ok(bad)
    }
}

/// A position and its output buffers, one per schema tensor (`Dataset::read_batch`).
type BatchItem<'a> = (u64, Vec<&'a mut [u8]>);

fn corrupt_offset(err: &Error) -> u64 {
    match err {
        Error::Corrupt { offset, .. } => *offset,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::{DatasetWriter, SampleRef, WriterOptions};
    use crate::{DType, TensorSpec};

    #[test]
    fn a_read_nested_in_another_on_the_same_thread_gets_its_own_buffers() {
        // read_batch's jobs run on pool threads that, waiting inside one decode, may run another
        // job: its read found the thread's record buffer borrowed and panicked ("RefCell already
        // borrowed"), failing the batch.
        let dir = tempfile::tempdir().unwrap();
        let spec = TensorSpec {
            name: "x".into(),
            dtype: DType::Uint8,
            width: Some(3),
            precision: None,
        };
        let schema = Schema::new(vec![spec]).unwrap();
        let opts = WriterOptions {
            threads: 1,
            ..Default::default()
        };
        let mut w = DatasetWriter::create(dir.path(), schema, serde_json::json!({}), opts).unwrap();
        let data: Vec<u8> = (0..12).collect();
        let sample = SampleRef {
            sample_id: 5,
            key: "k",
            n_tokens: 4,
            tensors: vec![&data],
            prequantised: None,
            prefix: None,
        };
        w.write_batch(&[sample]).unwrap();
        w.close().unwrap();
        let ds = Dataset::open(dir.path(), 1).unwrap();
        let mut out = vec![0u8; 12];
        RECORD.with(|cell| {
            let _outer = cell.borrow_mut(); // an outer read of this thread holds it
            ds.read_into(0, &mut [out.as_mut_slice()]).unwrap();
        });
        assert_eq!(out, data);
    }
}
