//! Chunk layout 3 (`LAYOUT_FP8`): the entropy coding of FP8-quantised rows (`crate::quant`).
//! A decoded row is `S` f32 scales then `W` e4m3fn bytes. The chunk stores three streams:
//!
//! 0. geometry, raw: `W` u32, `S` u32 (8 bytes);
//! 1. the scales, `rows x S` f32 as 4 byte planes (plane `k`: byte `k` of every scale in row
//!    order): one zstd frame, or raw;
//! 2. the modelled FP8 bytes: one zstd frame, or raw, of `W` channel bases, `rows` row
//!    offsets, then `rows x W` residual bytes in row order.
//!
//! The model (docs/FORMAT.md, "Layout 3"): an e4m3fn byte is sign `s`, exponent `e` (4 bits),
//! mantissa `m` (3 bits). A hidden state's channels each have their own magnitude, and a
//! per-token scale moves a whole row's exponents together, so `e` is modelled as a channel
//! base plus a row offset (`log |x|` additive in channel and token), and `s` by the channel's
//! usual sign. Each residual byte is `((e - be[c] - ro[r]) mod 16) << 4 | m << 1 | (s ^ bs[c])`
//! with channel base byte `be[c] << 1 | bs[c]`; zstd's order-0 Huffman stage then codes the
//! residuals of all channels with one table.

use super::{zstd_ctx, ChunkDesc, CodecOptions, EncodedChunk, CODEC_PLANES, LAYOUT_FP8, PROBE_BYTES};

/// Streams of a layout-3 chunk (geometry, scales, FP8 bytes).
pub const STREAMS: u8 = 3;
/// Rounds of alternating row offsets and channel bases (each a pass over the chunk).
const FIT_ROUNDS: usize = 2;
/// Bytes of the geometry stream.
pub const GEOMETRY_BYTES: u32 = 8;

/// Most frequent value in `counts` (ties: the smallest).
fn argmax(counts: &[u32]) -> u8 {
    let mut best = 0;
    for (i, &n) in counts.iter().enumerate() {
        if n > counts[best] {
            best = i;
        }
    }
    best as u8
}

fn exponent(b: u8) -> u8 {
    (b >> 3) & 15
}

/// The channel bases and row offsets of `rows x width` FP8 bytes (`fp8` yields each row's bytes).
fn fit<'a>(rows: impl Iterator<Item = &'a [u8]> + Clone, n_rows: usize, width: usize) -> (Vec<u8>, Vec<u8>) {
    // Channel exponent modes, then `FIT_ROUNDS` x (row offsets against them, then the channel
    // modes again given the offsets).
    let mut counts = vec![0u32; 16 * width];
    let mut sign = vec![0u32; width];
    for row in rows.clone() {
        for (c, &b) in row.iter().enumerate() {
            counts[16 * c + exponent(b) as usize] += 1;
            sign[c] += (b >> 7) as u32;
        }
    }
    let mut be: Vec<u8> = counts.chunks_exact(16).map(argmax).collect();
    let mut ro = vec![0u8; n_rows];
    let mut hist = [0u32; 16];
    for _ in 0..FIT_ROUNDS {
        for (r, row) in rows.clone().enumerate() {
            hist.fill(0);
            for (&b, &m) in row.iter().zip(&be) {
                hist[(exponent(b).wrapping_sub(m) & 15) as usize] += 1;
            }
            ro[r] = argmax(&hist);
        }
        counts.fill(0);
        for (row, &o) in rows.clone().zip(&ro) {
            for (c, &b) in row.iter().enumerate() {
                counts[16 * c + (exponent(b).wrapping_sub(o) & 15) as usize] += 1;
            }
        }
        for (b, cnt) in be.iter_mut().zip(counts.chunks_exact(16)) {
            *b = argmax(cnt);
        }
    }
    for (b, &s) in be.iter_mut().zip(&sign) {
        *b = *b << 1 | (2 * s as usize > n_rows) as u8;
    }
    (be, ro)
}

/// Encodes `rows` decoded rows of `4 n_scales + width` bytes.
pub fn encode(data: &[u8], rows: usize, width: usize, n_scales: usize, opts: &CodecOptions) -> EncodedChunk {
    let row_bytes = 4 * n_scales + width;
    debug_assert_eq!(data.len(), rows * row_bytes);
    let mut desc = ChunkDesc {
        codec: CODEC_PLANES,
        planes: STREAMS,
        layout: LAYOUT_FP8,
        rows: rows as u32,
        ..Default::default()
    };
    let mut payload = Vec::with_capacity(data.len() / 2);
    payload.extend_from_slice(&(width as u32).to_le_bytes());
    payload.extend_from_slice(&(n_scales as u32).to_le_bytes());
    desc.stored[0] = GEOMETRY_BYTES;

    // The scales as 4 byte planes (plane k: byte k of every scale, in row order): their exponent bytes compress.
    let n = rows * n_scales;
    let mut scales = vec![0u8; 4 * n];
    for (i, s) in data
        .chunks_exact(row_bytes)
        .flat_map(|r| r[..4 * n_scales].chunks_exact(4))
        .enumerate()
    {
        for (k, &b) in s.iter().enumerate() {
            scales[k * n + i] = b;
        }
    }
    let fp8 = data.chunks_exact(row_bytes).map(|r| &r[4 * n_scales..]);
    let (be, ro) = fit(fp8.clone(), rows, width);
    let mut modelled = Vec::with_capacity(width + rows + rows * width);
    modelled.extend_from_slice(&be);
    modelled.extend_from_slice(&ro);
    for (row, &o) in fp8.zip(&ro) {
        modelled.extend(row.iter().zip(&be).map(|(&b, &base)| {
            let e = exponent(b).wrapping_sub(base >> 1).wrapping_sub(o) & 15;
            e << 4 | (b & 7) << 1 | ((b >> 7) ^ (base & 1))
        }));
    }
    for (p, stream) in [(1, &scales), (2, &modelled)] {
        let z = zstd_ctx::probe_pays(stream, opts.zstd_level, PROBE_BYTES)
            .then(|| zstd_ctx::compress_if_pays(stream, opts.zstd_level))
            .flatten();
        let before = payload.len();
        match z {
            Some(z) => {
                desc.plane_zstd |= 1 << p;
                payload.extend_from_slice(&z);
            }
            None => payload.extend_from_slice(stream),
        }
        desc.stored[p] = (payload.len() - before) as u32;
    }
    EncodedChunk { desc, payload }
}

/// The `(width, n_scales)` a layout-3 chunk declares (its geometry stream), for the reader's
/// check against the schema. `payload` is the chunk's whole payload.
pub fn geometry(payload: &[u8]) -> Option<(u32, u32)> {
    let g = payload.get(..GEOMETRY_BYTES as usize)?;
    Some((
        u32::from_le_bytes(g[0..4].try_into().unwrap()),
        u32::from_le_bytes(g[4..8].try_into().unwrap()),
    ))
}

/// Decodes a layout-3 chunk into `out` (`rows x (4 S + W)` bytes).
pub fn decode(desc: &ChunkDesc, payload: &[u8], out: &mut [u8]) -> Result<(), String> {
    let (w, s) = geometry(payload).ok_or("layout-3 chunk without its geometry")?;
    let (width, n_scales, rows) = (w as usize, s as usize, desc.rows as usize);
    let row_bytes = (4 * n_scales)
        .checked_add(width)
        .filter(|&rb| rows.checked_mul(rb) == Some(out.len()))
        .ok_or_else(|| {
            format!(
                "layout-3 chunk of {rows} rows x ({width} channels + {n_scales} scales) does not fill {} bytes",
                out.len()
            )
        })?;
    let mut offset = GEOMETRY_BYTES as usize;
    let mut stream = |p: usize, len: usize| -> Result<Vec<u8>, String> {
        let stored = &payload[offset..offset + desc.stored[p] as usize];
        offset += stored.len();
        if desc.plane_zstd & (1 << p) == 0 {
            if stored.len() != len {
                return Err(format!("raw stream {p} holds {} bytes, expected {len}", stored.len()));
            }
            return Ok(stored.to_vec());
        }
        let mut buf = vec![0u8; len];
        zstd_ctx::decompress_exact(stored, &mut buf).map_err(|e| format!("stream {p}: {e}"))?;
        Ok(buf)
    };
    let scales = stream(1, rows * 4 * n_scales)?;
    let modelled = stream(2, width + rows + rows * width)?;
    let (be, rest) = modelled.split_at(width);
    let (ro, residuals) = rest.split_at(rows);
    let n = rows * n_scales;
    for (r, out_row) in out.chunks_exact_mut(row_bytes).enumerate() {
        let (sc, q) = out_row.split_at_mut(4 * n_scales);
        for (j, s) in sc.chunks_exact_mut(4).enumerate() {
            for (k, b) in s.iter_mut().enumerate() {
                *b = scales[k * n + r * n_scales + j];
            }
        }
        let o = ro[r];
        for ((b, &d), &base) in q.iter_mut().zip(&residuals[r * width..(r + 1) * width]).zip(be) {
            let e = (d >> 4).wrapping_add(base >> 1).wrapping_add(o) & 15;
            *b = ((d ^ base) & 1) << 7 | e << 3 | (d >> 1) & 7;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::decode_chunk;
    use proptest::prelude::*;

    fn rows_of(rows: usize, width: usize, n_scales: usize, seed: u64) -> Vec<u8> {
        (0..rows * (4 * n_scales + width))
            .map(|i| {
                let h = seed
                    .wrapping_mul(0x9E3779B97F4A7C15)
                    .wrapping_add(i as u64)
                    .rotate_left(23);
                // Mostly small exponents per channel, like quantised states; NaN codes excluded.
                let b = (h >> 32) as u8;
                if b & 0x7F == 0x7F {
                    0x30
                } else {
                    b & if i % 3 == 0 { 0xFF } else { 0xB7 }
                }
            })
            .collect()
    }

    #[test]
    fn a_real_shaped_chunk_compresses_and_its_descriptor_parses() {
        // Channel c has exponent 4 + c % 5, rows move together by an offset r % 3.
        let (rows, width) = (64usize, 40usize);
        let mut data = Vec::new();
        for r in 0..rows {
            data.extend_from_slice(&1.5f32.to_le_bytes());
            data.extend((0..width).map(|c| (((4 + c % 5 + r % 3) as u8) << 3) | ((r * 7 + c) % 8) as u8));
        }
        let enc = encode(&data, rows, width, 1, &CodecOptions::default());
        assert_eq!(ChunkDesc::from_bytes(&enc.desc.to_bytes()), Ok(enc.desc));
        assert_eq!(enc.desc.plane_zstd & 0b100, 0b100);
        assert!(
            enc.payload.len() < data.len() * 3 / 4,
            "{} of {}",
            enc.payload.len(),
            data.len()
        );
        assert_eq!(geometry(&enc.payload), Some((40, 1)));
        let mut out = vec![0u8; data.len()];
        decode_chunk(&enc.desc, &enc.payload, &mut out).unwrap();
        assert_eq!(out, data);
    }

    #[test]
    fn a_wrong_output_size_is_an_error() {
        let data = rows_of(3, 10, 2, 1);
        let enc = encode(&data, 3, 10, 2, &CodecOptions::default());
        let mut out = vec![0u8; data.len() - 1];
        assert!(decode_chunk(&enc.desc, &enc.payload, &mut out)
            .unwrap_err()
            .contains("does not fill"));
    }

    proptest! {
        #[test]
        fn encode_then_decode_is_identity(rows in 0usize..50, width in 1usize..90, n_scales in 1usize..4, seed in any::<u64>()) {
            let data = rows_of(rows, width, n_scales, seed);
            let enc = encode(&data, rows, width, n_scales, &CodecOptions::default());
            prop_assert_eq!(enc.payload.len() as u64, enc.desc.stored_len());
            let mut out = vec![0u8; data.len()];
            decode_chunk(&enc.desc, &enc.payload, &mut out).unwrap();
            prop_assert_eq!(out, data);
        }
    }
}
