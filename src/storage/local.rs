//! A local file read with positioned reads (`pread`), which share no file position, so one
//! open file serves every thread and forked process.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::ByteSource;
use crate::error::{Error, Result};

pub struct LocalFile {
    path: PathBuf,
    file: File,
    len: u64,
}

impl LocalFile {
    pub fn open(path: &Path) -> Result<LocalFile> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        Ok(LocalFile {
            path: path.to_owned(),
            file,
            len,
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
}
