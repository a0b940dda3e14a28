//! Decoding one record's chunks straight into the caller's output buffers, in parallel.

use rayon::prelude::*;

use crate::codec::{decode_chunk, fp8_geometry, LAYOUT_FP8};
use crate::error::{Error, Result};
use crate::format::record::{self, PrefixRef};
use crate::format::IndexEntry;
use crate::schema::TensorSpec;
use crate::shard::ShardFile;

/// Decodes record `i` of `shard`, whose checksummed bytes are `rec`, into `outs` (one
/// buffer per schema tensor, each exactly `n_tokens x stored_row_bytes` long: FP8 tensors
/// come out quantised, as scales and FP8 bytes per row; `crate::quant::dequantize` follows).
/// Returns the record's prefix reference, if it has one: its chunks then filled only the rows
/// after the prefix, and the first `prefix.n_tokens` rows of every buffer are the caller's to fill.
pub fn decode_record(
    shard: &ShardFile,
    i: usize,
    rec: &[u8],
    outs: &mut [&mut [u8]],
    pool: &rayon::ThreadPool,
) -> Result<Option<PrefixRef>> {
    let e = &shard.entries[i];
    let schema = &shard.schema;
    if outs.len() != schema.tensors.len() {
        return Err(Error::InvalidArgument(format!(
            "{} output buffers given, the schema has {} tensors",
            outs.len(),
            schema.tensors.len()
        )));
    }
    for (spec, out) in schema.tensors.iter().zip(outs.iter()) {
        check_output(e, spec, out)?;
    }
    let layout = parse(shard, i, rec)?;
    let prefix_rows = layout.prefix.map_or(0, |p| p.n_tokens as usize);
    // Pair each chunk with its slice of the output.
    let mut jobs = Vec::new();
    for ((chunks, spec), out) in layout.tensors.iter().zip(&schema.tensors).zip(outs.iter_mut()) {
        let row_bytes = spec.stored_row_bytes() as usize;
        let mut rest: &mut [u8] = &mut out[prefix_rows * row_bytes..];
        for c in chunks {
            check_chunk(shard, i, rec, c, spec)?;
            let (dst, tail) = std::mem::take(&mut rest).split_at_mut(c.desc.rows as usize * row_bytes);
            rest = tail;
            jobs.push((c, dst));
        }
    }
    let run = |(c, dst): (&record::ChunkRef, &mut [u8])| decode_one(shard, i, rec, c, dst);
    if jobs.len() <= 1 {
        jobs.into_iter().try_for_each(run)?;
    } else {
        pool.install(|| jobs.into_par_iter().try_for_each(run))?;
    }
    Ok(layout.prefix)
}

/// Decodes tensor `t` alone of record `i` of `shard` (checksummed bytes `rec`) into `out`, exactly
/// `n_tokens x stored_row_bytes` of it, chunk after chunk on the calling thread. Returns the
/// record's prefix reference as `decode_record` does (the first rows are then the caller's).
pub fn decode_tensor(shard: &ShardFile, i: usize, rec: &[u8], t: usize, out: &mut [u8]) -> Result<Option<PrefixRef>> {
    let spec = &shard.schema.tensors[t];
    check_output(&shard.entries[i], spec, out)?;
    let layout = parse(shard, i, rec)?;
    let row_bytes = spec.stored_row_bytes() as usize;
    let prefix_rows = layout.prefix.map_or(0, |p| p.n_tokens as usize);
    let mut rest: &mut [u8] = &mut out[prefix_rows * row_bytes..];
    for c in &layout.tensors[t] {
        check_chunk(shard, i, rec, c, spec)?;
        let (dst, tail) = std::mem::take(&mut rest).split_at_mut(c.desc.rows as usize * row_bytes);
        rest = tail;
        decode_one(shard, i, rec, c, dst)?;
    }
    Ok(layout.prefix)
}

fn check_output(e: &IndexEntry, spec: &TensorSpec, out: &[u8]) -> Result<()> {
    check_output_len(e, spec, spec.stored_row_bytes(), out)
}

/// `out` must hold exactly `n_tokens x row_bytes` bytes of tensor `spec` of sample `e`.
pub fn check_output_len(e: &IndexEntry, spec: &TensorSpec, row_bytes: u64, out: &[u8]) -> Result<()> {
    let want = e.n_tokens * row_bytes;
    if out.len() as u64 != want {
        return Err(Error::InvalidArgument(format!(
            "output for tensor {:?} of sample {} is {} bytes; it needs {} tokens x {row_bytes} bytes = {want}",
            spec.name,
            e.sample_id,
            out.len(),
            e.n_tokens,
        )));
    }
    Ok(())
}

fn parse(shard: &ShardFile, i: usize, rec: &[u8]) -> Result<record::RecordLayout> {
    let e = &shard.entries[i];
    record::parse(rec, &shard.schema, shard.version, e.sample_id, e.n_tokens)
        .map_err(|w| Error::corrupt(&shard.path, Some(e.sample_id), e.offset, w))
}

/// An FP8 chunk's geometry must be the schema's.
fn check_chunk(shard: &ShardFile, i: usize, rec: &[u8], c: &record::ChunkRef, spec: &TensorSpec) -> Result<()> {
    let e = &shard.entries[i];
    if let (Some(p), LAYOUT_FP8) = (&spec.precision, c.desc.layout) {
        let width = spec.elems_per_row();
        let want = (width as u32, p.scales_per_row(width) as u32);
        let found = fp8_geometry(&rec[c.payload_start..]);
        if found != Some(want) {
            return Err(Error::corrupt(
                &shard.path,
                Some(e.sample_id),
                e.offset + c.payload_start as u64,
                format!(
                    "tensor {:?}: FP8 chunk of (channels, scales per row) {found:?}, the schema says {want:?}",
                    spec.name
                ),
            ));
        }
    }
    Ok(())
}

fn decode_one(shard: &ShardFile, i: usize, rec: &[u8], c: &record::ChunkRef, dst: &mut [u8]) -> Result<()> {
    let e = &shard.entries[i];
    let payload = &rec[c.payload_start..c.payload_start + c.desc.stored_len() as usize];
    decode_chunk(&c.desc, payload, dst).map_err(|w| {
        // Point at the payload, or at the descriptor when the chunk has no payload bytes.
        let at = if payload.is_empty() { c.desc_at } else { c.payload_start };
        Error::corrupt(
            &shard.path,
            Some(e.sample_id),
            e.offset + at as u64,
            format!("chunk: {w}"),
        )
    })
}
