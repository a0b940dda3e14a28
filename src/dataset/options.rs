//! The writer's options and their defaults, on their own so the writer and resume both depend
//! on them rather than on each other.

use crate::codec::CodecOptions;
use crate::layout;
use crate::storage::{CacheOptions, FetchOptions};

/// Writer settings. `Default` gives 1 GiB shards of 1 MiB chunks, the codec's default (zstd
/// level -1000 with Huffman literals), one encoding thread per CPU and 64 records in flight:
/// the defaults of every eagle-io entry point (exported to Python as `_native.DEFAULTS`).
#[derive(Debug, Clone)]
pub struct WriterOptions {
    /// A shard is committed once it reaches this many bytes.
    pub shard_bytes: u64,
    /// Target decoded bytes per chunk (whole rows; at least one row, and at least 64 unquantised rows
    /// of 16 KiB or more: `writer.rs`, `chunk_rows`).
    pub chunk_bytes: u64,
    /// Encoding threads (0 = one per CPU).
    pub threads: usize,
    pub codec: CodecOptions,
    /// Encoded records waiting for the I/O thread before `write_batch` blocks.
    pub queue_depth: usize,
    /// Shard file names are `shards/{prefix}{seq:06}.eio` (e.g. prefix `r00003-` for rank 3).
    pub shard_prefix: String,
    /// The writer's rank among the writers of one root: the prefix records it numbers itself take
    /// ids from `rank * PREFIX_IDS_PER_RANK` on (`writer.rs`), apart from every other rank's.
    pub rank: u64,
    /// Manifest file name in the root (one per writer when several share a root).
    pub manifest_name: String,
    /// Continue an existing dataset instead of refusing to touch it.
    pub resume: bool,
    /// The object prefix (`s3://bucket/run`) this root's committed shards are uploaded to: on
    /// resume, a listed shard whose local copy was removed after its upload is read from there.
    pub uploaded_to: Option<std::path::PathBuf>,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            shard_bytes: 1 << 30,
            chunk_bytes: 1 << 20,
            threads: 0,
            codec: CodecOptions::default(),
            queue_depth: 64,
            shard_prefix: layout::shard_prefix(0),
            rank: 0,
            manifest_name: layout::MANIFEST_NAME.into(),
            resume: false,
            uploaded_to: None,
        }
    }
}

/// Reader settings. `Default` gives one decode thread per CPU and the object-storage fetch
/// defaults of [`FetchOptions`] (exported to Python as `_native.DEFAULTS`).
#[derive(Debug, Clone, Default)]
pub struct ReadOptions {
    /// Decode threads per read (0 = one per CPU).
    pub threads: usize,
    /// How records are fetched from object storage (ignored for local files).
    pub fetch: FetchOptions,
    /// A local read-through cache of the shard objects (ignored for local files).
    pub cache: Option<CacheOptions>,
}
