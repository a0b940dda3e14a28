//! Where the bytes of a manifest or shard come from: a local file (mapped, or positioned reads)
//! or an object in an S3-compatible store (ranged GETs through the `object_store` crate, on a
//! tokio runtime owned by the core; see docs/STORAGE.md). A path whose text starts with
//! `SCHEME://` is an object URL (`s3://bucket/run/manifest.json`); anything else is a file.
//! URLs are carried in `PathBuf`s like file paths, so errors name them the same way.

mod body;
mod cache;
mod fetch;
mod local;
mod profile;
mod remote;
mod upload;

use std::path::{Path, PathBuf};

use crate::error::Result;

pub use cache::{
    discard as discard_cached, stats as cache_stats, CacheOptions, CacheStats, CachedObject, DEFAULT_CACHE_BYTES,
};
pub use fetch::{FetchOptions, Fetcher};
pub use remote::{list as list_objects, stats, RemoteObject, StorageStats};
pub use upload::{put_manifest, upload_dataset, UploadReport};

/// A read-only byte source of known length, shared by every reading thread.
pub trait ByteSource: Send + Sync {
    /// Size in bytes.
    fn len(&self) -> u64;

    /// Whether the source holds no byte.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Fills `buf` with the bytes at `offset..offset + buf.len()`; a source shorter than that
    /// is an error naming it (never a short or padded read).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()>;

    /// The whole source as one slice when it is mapped into memory (a local file): records are
    /// then checksummed and decoded where they lie, with no copy. `None`: read with
    /// [`ByteSource::read_at`].
    fn mapped(&self) -> Option<&[u8]> {
        None
    }

    /// Drops what opening prefetched (an object's first and last bytes); reads still work.
    fn forget_prefetch(&self) {}

    /// The object behind this source when its records are fetched by ranged GETs, which a
    /// batch read coalesces and runs concurrently ([`Fetcher`]); `None` for a file.
    fn remote(&self) -> Option<&RemoteObject> {
        None
    }

    /// Deletes a cached copy this source reads from (it failed a record's checksum) and reads
    /// from the store from now on; false when there is no such copy.
    fn drop_copy(&self) -> bool {
        false
    }
}

/// Whether `path` is an object URL (`scheme://...`) rather than a local path.
pub fn is_url(path: &Path) -> bool {
    path.to_str()
        .and_then(|s| s.split_once("://"))
        .is_some_and(|(scheme, _)| !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_alphanumeric()))
}

/// Opens the file or object at `path`. An object's size and its first and last bytes are
/// fetched now (one or two requests), so reading a shard's header, footer and index costs
/// no more requests.
pub fn open(path: &Path) -> Result<Box<dyn ByteSource>> {
    if is_url(path) {
        Ok(Box::new(remote::RemoteObject::open(path)?))
    } else {
        Ok(Box::new(local::LocalFile::open(path)?))
    }
}

/// The whole file or object at `path` (a manifest): one read, or one GET.
pub fn read_all(path: &Path) -> Result<Vec<u8>> {
    if is_url(path) {
        remote::get_all(path)
    } else {
        std::fs::read(path).map_err(|e| crate::error::Error::io(path, e))
    }
}

/// `path` itself when it names a file or a `.json` object, else `path/{name}` (a directory or
/// an object prefix).
pub fn resolve(path: &Path, name: &str) -> PathBuf {
    if is_url(path) {
        let text = path.to_string_lossy();
        if text.ends_with(".json") {
            path.to_owned()
        } else {
            PathBuf::from(format!("{}/{name}", text.trim_end_matches('/')))
        }
    } else if path.is_dir() {
        path.join(name)
    } else {
        path.to_owned()
    }
}
