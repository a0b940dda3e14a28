//! Writes one shard under its temporary name, then commits it: index, footer, fsync,
//! rename to the final name, fsync of the directory.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::format::{Footer, Header, IndexEntry, HEADER_BYTES};
use crate::layout;
use crate::schema::Schema;

/// What a committed shard holds; the manifest lists one per shard.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ShardSummary {
    /// Path relative to the dataset root, e.g. `shards/r00000-000000.eio`.
    pub file: String,
    pub samples: u64,
    pub tokens: u64,
    /// Size of the shard file.
    pub bytes: u64,
    /// Decoded size of all its tensors.
    pub raw_bytes: u64,
    /// CRC-32 of its index, also stored in its footer.
    pub index_crc32: u32,
}

pub struct ShardBuilder {
    path: PathBuf,
    tmp: PathBuf,
    out: BufWriter<File>,
    pos: u64,
    entries: Vec<IndexEntry>,
    keys: Vec<u8>,
    tokens: u64,
    raw_bytes: u64,
}

impl ShardBuilder {
    /// Creates `path`'s temporary file and writes the header (format `version`) and schema.
    pub fn create(path: &Path, schema: &Schema, version: u32) -> Result<ShardBuilder> {
        let tmp = layout::temp_path(path);
        let file = File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
        let schema_json = schema.to_json();
        let header = Header {
            version,
            schema_len: schema_json.len() as u32,
            schema_crc32: crc32fast::hash(schema_json.as_bytes()),
        };
        let mut b = ShardBuilder {
            path: path.to_owned(),
            tmp,
            out: BufWriter::with_capacity(1 << 20, file),
            pos: 0,
            entries: Vec::new(),
            keys: Vec::new(),
            tokens: 0,
            raw_bytes: 0,
        };
        b.write(&header.to_bytes())?;
        b.write(schema_json.as_bytes())?;
        debug_assert_eq!(b.pos, HEADER_BYTES + schema_json.len() as u64);
        Ok(b)
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.out.write_all(bytes).map_err(|e| Error::io(&self.tmp, e))?;
        self.pos += bytes.len() as u64;
        Ok(())
    }

    /// Bytes written so far (the shard's size before its index).
    pub fn len(&self) -> u64 {
        self.pos
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Appends one record made of `parts` (table, then payloads), checksumming as it goes.
    pub fn append(
        &mut self,
        sample_id: u64,
        key: &str,
        n_tokens: u64,
        raw_bytes: u64,
        parts: &[Vec<u8>],
    ) -> Result<()> {
        let offset = self.pos;
        let mut crc = crc32fast::Hasher::new();
        for p in parts {
            crc.update(p);
            self.write(p)?;
        }
        self.entries.push(IndexEntry {
            sample_id,
            offset,
            length: self.pos - offset,
            n_tokens,
            crc32: crc.finalize(),
            key_len: key.len() as u32,
        });
        self.keys.extend_from_slice(key.as_bytes());
        self.tokens += n_tokens;
        self.raw_bytes += raw_bytes;
        Ok(())
    }

    /// Writes index and footer, fsyncs, renames to the final name and fsyncs the directory.
    /// `root` is the dataset root the summary's path is relative to.
    pub fn commit(mut self, root: &Path) -> Result<ShardSummary> {
        let mut index: Vec<u8> = self.entries.iter().flat_map(|e| e.to_bytes()).collect();
        index.extend_from_slice(&self.keys);
        let footer = Footer {
            index_offset: self.pos,
            index_len: index.len() as u64,
            n_records: self.entries.len() as u64,
            index_crc32: crc32fast::hash(&index),
        };
        self.write(&index)?;
        self.write(&footer.to_bytes())?;
        let file = self
            .out
            .into_inner()
            .map_err(|e| Error::io(&self.tmp, e.into_error()))?;
        file.sync_all().map_err(|e| Error::io(&self.tmp, e))?;
        drop(file);
        layout::commit_rename(&self.tmp, &self.path)?;
        let rel = self.path.strip_prefix(root).unwrap_or(&self.path);
        Ok(ShardSummary {
            file: rel.to_string_lossy().into_owned(),
            samples: self.entries.len() as u64,
            tokens: self.tokens,
            bytes: self.pos,
            raw_bytes: self.raw_bytes,
            index_crc32: footer.index_crc32,
        })
    }
}
