//! One record = one sample: a header, a chunk table per schema tensor, then the chunk
//! payloads in table order.
//!
//! ```text
//! b"EREC" | n_tensors u32 | sample_id u64 | n_tokens u64          (24 B)
//! per tensor: n_chunks u32 | reserved u32 | n_chunks x ChunkDesc  (8 + 24 n B)
//! payloads of every chunk, tensor by tensor, chunk by chunk
//! ```

use crate::codec::{ChunkDesc, EncodedChunk, CHUNK_DESC_BYTES, CODEC_PLANES, LAYOUT_FP8};
use crate::schema::Schema;

pub const RECORD_MAGIC: &[u8; 4] = b"EREC";
pub const RECORD_HEADER_BYTES: usize = 24;

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
}

/// Serialises the header and chunk tables of a record whose payloads follow in order.
pub fn encode_table(sample_id: u64, n_tokens: u64, tensors: &[Vec<EncodedChunk>]) -> Vec<u8> {
    let n_chunks: usize = tensors.iter().map(Vec::len).sum();
    let mut b = Vec::with_capacity(RECORD_HEADER_BYTES + 8 * tensors.len() + CHUNK_DESC_BYTES * n_chunks);
    b.extend_from_slice(RECORD_MAGIC);
    b.extend_from_slice(&(tensors.len() as u32).to_le_bytes());
    b.extend_from_slice(&sample_id.to_le_bytes());
    b.extend_from_slice(&n_tokens.to_le_bytes());
    for chunks in tensors {
        b.extend_from_slice(&(chunks.len() as u32).to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        for c in chunks {
            b.extend_from_slice(&c.desc.to_bytes());
        }
    }
    b
}

/// Parses and bounds-checks a record against its index entry and the schema. Every
/// length is checked against the record's size before it is used. The error names what
/// is wrong; the caller adds the file and offset.
pub fn parse(rec: &[u8], schema: &Schema, sample_id: u64, n_tokens: u64) -> Result<RecordLayout, String> {
    if rec.len() < RECORD_HEADER_BYTES || &rec[0..4] != RECORD_MAGIC {
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
        if rows != n_tokens {
            return Err(format!(
                "tensor {:?}: chunks hold {rows} rows, the sample has {n_tokens}",
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
    Ok(RecordLayout { tensors })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{encode_chunk, CodecOptions};
    use crate::{DType, TensorSpec};

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
        let layout = parse(&rec, &schema(DType::Bfloat16), 9, 3).unwrap();
        assert_eq!(layout.tensors[0].len(), 1);
        assert!(parse(&rec, &schema(DType::Bfloat16), 8, 3)
            .unwrap_err()
            .contains("sample id 9"));
        assert!(parse(&rec, &schema(DType::Bfloat16), 9, 4)
            .unwrap_err()
            .contains("3 tokens"));
        assert!(parse(&rec[..rec.len() - 1], &schema(DType::Bfloat16), 9, 3).is_err());
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
        assert!(parse(&rec, &f32_schema, 9, 3)
            .unwrap_err()
            .contains("2 byte planes for float32"));
    }
}
