//! One record = one sample: a header, a chunk table per schema tensor, then the chunk
//! payloads in table order.
//!
//! ```text
//! b"EREC" | n_tensors u32 | sample_id u64 | n_tokens u64          (24 B)
//! per tensor: n_chunks u32 | reserved u32 | n_chunks x ChunkDesc  (8 + 24 n B)
//! payloads of every chunk, tensor by tensor, chunk by chunk
//! ```
//!
//! From format version 3 a record may instead start `b"EREF"`: the same 24 bytes (`n_tokens` the
//! whole sample's), then a prefix reference (`prefix_id u64 | prefix_tokens u64 | sha256 [32]`,
//! 48 B); its chunks then hold only the rows after the prefix (docs/FORMAT.md 4.7).

use super::PREFIX_VERSION;
use crate::codec::{ChunkDesc, EncodedChunk, CHUNK_DESC_BYTES, CODEC_PLANES, LAYOUT_FP8};
use crate::schema::Schema;
use crate::DType;

pub const RECORD_MAGIC: &[u8; 4] = b"EREC";
/// The magic of a record that stores a suffix and references a prefix record (format version 3).
pub const REF_RECORD_MAGIC: &[u8; 4] = b"EREF";
pub const RECORD_HEADER_BYTES: usize = 24;
/// Bytes of a prefix reference after the header of a `b"EREF"` record.
pub const PREFIX_REF_BYTES: usize = 48;

/// A sample's reference to the prefix record holding its first `n_tokens` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PrefixRef {
    /// The prefix record's id (its index entry's `sample_id`, in the dataset's prefix shards).
    pub id: u64,
    /// Tokens the prefix holds (at least 1; at most the sample's).
    pub n_tokens: u64,
    /// SHA-256 of the prefix's token ids (its `input_ids`, int64 little-endian).
    pub digest: [u8; 32],
}

impl PrefixRef {
    fn to_bytes(self) -> [u8; PREFIX_REF_BYTES] {
        let mut b = [0u8; PREFIX_REF_BYTES];
        b[0..8].copy_from_slice(&self.id.to_le_bytes());
        b[8..16].copy_from_slice(&self.n_tokens.to_le_bytes());
        b[16..48].copy_from_slice(&self.digest);
        b
    }

    fn from_bytes(b: &[u8]) -> PrefixRef {
        PrefixRef {
            id: u64::from_le_bytes(b[0..8].try_into().unwrap()),
            n_tokens: u64::from_le_bytes(b[8..16].try_into().unwrap()),
            digest: b[16..48].try_into().unwrap(),
        }
    }
}

/// The key of a prefix record: `sha256:` and the 64 lowercase hex digits of its token ids' digest.
pub fn prefix_key(digest: &[u8; 32]) -> String {
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// The position of the schema's token ids, which a prefix record's digest covers: its `input_ids`
/// tensor of shape `[L]` and dtype int64.
pub fn token_ids_tensor(schema: &Schema) -> Option<usize> {
    schema
        .tensors
        .iter()
        .position(|t| t.name == "input_ids" && t.dtype == DType::Int64 && t.width.is_none())
}

/// The digest a prefix record's key (`prefix_key`) names, if it is one.
pub fn parse_prefix_key(key: &str) -> Option<[u8; 32]> {
    let hex = key.strip_prefix("sha256:").filter(|h| h.len() == 64)?;
    let mut digest = [0u8; 32];
    for (k, d) in digest.iter_mut().enumerate() {
        *d = u8::from_str_radix(hex.get(2 * k..2 * k + 2)?, 16).ok()?;
    }
    Some(digest)
}

/// SHA-256 of token ids given as int64 little-endian bytes (a prefix record's digest).
pub fn token_digest(input_ids: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(input_ids).into()
}

/// Where one chunk sits: its descriptor, its payload range in the record, its first row.
#[derive(Debug, Clone, Copy)]
pub struct ChunkRef {
    pub desc: ChunkDesc,
    /// Offset of the chunk's descriptor in the record.
    pub desc_at: usize,
    pub payload_start: usize,
    pub row_start: u64,
}

/// The parsed table of a record: for each schema tensor, its chunks in row order.
#[derive(Debug)]
pub struct RecordLayout {
    pub tensors: Vec<Vec<ChunkRef>>,
    /// The prefix record holding the sample's first rows (a `b"EREF"` record); the chunks hold
    /// the rows after it.
    pub prefix: Option<PrefixRef>,
}

/// Serialises the header and chunk tables of a record whose payloads follow in order.
/// `n_tokens` is the whole sample's; with `prefix`, the chunks hold its rows after the prefix.
pub fn encode_table(
    sample_id: u64,
    n_tokens: u64,
    prefix: Option<PrefixRef>,
    tensors: &[Vec<EncodedChunk>],
) -> Vec<u8> {
    let n_chunks: usize = tensors.iter().map(Vec::len).sum();
    let mut b =
        Vec::with_capacity(RECORD_HEADER_BYTES + PREFIX_REF_BYTES + 8 * tensors.len() + CHUNK_DESC_BYTES * n_chunks);
    b.extend_from_slice(if prefix.is_some() {
        REF_RECORD_MAGIC
    } else {
        RECORD_MAGIC
    });
    b.extend_from_slice(&(tensors.len() as u32).to_le_bytes());
    b.extend_from_slice(&sample_id.to_le_bytes());
    b.extend_from_slice(&n_tokens.to_le_bytes());
    if let Some(p) = prefix {
        b.extend_from_slice(&p.to_bytes());
    }
    for chunks in tensors {
        b.extend_from_slice(&(chunks.len() as u32).to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        for c in chunks {
            b.extend_from_slice(&c.desc.to_bytes());
        }
    }
    b
}

/// Parses and bounds-checks a record of a shard of format `version` against its index entry and
/// the schema. Every length is checked against the record's size before it is used. The error
/// names what is wrong; the caller adds the file and offset.
pub fn parse(rec: &[u8], schema: &Schema, version: u32, sample_id: u64, n_tokens: u64) -> Result<RecordLayout, String> {
    let referencing = rec.len() >= 4 && &rec[0..4] == REF_RECORD_MAGIC && version >= PREFIX_VERSION;
    if rec.len() < RECORD_HEADER_BYTES || !(referencing || &rec[0..4] == RECORD_MAGIC) {
        return Err("record header (bad magic or too short)".into());
    }
    let n_tensors = u32::from_le_bytes(rec[4..8].try_into().unwrap()) as usize;
    let rec_id = u64::from_le_bytes(rec[8..16].try_into().unwrap());
    let rec_tokens = u64::from_le_bytes(rec[16..24].try_into().unwrap());
    if n_tensors != schema.tensors.len() {
        return Err(format!(
            "record has {n_tensors} tensors, schema has {}",
            schema.tensors.len()
        ));
    }
    if rec_id != sample_id {
        return Err(format!(
            "record holds sample id {rec_id} but the index says {sample_id}"
        ));
    }
    if rec_tokens != n_tokens {
        return Err(format!(
            "record holds {rec_tokens} tokens but the index says {n_tokens}"
        ));
    }
    let mut pos = RECORD_HEADER_BYTES;
    let prefix = match referencing {
        false => None,
        true => {
            let b = rec
                .get(pos..pos + PREFIX_REF_BYTES)
                .ok_or("prefix reference runs past the record")?;
            pos += PREFIX_REF_BYTES;
            let p = PrefixRef::from_bytes(b);
            if p.n_tokens == 0 || p.n_tokens > n_tokens {
                return Err(format!(
                    "prefix reference of {} tokens in a sample of {n_tokens}",
                    p.n_tokens
                ));
            }
            Some(p)
        }
    };
    let stored_tokens = n_tokens - prefix.map_or(0, |p| p.n_tokens);
    let mut tables = Vec::with_capacity(n_tensors);
    for spec in &schema.tensors {
        let head = rec.get(pos..pos + 8).ok_or("chunk table runs past the record")?;
        let n_chunks = u32::from_le_bytes(head[0..4].try_into().unwrap()) as usize;
        if head[4..8] != [0, 0, 0, 0] {
            return Err("chunk table reserved bytes".into());
        }
        pos += 8;
        let end = n_chunks
            .checked_mul(CHUNK_DESC_BYTES)
            .and_then(|n| n.checked_add(pos))
            .filter(|&e| e <= rec.len())
            .ok_or_else(|| {
                format!(
                    "tensor {:?}: {n_chunks} chunk descriptors run past the record",
                    spec.name
                )
            })?;
        let mut chunks = Vec::with_capacity(n_chunks);
        let mut rows = 0u64;
        for (k, d) in rec[pos..end].chunks_exact(CHUNK_DESC_BYTES).enumerate() {
            let desc =
                ChunkDesc::from_bytes(d.try_into().unwrap()).map_err(|e| format!("tensor {:?}: {e}", spec.name))?;
            let fp8_chunk = desc.codec == CODEC_PLANES && desc.layout == LAYOUT_FP8;
            if fp8_chunk != (spec.precision.is_some() && desc.codec == CODEC_PLANES) {
                return Err(format!(
                    "tensor {:?}: a chunk of layout {} for a tensor {} FP8 storage",
                    spec.name,
                    desc.layout,
                    if spec.precision.is_some() { "with" } else { "without" }
                ));
            }
            if desc.codec == CODEC_PLANES && !fp8_chunk && desc.planes as usize != spec.dtype.size() {
                return Err(format!(
                    "tensor {:?}: {} byte planes for {} elements",
                    spec.name,
                    desc.planes,
                    spec.dtype.name()
                ));
            }
            chunks.push((desc, rows, pos + k * CHUNK_DESC_BYTES));
            rows += desc.rows as u64;
        }
        if rows != stored_tokens {
            return Err(format!(
                "tensor {:?}: chunks hold {rows} rows, the sample stores {stored_tokens}",
                spec.name
            ));
        }
        pos = end;
        tables.push(chunks);
    }
    let mut payload = pos;
    let mut tensors = Vec::with_capacity(n_tensors);
    for table in tables {
        let mut refs = Vec::with_capacity(table.len());
        for (desc, row_start, desc_at) in table {
            refs.push(ChunkRef {
                desc,
                desc_at,
                payload_start: payload,
                row_start,
            });
            payload += desc.stored_len() as usize;
            if payload > rec.len() {
                return Err("chunk payloads run past the record".into());
            }
        }
        tensors.push(refs);
    }
    if payload != rec.len() {
        return Err(format!("record has {} bytes after its last chunk", rec.len() - payload));
    }
    Ok(RecordLayout { tensors, prefix })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{encode_chunk, CodecOptions};
    use crate::TensorSpec;

    fn schema(dtype: DType) -> Schema {
        Schema::new(vec![TensorSpec {
            name: "x".into(),
            dtype,
            width: Some(4),
            precision: None,
        }])
        .unwrap()
    }

    fn record(data: &[u8], rows: u32, dtype: DType) -> Vec<u8> {
        let chunk = encode_chunk(data, rows, dtype, &CodecOptions::default());
        let mut rec = encode_table(
            9,
            rows as u64,
            None,
            &[vec![EncodedChunk {
                desc: chunk.desc,
                payload: Vec::new(),
            }]],
        );
        rec.extend_from_slice(&chunk.payload);
        rec
    }

    #[test]
    fn parses_what_it_encodes_and_checks_the_index() {
        let data: Vec<u8> = (0..3 * 4 * 2).map(|i| i as u8).collect();
        let rec = record(&data, 3, DType::Bfloat16);
        let layout = parse(&rec, &schema(DType::Bfloat16), 2, 9, 3).unwrap();
        assert_eq!(layout.tensors[0].len(), 1);
        assert!(parse(&rec, &schema(DType::Bfloat16), 2, 8, 3)
            .unwrap_err()
            .contains("sample id 9"));
        assert!(parse(&rec, &schema(DType::Bfloat16), 2, 9, 4)
            .unwrap_err()
            .contains("3 tokens"));
        assert!(parse(&rec[..rec.len() - 1], &schema(DType::Bfloat16), 2, 9, 3).is_err());
    }

    #[test]
    fn plane_count_must_match_the_dtype() {
        let data: Vec<u8> = (0..3 * 4 * 2).map(|i| i as u8).collect();
        let rec = record(&data, 3, DType::Bfloat16); // 2 planes
                                                     // The same bytes read against a float32 schema of half the width: 2 planes for 4-byte elements.
        let f32_schema = Schema::new(vec![TensorSpec {
            name: "x".into(),
            dtype: DType::Float32,
            width: Some(2),
            precision: None,
        }])
        .unwrap();
        assert!(parse(&rec, &f32_schema, 2, 9, 3)
            .unwrap_err()
            .contains("2 byte planes for float32"));
    }

    #[test]
    fn a_referencing_record_stores_the_rows_after_its_prefix_and_needs_version_3() {
        let data: Vec<u8> = (0..3 * 4 * 2).map(|i| i as u8).collect();
        let chunk = encode_chunk(&data, 3, DType::Bfloat16, &CodecOptions::default());
        let prefix = PrefixRef {
            id: 4,
            n_tokens: 2,
            digest: token_digest(&[1, 0, 0, 0, 0, 0, 0, 0]),
        };
        let table = [vec![EncodedChunk {
            desc: chunk.desc,
            payload: Vec::new(),
        }]];
        let mut rec = encode_table(9, 5, Some(prefix), &table);
        rec.extend_from_slice(&chunk.payload);
        let s = schema(DType::Bfloat16);
        assert_eq!(parse(&rec, &s, 3, 9, 5).unwrap().prefix, Some(prefix));
        assert!(parse(&rec, &s, 2, 9, 5).unwrap_err().contains("bad magic"));
        // A 4-token sample with a 2-token prefix stores 2 rows, not 3.
        let mut short = encode_table(9, 4, Some(prefix), &table);
        short.extend_from_slice(&chunk.payload);
        assert!(parse(&short, &s, 3, 9, 4).unwrap_err().contains("the sample stores 2"));
        let long = PrefixRef { n_tokens: 6, ..prefix };
        let mut rec = encode_table(9, 5, Some(long), &table);
        rec.extend_from_slice(&chunk.payload);
        assert!(parse(&rec, &s, 3, 9, 5)
            .unwrap_err()
            .contains("6 tokens in a sample of 5"));
    }

    #[test]
    fn prefix_keys_name_the_sha256_of_the_token_ids() {
        // sha256 of the empty string, the known vector.
        let digest = token_digest(b"");
        let key = prefix_key(&digest);
        assert_eq!(
            key,
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(parse_prefix_key(&key), Some(digest));
        assert_eq!(parse_prefix_key(&key[..70]), None);
        assert_eq!(parse_prefix_key(&key.replace("sha256", "sha512")), None);
    }
}
