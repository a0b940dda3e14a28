//! The dataset manifest (`manifest.json` by default): what every consumer needs to know
//! without opening a shard, and the list of committed shards.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::format::FORMAT_VERSION;
use crate::fsutil;
use crate::schema::Schema;
use crate::shard::ShardSummary;

/// The `format` field of every manifest.
pub const MANIFEST_FORMAT: &str = "eagle-io/dataset";

/// Encoding settings of the writer, recorded for information (each chunk records what
/// decoding needs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CodecInfo {
    pub zstd_level: i32,
    pub chunk_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub format_version: u32,
    /// `eagle-io X.Y.Z` of the writer.
    pub writer: String,
    pub schema: Schema,
    /// Caller metadata (target model, layer ids and their convention, tokenizer, ...).
    pub metadata: serde_json::Value,
    pub codec: CodecInfo,
    /// Committed shards, in commit order.
    pub shards: Vec<ShardSummary>,
    /// True once the writer was closed cleanly; false while writing or after a crash.
    pub complete: bool,
}

impl Manifest {
    /// Reads and checks a manifest file (format name, version).
    pub fn load(path: &Path) -> Result<Manifest> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let value: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
            Error::corrupt(
                path,
                None,
                byte_offset(&bytes, e.line(), e.column()),
                format!("manifest JSON ({e})"),
            )
        })?;
        if value.get("format").and_then(|f| f.as_str()) != Some(MANIFEST_FORMAT) {
            return Err(Error::corrupt(
                path,
                None,
                0,
                format!("manifest (`format` is not {MANIFEST_FORMAT:?})"),
            ));
        }
        let version = value.get("format_version").and_then(|v| v.as_u64()).unwrap_or(0);
        if version == 0 {
            return Err(Error::corrupt(
                path,
                None,
                0,
                "manifest (`format_version` is not a positive integer)",
            ));
        }
        if version > FORMAT_VERSION as u64 {
            return Err(Error::FormatVersion {
                path: path.to_owned(),
                found: version.min(u32::MAX as u64) as u32,
                supported: FORMAT_VERSION,
            });
        }
        let manifest: Manifest = serde_json::from_value(value)
            .map_err(|e| Error::corrupt(path, None, 0, format!("manifest fields ({e})")))?;
        Schema::new(manifest.schema.tensors.clone())
            .map_err(|e| Error::corrupt(path, None, 0, format!("manifest schema ({e})")))?;
        Ok(manifest)
    }

    /// Writes the manifest atomically (temp name, fsync, rename, directory fsync).
    pub fn store(&self, path: &Path) -> Result<()> {
        let mut json = serde_json::to_vec_pretty(self).expect("a manifest always serialises");
        json.push(b'\n');
        fsutil::write_atomic(path, &json)
    }

    /// Resolves a shard's path relative to the manifest's directory.
    pub fn shard_path(manifest_path: &Path, shard: &ShardSummary) -> PathBuf {
        manifest_path.parent().unwrap_or(Path::new(".")).join(&shard.file)
    }
}

/// Byte offset of a 1-based (line, column) position, for error messages.
fn byte_offset(bytes: &[u8], line: usize, column: usize) -> u64 {
    let line_start: usize = bytes
        .split(|&b| b == b'\n')
        .take(line.saturating_sub(1))
        .map(|l| l.len() + 1)
        .sum();
    (line_start + column.saturating_sub(1)) as u64
}
