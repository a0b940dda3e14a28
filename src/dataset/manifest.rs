//! The dataset manifest (`manifest.json` by default): what every consumer needs to know
//! without opening a shard, and the list of committed shards.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::format::{FORMAT_VERSION, PREFIX_VERSION};
use crate::layout;
use crate::schema::Schema;
use crate::shard::ShardSummary;

/// The `format` field of every manifest.
pub const MANIFEST_FORMAT: &str = "eagle-io/dataset";

/// The `checksum` member before sealing (FORMAT.md 5): its 8 hex digits are then replaced by
/// the CRC-32 of the whole file as written with them zeroed.
pub const UNSEALED_CHECKSUM: &str = "crc32:00000000";
const CHECKSUM_PREFIX: &str = "crc32:";

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
    /// Committed prefix shards (format version 3): each holds one prefix record, which samples
    /// reference instead of storing its rows (docs/FORMAT.md 4.7). Absent when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefixes: Vec<ShardSummary>,
    /// True once the writer was closed cleanly; false while writing or after a crash.
    pub complete: bool,
}

impl Manifest {
    /// Reads and checks a manifest file (format name, version).
    pub fn load(path: &Path) -> Result<Manifest> {
        Self::parse(path, &crate::storage::read_all(path)?)
    }

    /// Checks and parses the bytes of the manifest file or object at `path`.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<Manifest> {
        let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| {
            Error::corrupt(
                path,
                None,
                byte_offset(bytes, e.line(), e.column()),
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
        check_seal(path, bytes, &value)?;
        let manifest: Manifest = serde_json::from_value(value)
            .map_err(|e| Error::corrupt(path, None, 0, format!("manifest fields ({e})")))?;
        Schema::new(manifest.schema.tensors.clone())
            .map_err(|e| Error::corrupt(path, None, 0, format!("manifest schema ({e})")))?;
        // Version 3 is the version of datasets with prefix shards, and only of them (a writer writes the lowest
        // version that holds what it stores): either alone is damage.
        if manifest.prefixes.is_empty() == (manifest.format_version >= PREFIX_VERSION) {
            return Err(Error::corrupt(
                path,
                None,
                0,
                format!(
                    "manifest (format version {} with {} prefix shards; version {PREFIX_VERSION} is the version of \
                     datasets that list prefix shards)",
                    manifest.format_version,
                    manifest.prefixes.len()
                ),
            ));
        }
        Ok(manifest)
    }

    /// The manifest file's bytes: pretty JSON whose last member is the sealed `checksum`.
    pub fn to_sealed_bytes(&self) -> Vec<u8> {
        #[derive(Serialize)]
        struct Sealed<'a> {
            #[serde(flatten)]
            manifest: &'a Manifest,
            checksum: &'static str,
        }
        let sealed = Sealed {
            manifest: self,
            checksum: UNSEALED_CHECKSUM,
        };
        let mut json = serde_json::to_vec_pretty(&sealed).expect("a manifest always serialises");
        json.push(b'\n');
        assert!(seal(&mut json), "the checksum placeholder was just written");
        json
    }

    /// Writes the sealed manifest atomically (temp name, fsync, rename, directory fsync).
    pub fn store(&self, path: &Path) -> Result<()> {
        layout::write_atomic(path, &self.to_sealed_bytes())
    }

    /// Resolves a shard's path relative to the manifest's directory.
    pub fn shard_path(manifest_path: &Path, shard: &ShardSummary) -> PathBuf {
        manifest_path.parent().unwrap_or(Path::new(".")).join(&shard.file)
    }
}

/// Seals manifest JSON in place: the last `"crc32:00000000"` string gets the CRC-32 of `json`
/// as it is (with those zeros). Returns false, changing nothing, when there is no placeholder.
pub fn seal(json: &mut [u8]) -> bool {
    let Some(at) = rfind(json, format!("\"{UNSEALED_CHECKSUM}\"").as_bytes()) else {
        return false;
    };
    let digits = at + 1 + CHECKSUM_PREFIX.len();
    let crc = crc32fast::hash(json);
    json[digits..digits + 8].copy_from_slice(format!("{crc:08x}").as_bytes());
    true
}

/// Checks the `checksum` member (FORMAT.md 5) against the file's bytes.
fn check_seal(path: &Path, bytes: &[u8], value: &serde_json::Value) -> Result<()> {
    let refuse = |offset: usize, what: String| Err(Error::corrupt(path, None, offset as u64, what));
    let Some(stated) = value.get("checksum").and_then(|c| c.as_str()) else {
        return refuse(0, "manifest (no `checksum` member: damaged, or written by hand)".into());
    };
    let digits = stated
        .strip_prefix(CHECKSUM_PREFIX)
        .filter(|d| d.len() == 8 && d.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
    let Some(digits) = digits else {
        return refuse(
            0,
            format!("manifest (`checksum` {stated:?} is not \"crc32:\" and 8 lowercase hex digits)"),
        );
    };
    let Some(at) = rfind(bytes, format!("\"{stated}\"").as_bytes()) else {
        return refuse(
            0,
            "manifest (the `checksum` string is escaped, so it cannot be located)".into(),
        );
    };
    let start = at + 1 + CHECKSUM_PREFIX.len();
    let mut h = crc32fast::Hasher::new();
    h.update(&bytes[..start]);
    h.update(b"00000000");
    h.update(&bytes[start + 8..]);
    let actual = h.finalize();
    if format!("{actual:08x}") != digits {
        return refuse(
            start,
            format!(
                "manifest (checksum: the file hashes to crc32:{actual:08x} but says {stated}: it was damaged or \
                 edited after it was written)"
            ),
        );
    }
    Ok(())
}

fn rfind(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).rposition(|w| w == needle)
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
