//! Durable file operations: every commit is "write a temp name, fsync, rename, fsync the
//! directory", so a crash leaves either the old file or the new one, never a torn one.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The temporary name a file is written under before its atomic rename: `.NAME.tmp` in
/// the same directory (same filesystem, so the rename is atomic).
pub fn temp_path(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp"))
}

/// fsyncs a directory so a rename inside it survives a crash.
pub fn fsync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, e))
}

/// Renames the fsynced `tmp` over `path` and fsyncs the directory.
pub fn commit_rename(tmp: &Path, path: &Path) -> Result<()> {
    fs::rename(tmp, path).map_err(|e| Error::io(path, e))?;
    fsync_dir(path.parent().unwrap_or(Path::new(".")))
}

/// Writes `bytes` to `path` atomically.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = temp_path(path);
    let mut f = File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| Error::io(&tmp, e))?;
    commit_rename(&tmp, path)
}
