//! Where a dataset's files live and how they are written (docs/FORMAT.md section 1): the file
//! names, the writer's lock, and durable writes. Every commit is "write a temp name, fsync,
//! rename, fsync the directory", so a crash leaves either the old file or the new one, never a
//! torn one. The Python package takes the same names from here (`_native.LAYOUT`, read by
//! `eagle_io.store.layout`).

use std::fs::{self, File};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The manifest of a dataset written by one writer.
pub const MANIFEST_NAME: &str = "manifest.json";
/// Folder of the shard files, relative to the dataset root.
pub const SHARD_DIR: &str = "shards";
/// Extension of a committed shard file.
pub const SHARD_SUFFIX: &str = ".eio";
/// Digits of a rank in file names (`r00003-`, `manifest.r00003.json`).
pub const RANK_DIGITS: usize = 5;
/// Digits of a shard's sequence number (`r00003-000012.eio`).
pub const SEQ_DIGITS: usize = 6;

/// The manifest name of writer `rank` of `world_size`: `manifest.json` alone, else
/// `manifest.rNNNNN.json`, so ranks sharing a root never collide.
pub fn manifest_name(rank: u32, world_size: u32) -> String {
    if world_size <= 1 {
        MANIFEST_NAME.to_owned()
    } else {
        format!("manifest.r{rank:0RANK_DIGITS$}.json")
    }
}

/// The shard-name prefix of writer `rank`: `rNNNNN-`.
pub fn shard_prefix(rank: u32) -> String {
    format!("r{rank:0RANK_DIGITS$}-")
}

/// A shard's file name: `{prefix}{seq:06}.eio`.
pub fn shard_name(prefix: &str, seq: u64) -> String {
    format!("{prefix}{seq:0SEQ_DIGITS$}{SHARD_SUFFIX}")
}

/// The sequence number of a committed shard named `{prefix}NNNNNN.eio`.
pub fn shard_seq(name: &str, prefix: &str) -> Option<u64> {
    name.strip_prefix(prefix)?.strip_suffix(SHARD_SUFFIX)?.parse().ok()
}

/// Whether `name` is the temporary name of a shard of `prefix` being written (`.{prefix}NNNNNN.eio.tmp`).
pub fn is_shard_temp(name: &str, prefix: &str) -> bool {
    name.strip_prefix(TEMP_PREFIX)
        .and_then(|n| n.strip_suffix(TEMP_SUFFIX))
        .is_some_and(|n| n.starts_with(prefix) && n.ends_with(SHARD_SUFFIX))
}

/// The writer lock of the manifest `manifest_name`: `.{manifest_name}.lock` in the root.
pub fn lock_name(manifest_name: &str) -> String {
    format!(".{manifest_name}.lock")
}

/// Takes the exclusive advisory lock (flock) of the writer of `manifest_name` in `root`; the
/// kernel releases it when the returned file is closed or the process ends, so a crashed writer
/// never blocks a resume.
pub fn lock_root(root: &Path, manifest_name: &str) -> Result<File> {
    let path = root.join(lock_name(manifest_name));
    let file = File::create(&path).map_err(|e| Error::io(&path, e))?;
    // SAFETY: `file` is an open descriptor for the duration of the call; flock only reads it.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        return Err(Error::InvalidArgument(format!(
            "{}: another writer is writing {manifest_name} in this directory (use a distinct rank / manifest name)",
            root.display()
        )));
    }
    Ok(file)
}

/// A prefix shard is named `{shard_prefix}{PREFIX_SHARD_INFIX}NNNNNN.eio` (one prefix record each;
/// not a shard of the sample sequence, so resume neither adopts nor numbers after it).
pub const PREFIX_SHARD_INFIX: &str = "prefix-";

/// A file being written is named `{TEMP_PREFIX}{name}{TEMP_SUFFIX}` until its atomic rename.
pub const TEMP_PREFIX: &str = ".";
/// See [`TEMP_PREFIX`].
pub const TEMP_SUFFIX: &str = ".tmp";

/// The temporary name a file is written under before its atomic rename: `.NAME.tmp` in
/// the same directory (same filesystem, so the rename is atomic).
pub fn temp_path(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
    path.with_file_name(format!("{TEMP_PREFIX}{name}{TEMP_SUFFIX}"))
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

/// Writes `bytes` to `path` atomically. The new file keeps the permissions of the regular file
/// it replaces (as `eagle_io.store.layout.atomic_file` does), else gets those of a plain
/// create (`0o666 & ~umask`).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = temp_path(path);
    let keep_mode = fs::metadata(path).ok().filter(|m| m.is_file()).map(|m| m.permissions());
    // A stale entry at the temp name (a crashed writer's, or a link) is removed, and the temp file
    // is created anew (O_CREAT | O_EXCL): a link there is never written through.
    match fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(Error::io(&tmp, e)),
        _ => {}
    }
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(|e| Error::io(&tmp, e))?;
    let written = keep_mode
        .map_or(Ok(()), |mode| f.set_permissions(mode))
        .and_then(|_| f.write_all(bytes))
        .and_then(|_| f.sync_all());
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(Error::io(&tmp, e));
    }
    commit_rename(&tmp, path)
}

/// Where the read-through cache `dir` keeps its copy of the object `url` (`scheme://bucket/key`):
/// `dir/scheme/bucket/key`. A URL with an empty, `.` or `..` part has no place there.
pub fn cache_entry(dir: &Path, url: &str) -> Result<PathBuf> {
    let bad = || Error::InvalidArgument(format!("{url}: no cache entry for this URL (an empty, . or .. part)"));
    let (scheme, rest) = url.split_once("://").ok_or_else(bad)?;
    let mut path = dir.join(scheme);
    for part in rest.split('/') {
        if part.is_empty() || part == "." || part == ".." {
            return Err(bad());
        }
        path.push(part);
    }
    Ok(path)
}

/// The temporary name process `pid` downloads a cache entry under before its atomic rename
/// (`.NAME.PID.tmp`: processes filling the same entry never share one).
pub fn cache_temp_path(entry: &Path, pid: u32) -> PathBuf {
    let name = entry.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
    entry.with_file_name(format!("{TEMP_PREFIX}{name}.{pid}{TEMP_SUFFIX}"))
}

/// Whether `name` is a temporary name (of a file being written, or a cache entry being filled).
pub fn is_temp_name(name: &str) -> bool {
    name.starts_with(TEMP_PREFIX) && name.ends_with(TEMP_SUFFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_entries_mirror_the_url_and_refuse_dot_parts() {
        let dir = Path::new("/c");
        assert_eq!(
            cache_entry(dir, "s3://b/run/shards/r00000-000001.eio").unwrap(),
            Path::new("/c/s3/b/run/shards/r00000-000001.eio")
        );
        for bad in ["s3://b/../x.eio", "s3://b//x.eio", "s3://b/./x", "no-scheme"] {
            assert!(cache_entry(dir, bad).is_err(), "{bad}");
        }
        let tmp = cache_temp_path(Path::new("/c/s3/b/x.eio"), 42);
        assert_eq!(tmp, Path::new("/c/s3/b/.x.eio.42.tmp"));
        assert!(is_temp_name(&tmp.file_name().unwrap().to_string_lossy()) && !is_temp_name("x.eio"));
    }

    #[test]
    fn a_link_at_the_temp_name_is_never_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, b"precious").unwrap();
        let target = dir.path().join("manifest.json");
        std::os::unix::fs::symlink(&victim, temp_path(&target)).unwrap();
        write_atomic(&target, b"{}").unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"precious");
        assert_eq!(fs::read(&target).unwrap(), b"{}");
        assert!(!fs::symlink_metadata(&target).unwrap().file_type().is_symlink());
        assert!(!temp_path(&target).exists());
    }

    #[test]
    fn a_rewrite_keeps_the_replaced_files_mode() {
        use std::os::unix::fs::PermissionsExt;
        // The rewrite used to reset the mode to the umask default (the Python twin kept it).
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("manifest.json");
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        write_atomic(&target, b"{}").unwrap();
        let created = mode(&target);
        for kept in [0o640, 0o600, 0o664, 0o644].into_iter().filter(|&m| m != created) {
            fs::set_permissions(&target, fs::Permissions::from_mode(kept)).unwrap();
            write_atomic(&target, b"{\"a\": 1}").unwrap();
            assert_eq!(mode(&target), kept, "{kept:o}");
            assert_eq!(fs::read(&target).unwrap(), b"{\"a\": 1}");
        }
        let fresh = dir.path().join("other.json");
        write_atomic(&fresh, b"{}").unwrap();
        assert_eq!(mode(&fresh), created, "a new file gets the plain-create mode");
    }
}
