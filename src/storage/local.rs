//! A local file, mapped read-only into memory when the system allows it, so that records are
//! checksummed and decoded where they lie in the page cache, with no copy; positioned reads
//! (`pread`, which share no file position) for the header, footer and index, and for every
//! read when the file cannot be mapped. One open file serves every thread and forked process.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::ByteSource;
use crate::error::{Error, Result};

pub struct LocalFile {
    path: PathBuf,
    file: File,
    len: u64,
    map: Option<Mmap>,
}

impl LocalFile {
    pub fn open(path: &Path) -> Result<LocalFile> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        // SAFETY: the mapping is read-only (shared with the page cache); Rust's aliasing rules only
        // hold while nobody rewrites or truncates the file under it. eagle-io never does that to a
        // file it reads: a shard (or a cached copy) is written under a temporary name, fsynced and
        // renamed into place, and later only unlinked, which leaves a mapping intact
        // (docs/FORMAT.md section 1). A file truncated in place by another program while mapped
        // ends the process with SIGBUS, as with `torch.load(mmap=True)` or safetensors; a file the
        // system cannot map (an empty file, some network file systems) is read with `pread`.
        let map = (len > 0).then(|| unsafe { Mmap::map(&file) }.ok()).flatten();
        Ok(LocalFile {
            path: path.to_owned(),
            file,
            len,
            map,
        })
    }
}

impl ByteSource for LocalFile {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| Error::io(&self.path, e))
    }

    fn mapped(&self) -> Option<&[u8]> {
        self.map.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_mapped_and_reads_the_same_either_way() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"0123456789").unwrap();
        let f = LocalFile::open(&path).unwrap();
        let mut buf = [0u8; 4];
        f.read_at(&mut buf, 3).unwrap();
        assert_eq!((f.mapped(), &buf), (Some(&b"0123456789"[..]), b"3456"));
        // Unlinking a mapped file leaves the mapping intact.
        std::fs::remove_file(&path).unwrap();
        assert_eq!(&f.mapped().unwrap()[8..], b"89");
    }

    #[test]
    fn an_empty_file_is_not_mapped_and_a_read_past_the_end_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("empty");
        std::fs::write(&path, b"").unwrap();
        let f = LocalFile::open(&path).unwrap();
        assert!(f.mapped().is_none());
        let err = f.read_at(&mut [0u8; 1], 0).unwrap_err().to_string();
        assert!(err.contains("empty"), "{err}");
    }
}
