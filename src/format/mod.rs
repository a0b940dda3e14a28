//! The shard file format, version 3 (reads 1 to 3), as bytes (docs/FORMAT.md is the specification; this
//! module and the pure-Python reference reader are two implementations of it).
//!
//! ```text
//! [header 32 B][schema JSON][record 0][record 1]...[index][footer 40 B]
//! ```
//! All integers are little-endian. Checksums are CRC-32 (IEEE 802.3, as zlib.crc32).

pub mod record;

/// First 8 bytes of every shard.
pub const SHARD_MAGIC: &[u8; 8] = b"EAGLEIO\0";
/// Last 8 bytes of every shard.
pub const FOOTER_MAGIC: &[u8; 8] = b"EIOINDX\0";
/// The newest format version this build reads, and what it writes for a dataset with shared-prefix
/// references (records that store a suffix and name a prefix record, docs/FORMAT.md 4.7).
pub const FORMAT_VERSION: u32 = 3;
/// What this build writes for a dataset without shared-prefix references: a version-2 reader reads it.
pub const PLAIN_VERSION: u32 = 2;
/// The first version whose records may reference a prefix record.
pub const PREFIX_VERSION: u32 = 3;
pub const HEADER_BYTES: u64 = 32;
pub const FOOTER_BYTES: u64 = 40;
pub const INDEX_ENTRY_BYTES: u64 = 40;
/// Longest sample key (the source record's id string) a record may carry.
pub const MAX_KEY_BYTES: usize = 1024;
/// Longest schema JSON a header may declare.
pub const MAX_SCHEMA_BYTES: u32 = 1 << 20;

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

/// The fixed part of the shard header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub version: u32,
    pub schema_len: u32,
    pub schema_crc32: u32,
}

impl Header {
    pub fn to_bytes(&self) -> [u8; HEADER_BYTES as usize] {
        let mut b = [0u8; HEADER_BYTES as usize];
        b[0..8].copy_from_slice(SHARD_MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&self.schema_len.to_le_bytes());
        b[16..20].copy_from_slice(&self.schema_crc32.to_le_bytes());
        b
    }

    /// Parses the header; the version is returned as read (the caller checks support).
    pub fn from_bytes(b: &[u8; HEADER_BYTES as usize]) -> Result<Header, String> {
        if &b[0..8] != SHARD_MAGIC {
            return Err("shard magic (not an eagle-io shard)".into());
        }
        if b[20..32].iter().any(|&x| x != 0) {
            return Err("shard header reserved bytes".into());
        }
        Ok(Header {
            version: u32_at(b, 8),
            schema_len: u32_at(b, 12),
            schema_crc32: u32_at(b, 16),
        })
    }
}

/// The fixed footer at the end of a shard; it locates the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footer {
    pub index_offset: u64,
    pub index_len: u64,
    pub n_records: u64,
    pub index_crc32: u32,
}

impl Footer {
    pub fn to_bytes(&self) -> [u8; FOOTER_BYTES as usize] {
        let mut b = [0u8; FOOTER_BYTES as usize];
        b[0..8].copy_from_slice(&self.index_offset.to_le_bytes());
        b[8..16].copy_from_slice(&self.index_len.to_le_bytes());
        b[16..24].copy_from_slice(&self.n_records.to_le_bytes());
        b[24..28].copy_from_slice(&self.index_crc32.to_le_bytes());
        b[32..40].copy_from_slice(FOOTER_MAGIC);
        b
    }

    pub fn from_bytes(b: &[u8; FOOTER_BYTES as usize]) -> Result<Footer, String> {
        if &b[32..40] != FOOTER_MAGIC {
            return Err("footer magic (shard not committed, or truncated)".into());
        }
        if u32_at(b, 28) != 0 {
            return Err("footer reserved bytes".into());
        }
        Ok(Footer {
            index_offset: u64_at(b, 0),
            index_len: u64_at(b, 8),
            n_records: u64_at(b, 16),
            index_crc32: u32_at(b, 24),
        })
    }
}

/// One record's entry in the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    /// The caller's id for the sample (e.g. the source dataset's record number).
    pub sample_id: u64,
    /// Byte offset of the record in the shard.
    pub offset: u64,
    /// Record length in bytes.
    pub length: u64,
    /// Tokens (`L`) in the sample.
    pub n_tokens: u64,
    /// CRC-32 of the record's `length` bytes.
    pub crc32: u32,
    /// Bytes of this record's key in the key blob.
    pub key_len: u32,
}

impl IndexEntry {
    pub fn to_bytes(&self) -> [u8; INDEX_ENTRY_BYTES as usize] {
        let mut b = [0u8; INDEX_ENTRY_BYTES as usize];
        b[0..8].copy_from_slice(&self.sample_id.to_le_bytes());
        b[8..16].copy_from_slice(&self.offset.to_le_bytes());
        b[16..24].copy_from_slice(&self.length.to_le_bytes());
        b[24..32].copy_from_slice(&self.n_tokens.to_le_bytes());
        b[32..36].copy_from_slice(&self.crc32.to_le_bytes());
        b[36..40].copy_from_slice(&self.key_len.to_le_bytes());
        b
    }

    pub fn from_bytes(b: &[u8]) -> IndexEntry {
        IndexEntry {
            sample_id: u64_at(b, 0),
            offset: u64_at(b, 8),
            length: u64_at(b, 16),
            n_tokens: u64_at(b, 24),
            crc32: u32_at(b, 32),
            key_len: u32_at(b, 36),
        }
    }
}
