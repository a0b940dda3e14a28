//! Fuzz harness shared by `tests/fuzz_parsers.rs` (proptest; a short run is part of `cargo test`)
//! and the cargo-fuzz targets in `fuzz/fuzz_targets/` (coverage-guided; the long run). Each entry
//! point takes arbitrary bytes, drives one parser through eagle-io's public API, and panics only
//! when a property is violated:
//!
//! - no panic, no hang (each case must finish within [`CASE_SECONDS`]);
//! - only the documented errors: `Corrupt` or `FormatVersion` for bad bytes (never `Io` from a read
//!   past the end of a file whose size was known), naming the file; a record's error names its
//!   sample id and an offset inside the record;
//! - no over-allocation: peak heap growth while opening is at most a small multiple of the input
//!   size, and while reading a record at most what the validated index allows for its decoded size;
//! - never another sample: a shard corrupted at random either fails or reads back bit-identical
//!   (same ids, same bytes) to the original, and `verify` lists exactly the records a read rejects.

#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use eagle_io::codec::{decode_chunk, ChunkDesc, CHUNK_DESC_BYTES};
use eagle_io::dataset::{seal_manifest, DatasetWriter, Manifest, SampleRef, WriterOptions, UNSEALED_CHECKSUM};
use eagle_io::format::{record, FORMAT_VERSION};
use eagle_io::shard::ShardFile;
use eagle_io::{DType, Dataset, Error, Schema, TensorSpec};

/// A case taking longer than this is a hang.
pub const CASE_SECONDS: u64 = 5;
/// Slack for allocations not proportional to the input (thread-locals, zstd contexts, paths).
const SLACK: usize = 4 << 20;

// ------------------------------------------------------------------------------------------------
// Allocation accounting: the binary installs `CountingAlloc` as its global allocator.

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

pub struct CountingAlloc;

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's `layout` contract is `GlobalAlloc::alloc`'s, passed on unchanged.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Relaxed) + layout.size();
            PEAK.fetch_max(now, Relaxed);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as in `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Relaxed) + layout.size();
            PEAK.fetch_max(now, Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator (hence from `System`) with `layout`, per the caller's contract.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as in `dealloc`, with the caller's `new_size` contract passed on unchanged.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                let now = LIVE.fetch_add(new_size - layout.size(), Relaxed) + new_size - layout.size();
                PEAK.fetch_max(now, Relaxed);
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Relaxed);
            }
        }
        p
    }
}

/// Runs `f` and returns its result with the peak heap growth (bytes) during it.
fn peak_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let start = LIVE.load(Relaxed);
    PEAK.store(start, Relaxed);
    let out = f();
    (out, PEAK.load(Relaxed).saturating_sub(start))
}

// ------------------------------------------------------------------------------------------------
// Files

fn work_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("eagle-io-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(d.join("shards")).expect("fuzz work dir");
        d
    })
}

fn put(name: &str, bytes: &[u8]) -> PathBuf {
    let p = work_dir().join(name);
    std::fs::write(&p, bytes).expect("write fuzz input");
    p
}

fn allowed(e: &Error, path: &Path) {
    match e {
        Error::Corrupt { path: p, .. } | Error::FormatVersion { path: p, .. } => {
            assert_eq!(p, path, "the error names the file: {e}")
        }
        other => panic!("unexpected error kind for bad bytes: {other:?}"),
    }
}

fn timed<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let t0 = Instant::now();
    let out = f();
    assert!(
        t0.elapsed() < Duration::from_secs(CASE_SECONDS),
        "{what} took {:?}: a hang",
        t0.elapsed()
    );
    out
}

// ------------------------------------------------------------------------------------------------
// A small valid shard covering every codec (RAW, ZSTD, PLANES with 2 and 4 planes), several chunks
// per tensor, 0-, 1- and many-token samples, and keys (empty, ASCII, multi-byte UTF-8).

pub struct Original {
    pub bytes: Vec<u8>,
    pub schema: Schema,
    /// sample id -> (key, n_tokens, decoded tensors)
    pub samples: HashMap<u64, (String, u64, Vec<Vec<u8>>)>,
    /// sample ids in index order
    pub order: Vec<u64>,
}

fn tensor_bytes(id: u64, t: usize, len: usize) -> Vec<u8> {
    let mut x = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (t as u64 + 1);
    (0..len)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // every other byte low-entropy: zstd pays on some planes, not on others
            if i % 2 == 1 {
                (x % 3) as u8 + 60
            } else {
                x as u8
            }
        })
        .collect()
}

pub fn original() -> &'static Original {
    static ORIGINAL: OnceLock<Original> = OnceLock::new();
    ORIGINAL.get_or_init(|| {
        let spec = |name: &str, dtype, width| TensorSpec {
            name: name.into(),
            dtype,
            width,
            precision: None,
        };
        let schema = Schema::new(vec![
            spec("ids", DType::Int64, None),
            spec("mask", DType::Uint8, None),
            spec("aux", DType::Bfloat16, Some(6)),
            spec("f32", DType::Float32, Some(2)),
        ])
        .unwrap();
        let dir = work_dir().join("original");
        let _ = std::fs::remove_dir_all(&dir);
        let mut w = DatasetWriter::create(
            &dir,
            schema.clone(),
            serde_json::json!({}),
            WriterOptions {
                chunk_bytes: 96,
                threads: 1,
                ..Default::default()
            },
        )
        .unwrap();
        let plan: [(u64, u64, &str); 4] = [(7, 0, ""), (3, 1, "k"), (11, 40, "conv-ü"), (5, 9, "x")];
        let mut samples = HashMap::new();
        for &(id, n, key) in &plan {
            let data: Vec<Vec<u8>> = schema
                .tensors
                .iter()
                .enumerate()
                .map(|(t, s)| tensor_bytes(id, t, (n * s.row_bytes()) as usize))
                .collect();
            w.write_batch(&[SampleRef {
                sample_id: id,
                key,
                n_tokens: n,
                tensors: data.iter().map(|v| v.as_slice()).collect(),
                prequantised: None,
                prefix: None,
            }])
            .unwrap();
            samples.insert(id, (key.to_owned(), n, data));
        }
        let manifest = w.close().unwrap();
        assert_eq!(manifest.shards.len(), 1);
        let bytes = std::fs::read(dir.join(&manifest.shards[0].file)).unwrap();
        Original {
            bytes,
            schema,
            samples,
            order: plan.iter().map(|p| p.0).collect(),
        }
    })
}

// ------------------------------------------------------------------------------------------------
// Shards

fn u64_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
}

/// A manifest listing `shard` (a file in `shards/`) with the entry fields a reader checks taken
/// from the opened shard, so that reading goes past the manifest checks into every record.
fn manifest_for(shard: &ShardFile, file: &str) -> PathBuf {
    let m = serde_json::json!({
        "format": "eagle-io/dataset",
        "format_version": shard.version,
        "writer": "fuzz",
        "schema": shard.schema,
        "metadata": {},
        "codec": {"zstd_level": 1, "chunk_bytes": 96},
        "shards": [{
            "file": format!("shards/{file}"),
            "samples": shard.entries.len(),
            "tokens": shard.entries.iter().map(|e| e.n_tokens).sum::<u64>(),
            "bytes": shard.file_len,
            "raw_bytes": shard.entries.iter().map(|e| e.n_tokens).sum::<u64>() * shard.schema.token_bytes(),
            "index_crc32": shard.footer.index_crc32,
        }],
        "complete": true,
        "checksum": UNSEALED_CHECKSUM,
    });
    let mut text = serde_json::to_vec_pretty(&m).unwrap();
    assert!(seal_manifest(&mut text));
    put("manifest.json", &text)
}

/// Opens `bytes` as a shard and reads every record through the dataset reader. With `original`,
/// every record that reads must be bit-identical to the original sample of that id. Returns how
/// many records read back (so a test can prove the valid shard goes all the way).
fn check_shard(bytes: &[u8], original: Option<&Original>) -> usize {
    let path = put("shards/case.eio", bytes);
    let (opened, grew) = peak_during(|| timed("shard open", || ShardFile::open(&path)));
    assert!(
        grew <= 8 * bytes.len() + SLACK,
        "opening a {}-byte shard allocated {grew} bytes",
        bytes.len()
    );
    let shard = match opened {
        Ok(s) => s,
        Err(e) => {
            allowed(&e, &path);
            return 0;
        }
    };
    // What open validated (docs/FORMAT.md 4.2, 4.3).
    let data_start = 32 + u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as u64;
    let mut at = data_start;
    for e in &shard.entries {
        assert_eq!(e.offset, at, "records are contiguous");
        at += e.length;
        let decoded = e.n_tokens as u128 * shard.schema.token_bytes() as u128;
        assert!(
            decoded <= e.length as u128 * 40_000,
            "decoded size bounded before allocation"
        );
    }
    assert_eq!(at, shard.footer.index_offset);
    let manifest = manifest_for(&shard, "case.eio");
    let ds = match timed("dataset open", || Dataset::open(&manifest, 1)) {
        Ok(ds) => ds,
        Err(e) => {
            allowed(&e, &path); // e.g. one sample id twice in the index
            return 0;
        }
    };
    let mut failed = Vec::new();
    for pos in 0..ds.len() {
        let e = ds.entry(pos).unwrap();
        let (sid, n, offset) = (e.sample_id, e.n_tokens, e.offset);
        let length = shard.entries[e.record].length;
        let key = e.key.to_owned();
        let decoded: u64 = ds.schema().tensors.iter().map(|t| n * t.row_bytes()).sum();
        let (read, grew) = peak_during(|| timed("read", || ds.read(pos)));
        assert!(
            grew as u64 <= 2 * decoded + 2 * length + SLACK as u64,
            "reading sample {sid} ({decoded} decoded bytes, {length} stored) allocated {grew} bytes"
        );
        match read {
            Ok(bufs) => {
                for (b, t) in bufs.iter().zip(&ds.schema().tensors) {
                    assert_eq!(b.len() as u64, n * t.row_bytes());
                }
                if let Some(o) = original {
                    let (okey, on, odata) = o
                        .samples
                        .get(&sid)
                        .unwrap_or_else(|| panic!("a corrupt shard read as sample {sid}, which it never held"));
                    assert_eq!((&key, n), (okey, *on), "sample {sid}: entry differs from the original");
                    assert_eq!(&bufs, odata, "sample {sid} read back other bytes than written");
                }
            }
            Err(err) => {
                match &err {
                    Error::Corrupt {
                        path: p,
                        sample_id,
                        offset: o,
                        ..
                    } => {
                        assert_eq!(p, &path);
                        assert_eq!(*sample_id, Some(sid), "the error names the sample: {err}");
                        assert!(
                            (offset..offset + length.max(1)).contains(o),
                            "offset {o} outside record [{offset}, {}): {err}",
                            offset + length
                        );
                    }
                    other => panic!("unexpected read error {other:?}"),
                }
                failed.push(sid);
            }
        }
    }
    if let Some(o) = original {
        if ds.len() == o.order.len() as u64 {
            let ids: Vec<u64> = (0..ds.len()).map(|p| ds.entry(p).unwrap().sample_id).collect();
            assert_eq!(ids, o.order, "positions map to the same samples");
        }
    }
    let bad = timed("verify", || Dataset::verify(&manifest, 1)).expect("the manifest reads");
    let mut listed: Vec<u64> = bad.iter().map(|b| b.sample_id.expect("per record")).collect();
    listed.sort_unstable();
    failed.sort_unstable();
    assert_eq!(listed, failed, "verify lists exactly the records a read rejects");
    ds.len() as usize - failed.len()
}

/// How many records of the valid shard read back through the whole harness path (all of them,
/// unless the harness itself stopped reaching the reads).
pub fn valid_shard_reads() -> usize {
    let o = original();
    check_shard(&o.bytes, Some(o))
}

/// Arbitrary bytes as a shard file.
pub fn shard_bytes(data: &[u8]) {
    check_shard(data, None);
}

/// Arbitrary bytes between a valid header and schema and the footer magic (so the fuzzer reaches
/// the footer and index checks without having to guess the schema CRC or the magics): `data` is the
/// records, the index and the first 32 bytes of the footer; the checksums are then made consistent.
pub fn shard_after_header(data: &[u8]) {
    let o = original();
    let head = 32 + u32::from_le_bytes(o.bytes[12..16].try_into().unwrap()) as usize;
    let mut b = o.bytes[..head].to_vec();
    b.extend_from_slice(data);
    b.extend_from_slice(b"EIOINDX\0");
    fix_checksums(&mut b); // so index entries reach their bounds checks
    check_shard(&b, None);
}

/// A mutation script applied to the valid shard. `data[0]`: bit 0 set = recompute every CRC
/// afterwards (so corrupted records, indexes and schemas reach their parsers instead of failing
/// their checksums); bits 1-2: 1 = truncate at the next u16, 2 = append the rest of the script
/// bytes. Then (u16 offset, u8 xor) triples.
pub fn mutated_shard(data: &[u8]) {
    let o = original();
    let Some((&mode, script)) = data.split_first() else {
        check_shard(&o.bytes, Some(o));
        return;
    };
    let mut b = o.bytes.clone();
    for t in script.chunks_exact(3) {
        let at = u16::from_le_bytes([t[0], t[1]]) as usize % b.len();
        b[at] ^= t[2].max(1);
    }
    match (mode >> 1) & 3 {
        1 if script.len() >= 2 => {
            let cut = u16::from_le_bytes([script[0], script[1]]) as usize % (b.len() + 1);
            b.truncate(cut);
        }
        2 => b.extend_from_slice(script),
        _ => {}
    }
    let fixup = mode & 1 == 1;
    if fixup {
        fix_checksums(&mut b);
    }
    let untouched_size = b.len() == o.bytes.len();
    // Without fix-up the checksums stand: a read either fails or returns the original sample.
    check_shard(&b, (!fixup && untouched_size).then_some(o));
}

/// Recomputes the schema CRC, every record CRC the index can locate, and the index CRC.
fn fix_checksums(b: &mut [u8]) {
    if b.len() < 72 {
        return;
    }
    let schema_len = u32::from_le_bytes(b[12..16].try_into().unwrap()) as usize;
    if let Some(s) = b.get(32..32usize.saturating_add(schema_len)) {
        let crc = crc32fast::hash(s);
        b[16..20].copy_from_slice(&crc.to_le_bytes());
    }
    let footer = b.len() - 40;
    let (Some(io), Some(il), Some(n)) = (u64_at(b, footer), u64_at(b, footer + 8), u64_at(b, footer + 16)) else {
        return;
    };
    let (io, il) = (io as usize, il as usize);
    if io.checked_add(il) != Some(footer) || n.saturating_mul(40) > il as u64 {
        return;
    }
    for i in 0..n as usize {
        let e = io + i * 40;
        let (off, len) = (u64_at(b, e + 8).unwrap() as usize, u64_at(b, e + 16).unwrap() as usize);
        if let Some(rec) = off.checked_add(len).and_then(|end| b.get(off..end)) {
            let crc = crc32fast::hash(rec);
            b[e + 32..e + 36].copy_from_slice(&crc.to_le_bytes());
        }
    }
    let crc = crc32fast::hash(&b[io..io + il]);
    b[footer + 24..footer + 28].copy_from_slice(&crc.to_le_bytes());
}

// ------------------------------------------------------------------------------------------------
// Records and chunks, straight into their parsers

/// `data[0..2]`: token count (u16), then the record bytes, parsed against the original's schema;
/// every chunk of a record that parses is decoded.
pub fn record_bytes(data: &[u8]) {
    if data.len() < 2 {
        return;
    }
    let schema = &original().schema;
    let n_tokens = u16::from_le_bytes([data[0], data[1]]) as u64;
    let rec = &data[2..];
    let sample_id = rec.get(8..16).map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()));
    let (parsed, grew) = peak_during(|| {
        timed("record parse", || {
            record::parse(rec, schema, FORMAT_VERSION, sample_id, n_tokens)
        })
    });
    assert!(
        grew <= 4 * rec.len() + SLACK,
        "parsing a {}-byte record allocated {grew}",
        rec.len()
    );
    let Ok(layout) = parsed else { return };
    for (chunks, spec) in layout.tensors.iter().zip(&schema.tensors) {
        let rb = spec.row_bytes() as usize;
        let mut rows = 0u64;
        for c in chunks {
            assert_eq!(c.row_start, rows, "chunks cover rows in order");
            rows += c.desc.rows as u64;
            let payload = &rec[c.payload_start..c.payload_start + c.desc.stored_len() as usize];
            let mut out = vec![0u8; c.desc.rows as usize * rb];
            let _ = timed("chunk decode", || decode_chunk(&c.desc, payload, &mut out));
        }
        assert_eq!(rows, n_tokens);
    }
}

/// `data[0..24]`: a chunk descriptor, `data[24..26]`: decoded size (u16), the rest the payload.
pub fn chunk_bytes(data: &[u8]) {
    if data.len() < CHUNK_DESC_BYTES + 2 {
        return;
    }
    let Ok(desc) = ChunkDesc::from_bytes(data[..CHUNK_DESC_BYTES].try_into().unwrap()) else {
        return;
    };
    let out_len = u16::from_le_bytes([data[24], data[25]]) as usize;
    let payload = &data[26..];
    let mut out = vec![0u8; out_len];
    let (res, grew) = peak_during(|| timed("chunk decode", || decode_chunk(&desc, payload, &mut out)));
    assert!(
        grew <= 2 * out_len + SLACK,
        "decoding a chunk into {out_len} bytes allocated {grew}"
    );
    if res.is_ok() && desc.codec == 0 {
        assert_eq!(&out[..], payload, "a RAW chunk is its payload");
    }
}

// ------------------------------------------------------------------------------------------------
// Manifests

/// A valid manifest listing the original shard (copied into `shards/orig.eio`).
pub fn original_manifest_text() -> &'static Vec<u8> {
    static TEXT: OnceLock<Vec<u8>> = OnceLock::new();
    TEXT.get_or_init(|| {
        let o = original();
        let path = put("shards/orig.eio", &o.bytes);
        let shard = ShardFile::open(&path).unwrap();
        std::fs::read(manifest_for(&shard, "orig.eio")).unwrap()
    })
}

fn check_manifest(bytes: &[u8]) {
    original_manifest_text(); // the shard it may list exists
    let path = put("fuzz-manifest.json", bytes);
    let (loaded, grew) = peak_during(|| timed("manifest load", || Manifest::load(&path)));
    assert!(
        grew <= 64 * bytes.len() + SLACK,
        "loading a {}-byte manifest allocated {grew} bytes",
        bytes.len()
    );
    match loaded {
        Err(e) => allowed(&e, &path),
        Ok(m) => {
            let again = serde_json::to_vec(&m).unwrap();
            let back: Manifest = serde_json::from_slice(&again).unwrap();
            assert_eq!(back, m, "a loaded manifest serialises back to itself");
            match timed("dataset open", || Dataset::open(&path, 1)) {
                Ok(ds) => {
                    for pos in 0..ds.len() {
                        let _ = timed("read", || ds.read(pos));
                    }
                }
                Err(Error::Io { .. }) => {} // a listed shard that does not exist
                Err(Error::Corrupt { path: p, .. }) | Err(Error::FormatVersion { path: p, .. }) => {
                    assert!(p == path || p.starts_with(work_dir()), "error names {p:?}")
                }
                Err(other) => panic!("unexpected error {other:?}"),
            }
        }
    }
}

/// Arbitrary bytes as a manifest.
pub fn manifest_bytes(data: &[u8]) {
    check_manifest(data);
}

/// (u16 offset, u8 xor) triples applied to a valid manifest's JSON text; resealed when the first
/// byte is odd, so the field parsers past the checksum are fuzzed too.
pub fn mutated_manifest(data: &[u8]) {
    let mut b = original_manifest_text().clone();
    for t in data.chunks_exact(3) {
        let at = u16::from_le_bytes([t[0], t[1]]) as usize % b.len();
        b[at] ^= t[2].max(1);
    }
    if data.first().is_some_and(|x| x & 1 == 1) {
        reseal(&mut b);
    }
    check_manifest(&b);
}

/// Zeroes the last `"crc32:XXXXXXXX"` string's digits and seals again (a crafted manifest).
fn reseal(b: &mut [u8]) {
    let quoted = |w: &[u8]| w.starts_with(b"\"crc32:") && w[15] == b'"';
    if let Some(at) = b.windows(16).rposition(quoted) {
        b[at + 7..at + 15].copy_from_slice(b"00000000");
        assert!(seal_manifest(b));
    }
}
