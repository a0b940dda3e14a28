//! Opening a committed shard: header, schema, footer and index are read and validated
//! (two small reads, no payload); records are read from a `storage::ByteSource`: a local file
//! with positioned reads (`pread`) or an object with ranged GETs.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::format::{
    Footer, Header, IndexEntry, FOOTER_BYTES, FORMAT_VERSION, HEADER_BYTES, INDEX_ENTRY_BYTES, MAX_SCHEMA_BYTES,
};
use crate::schema::Schema;
use crate::storage::{self, ByteSource};

/// zstd cannot expand a frame by more than this factor (an RLE block of 128 KiB is a few
/// bytes); a record claiming a larger decoded size is corrupt, and is refused before any
/// buffer of that size is allocated.
pub const MAX_EXPANSION: u64 = 40_000;

pub struct ShardFile {
    pub path: PathBuf,
    source: Box<dyn ByteSource>,
    pub schema: Schema,
    /// The header's format version (records of version 3 may reference a prefix record).
    pub version: u32,
    pub footer: Footer,
    pub file_len: u64,
    pub entries: Vec<IndexEntry>,
    key_starts: Vec<usize>,
    keys: Vec<u8>,
}

impl ShardFile {
    /// Opens and validates a shard. Errors name the file and the byte offset of what is wrong.
    pub fn open(path: &Path) -> Result<ShardFile> {
        Self::from_source(path, storage::open(path)?)
    }

    /// Opens and validates the shard `path` read from `source` (e.g. a cached copy).
    pub fn from_source(path: &Path, source: Box<dyn ByteSource>) -> Result<ShardFile> {
        let file_len = source.len();
        let corrupt = |offset: u64, what: String| Error::corrupt(path, None, offset, what);
        if file_len < HEADER_BYTES + FOOTER_BYTES {
            return Err(corrupt(
                0,
                format!("shard of {file_len} bytes (too short to be a shard)"),
            ));
        }
        let read = |offset: u64, len: u64| -> Result<Vec<u8>> {
            let mut buf = vec![0u8; len as usize];
            source.read_at(&mut buf, offset)?;
            Ok(buf)
        };
        let head = read(0, HEADER_BYTES)?;
        let header = Header::from_bytes(head.as_slice().try_into().unwrap()).map_err(|w| corrupt(0, w))?;
        if header.version > FORMAT_VERSION {
            return Err(Error::FormatVersion {
                path: path.to_owned(),
                found: header.version,
                supported: FORMAT_VERSION,
            });
        }
        if header.version == 0 {
            return Err(corrupt(8, "format version 0".into()));
        }
        let data_start = HEADER_BYTES + header.schema_len as u64;
        if header.schema_len > MAX_SCHEMA_BYTES || data_start + FOOTER_BYTES > file_len {
            return Err(corrupt(12, format!("schema length {}", header.schema_len)));
        }
        let schema_bytes = read(HEADER_BYTES, header.schema_len as u64)?;
        if crc32fast::hash(&schema_bytes) != header.schema_crc32 {
            return Err(corrupt(HEADER_BYTES, "schema (checksum mismatch)".into()));
        }
        let schema = Schema::from_json(&schema_bytes).map_err(|e| corrupt(HEADER_BYTES, format!("schema ({e})")))?;

        let footer_at = file_len - FOOTER_BYTES;
        let foot = read(footer_at, FOOTER_BYTES)?;
        let footer = Footer::from_bytes(foot.as_slice().try_into().unwrap()).map_err(|w| corrupt(footer_at, w))?;
        let index_fits = footer.index_offset >= data_start
            && footer.index_offset.checked_add(footer.index_len) == Some(footer_at)
            && footer
                .n_records
                .checked_mul(INDEX_ENTRY_BYTES)
                .is_some_and(|n| n <= footer.index_len);
        if !index_fits {
            return Err(corrupt(
                footer_at,
                format!(
                    "footer (index at {} of {} bytes, {} records)",
                    footer.index_offset, footer.index_len, footer.n_records
                ),
            ));
        }
        let index = read(footer.index_offset, footer.index_len)?;
        if crc32fast::hash(&index) != footer.index_crc32 {
            return Err(corrupt(footer.index_offset, "index (checksum mismatch)".into()));
        }
        let n = footer.n_records as usize;
        let entries: Vec<IndexEntry> = index[..n * INDEX_ENTRY_BYTES as usize]
            .chunks_exact(INDEX_ENTRY_BYTES as usize)
            .map(IndexEntry::from_bytes)
            .collect();
        let keys = index[n * INDEX_ENTRY_BYTES as usize..].to_vec();
        let token_bytes = schema.token_bytes().max(schema.stored_token_bytes());
        let mut key_starts = Vec::with_capacity(n);
        let (mut expect_offset, mut key_pos) = (data_start, 0usize);
        for (i, e) in entries.iter().enumerate() {
            let at = footer.index_offset + i as u64 * INDEX_ENTRY_BYTES;
            let bad = |what: &str| Error::corrupt(path, Some(e.sample_id), at, format!("index entry {i}: {what}"));
            if e.offset != expect_offset
                || e.offset
                    .checked_add(e.length)
                    .is_none_or(|end| end > footer.index_offset)
            {
                return Err(bad(&format!(
                    "record at {} of {} bytes (expected to start at {expect_offset})",
                    e.offset, e.length
                )));
            }
            let decoded = e.n_tokens.checked_mul(token_bytes);
            if decoded.is_none_or(|d| d > e.length.saturating_mul(MAX_EXPANSION)) {
                return Err(bad(&format!("{} tokens cannot fit in {} bytes", e.n_tokens, e.length)));
            }
            key_starts.push(key_pos);
            key_pos += e.key_len as usize;
            if key_pos > keys.len() || std::str::from_utf8(&keys[key_starts[i]..key_pos]).is_err() {
                return Err(bad("key out of bounds or not UTF-8"));
            }
            expect_offset = e.offset + e.length;
        }
        if expect_offset != footer.index_offset || key_pos != keys.len() {
            return Err(corrupt(
                footer.index_offset,
                "index (records or keys do not cover the shard)".into(),
            ));
        }
        source.forget_prefetch();
        Ok(ShardFile {
            path: path.to_owned(),
            source,
            schema,
            version: header.version,
            footer,
            file_len,
            entries,
            key_starts,
            keys,
        })
    }

    /// The key (source record id) of record `i`; empty when none was given.
    pub fn key(&self, i: usize) -> &str {
        let start = self.key_starts[i];
        let bytes = &self.keys[start..start + self.entries[i].key_len as usize];
        std::str::from_utf8(bytes).expect("validated at open")
    }

    /// The object behind this shard when it is read by ranged GETs (`None` for a file).
    pub fn remote(&self) -> Option<&storage::RemoteObject> {
        self.source.remote()
    }

    /// Record `i`'s bytes, checksum verified: where they lie in a mapped file, else read into the
    /// head of `buf`. `buf` only grows (zero-filled past its longest record so far), so a reused
    /// buffer is not zeroed again on every read.
    pub fn read_record<'a>(&'a self, i: usize, buf: &'a mut Vec<u8>) -> Result<&'a [u8]> {
        let e = &self.entries[i];
        let n = e.length as usize;
        if let Some(map) = self.source.mapped() {
            let rec = (e.offset as usize)
                .checked_add(n)
                .and_then(|end| map.get(e.offset as usize..end))
                .ok_or_else(|| {
                    Error::corrupt(
                        &self.path,
                        Some(e.sample_id),
                        e.offset,
                        "record (past the end of the file)",
                    )
                })?;
            match self.check_record(i, rec) {
                // A bad cached copy, now deleted: read the record from the store below.
                Err(_) if self.source.drop_copy() => {}
                checked => return checked.map(|()| rec),
            }
        }
        if buf.len() < n {
            buf.resize(n, 0);
        }
        let rec = &mut buf[..n];
        self.source.read_at(rec, e.offset)?;
        match self.check_record(i, rec) {
            Err(_) if self.source.drop_copy() => {
                // A bad cached copy, now deleted: read the record from the store.
                self.source.read_at(rec, e.offset)?;
                self.check_record(i, rec)?;
            }
            checked => checked?,
        }
        Ok(rec)
    }

    /// Verifies that `rec` holds record `i` (its length and checksum), e.g. bytes a batch fetched.
    pub fn check_record(&self, i: usize, rec: &[u8]) -> Result<()> {
        let e = &self.entries[i];
        if rec.len() as u64 != e.length || crc32fast::hash(rec) != e.crc32 {
            return Err(Error::corrupt(
                &self.path,
                Some(e.sample_id),
                e.offset,
                "record (checksum mismatch)",
            ));
        }
        Ok(())
    }
}
