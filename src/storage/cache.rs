//! The optional local read-through cache of shard objects (`cache_dir=`, docs/STORAGE.md). A
//! shard is cached whole: the first record read after open downloads the object (ranged GETs of
//! `part_bytes`, `in_flight` at once) into a temporary name, fsyncs and renames it
//! (`layout::cache_entry`), evicting the least recently used entries first so the cache stays
//! under its cap; later reads are positioned reads of the copy. An entry is used only when its
//! size equals the manifest's; its header, footer and index are then checked against the
//! manifest like any shard, and every record against its checksum: a copy failing any of these
//! is deleted and the object read again (counted as `refetched`). A shard larger than the cap
//! is read from the store (counted as `too_big`). A copy is mapped like a local shard
//! (`LocalFile`): its records are checked and decoded where they lie in the page cache.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{OnceLock, RwLock};
use std::time::SystemTime;

use super::fetch::{FetchOptions, Fetcher};
use super::local::LocalFile;
use super::remote::RemoteObject;
use super::ByteSource;
use crate::error::{Error, Result};
use crate::layout;

/// Default cap of a cache directory's size.
pub const DEFAULT_CACHE_BYTES: u64 = 64 << 30;
/// Bytes downloaded between two writes to the cache file while filling it.
const FILL_STEP: u64 = 64 << 20;

/// A cache directory and its cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheOptions {
    pub dir: PathBuf,
    /// Most bytes of entries kept in `dir` (temporary files of fills in progress aside).
    pub max_bytes: u64,
}

static HITS: AtomicU64 = AtomicU64::new(0);
static FILLS: AtomicU64 = AtomicU64::new(0);
static EVICTED: AtomicU64 = AtomicU64::new(0);
static REFETCHED: AtomicU64 = AtomicU64::new(0);
static TOO_BIG: AtomicU64 = AtomicU64::new(0);

/// This process's cache counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheStats {
    /// Shards opened from a cached copy.
    pub hits: u64,
    /// Shards downloaded into the cache.
    pub fills: u64,
    /// Entries deleted to stay under the cap (least recently used first).
    pub evicted: u64,
    /// Cached copies that failed a check (size, index, a record's checksum), deleted and read again
    /// from the store.
    pub refetched: u64,
    /// Shards larger than the cap, read from the store uncached.
    pub too_big: u64,
}

pub fn stats() -> CacheStats {
    CacheStats {
        hits: HITS.load(Ordering::Relaxed),
        fills: FILLS.load(Ordering::Relaxed),
        evicted: EVICTED.load(Ordering::Relaxed),
        refetched: REFETCHED.load(Ordering::Relaxed),
        too_big: TOO_BIG.load(Ordering::Relaxed),
    }
}

enum State {
    /// Being opened (header, footer, index): reads go to the store, from what opening prefetched.
    Opening,
    /// Opened, not cached yet: the next read fills the cache.
    Unfilled,
    /// Read from its cached copy (`CachedObject::copy`).
    Local,
    /// Read from the store (too big for the cache, or its copy failed a check).
    Remote,
}

/// A shard object behind a local cached copy.
pub struct CachedObject {
    remote: RemoteObject,
    entry: PathBuf,
    cache: CacheOptions,
    fetch: FetchOptions,
    state: RwLock<State>,
    /// The cached copy, once opened or filled (set once). It outlives a `drop_copy`, so a record
    /// slice `mapped` handed out stays valid: the file is unlinked, its mapping is not.
    copy: OnceLock<LocalFile>,
}

impl CachedObject {
    /// The object at `path` (a URL) of `len` bytes (the manifest's size), from its cached copy
    /// when one of that size is there (no request), else from the store.
    pub fn open(path: &Path, cache: &CacheOptions, len: u64, fetch: FetchOptions) -> Result<CachedObject> {
        let entry = layout::cache_entry(&cache.dir, &path.to_string_lossy())?;
        let cached = fs::metadata(&entry).is_ok_and(|m| m.len() == len);
        let (remote, state, copy) = match cached {
            true => {
                touch(&entry);
                HITS.fetch_add(1, Ordering::Relaxed);
                let copy = OnceLock::from(LocalFile::open(&entry)?);
                (RemoteObject::sized(path, len)?, State::Local, copy)
            }
            false => (RemoteObject::open(path)?, State::Opening, OnceLock::new()),
        };
        Ok(CachedObject {
            remote,
            entry,
            cache: cache.clone(),
            fetch,
            state: RwLock::new(state),
            copy,
        })
    }

    /// Whether this object is read from a cached copy.
    pub fn is_cached(&self) -> bool {
        matches!(*self.state.read().unwrap_or_else(|p| p.into_inner()), State::Local)
    }

    /// Downloads the object into the cache (see the module doc); the state to read from next.
    fn fill(&self) -> Result<State> {
        let len = self.remote.len();
        if len > self.cache.max_bytes {
            TOO_BIG.fetch_add(1, Ordering::Relaxed);
            return Ok(State::Remote);
        }
        make_room(&self.cache, len)?;
        let dir = self.entry.parent().expect("an entry is inside the cache directory");
        fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let tmp = layout::cache_temp_path(&self.entry, std::process::id());
        let fetcher = Fetcher::new(self.fetch)?;
        let written = (|| -> Result<()> {
            let mut file = File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
            let mut at = 0;
            while at < len {
                let n = FILL_STEP.min(len - at);
                let bytes = fetcher
                    .fetch(&[(&self.remote, at, n)])
                    .pop()
                    .expect("one request, one result")?;
                file.write_all(&bytes).map_err(|e| Error::io(&tmp, e))?;
                at += n;
            }
            file.sync_all().map_err(|e| Error::io(&tmp, e))?;
            layout::commit_rename(&tmp, &self.entry)
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        FILLS.fetch_add(1, Ordering::Relaxed);
        // Only an `Unfilled` object fills, and only one not opened from a copy is ever `Unfilled`:
        // the cell is empty here.
        let _ = self.copy.set(LocalFile::open(&self.entry)?);
        Ok(State::Local)
    }
}

impl ByteSource for CachedObject {
    fn len(&self) -> u64 {
        self.remote.len()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        {
            let state = self.state.read().unwrap_or_else(|p| p.into_inner());
            match &*state {
                State::Local => {
                    return self
                        .copy
                        .get()
                        .expect("a Local state has its copy")
                        .read_at(buf, offset)
                }
                State::Opening | State::Remote => return self.remote.read_at(buf, offset),
                State::Unfilled => {}
            }
        }
        {
            let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
            if matches!(*state, State::Unfilled) {
                *state = self.fill()?;
            }
        }
        self.read_at(buf, offset)
    }

    fn mapped(&self) -> Option<&[u8]> {
        let local = matches!(*self.state.read().unwrap_or_else(|p| p.into_inner()), State::Local);
        local.then(|| self.copy.get()).flatten().and_then(ByteSource::mapped)
    }

    fn forget_prefetch(&self) {
        self.remote.forget_prefetch();
        let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
        if matches!(*state, State::Opening) {
            *state = State::Unfilled;
        }
    }

    fn drop_copy(&self) -> bool {
        let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
        if !matches!(*state, State::Local) {
            return false;
        }
        let _ = fs::remove_file(&self.entry);
        REFETCHED.fetch_add(1, Ordering::Relaxed);
        *state = State::Remote;
        true
    }
}

/// Deletes the cached copy of `path` (it failed a check at open), so that it is read again.
pub fn discard(path: &Path, cache: &CacheOptions) -> Result<()> {
    let entry = layout::cache_entry(&cache.dir, &path.to_string_lossy())?;
    match fs::remove_file(&entry) {
        Ok(()) => {
            REFETCHED.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(&entry, e)),
    }
}

/// Marks an entry as just used (its mtime orders the eviction).
fn touch(entry: &Path) {
    if let Ok(f) = File::options().write(true).open(entry) {
        let _ = f.set_modified(SystemTime::now());
    }
}

/// Deletes the least recently used entries of `cache` until `need` more bytes fit under its cap.
fn make_room(cache: &CacheOptions, need: u64) -> Result<()> {
    let mut entries = Vec::new();
    let mut dirs = vec![cache.dir.clone()];
    while let Some(dir) = dirs.pop() {
        let Ok(list) = fs::read_dir(&dir) else { continue };
        for item in list.flatten() {
            let Ok(meta) = item.metadata() else { continue };
            if meta.is_dir() {
                dirs.push(item.path());
            } else if !layout::is_temp_name(&item.file_name().to_string_lossy()) {
                let used = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                entries.push((used, meta.len(), item.path()));
            }
        }
    }
    let mut total: u64 = entries.iter().map(|e| e.1).sum();
    entries.sort();
    for (_, size, path) in entries {
        if total + need <= cache.max_bytes {
            break;
        }
        match fs::remove_file(&path) {
            Ok(()) => EVICTED.fetch_add(1, Ordering::Relaxed),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0, // another process evicted it
            Err(e) => return Err(Error::io(&path, e)),
        };
        total -= size;
    }
    Ok(())
}
