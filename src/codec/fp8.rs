//! Chunk layout 3 (`LAYOUT_FP8`): the entropy coding of FP8-quantised rows (`crate::quant`).
//! A decoded row is `S` f32 scales then `W` e4m3fn bytes. The chunk stores three streams:
//!
//! 0. geometry, raw: `W` u32, then `S` (low 24 bits) and the model flags (high 8 bits) as a u32;
//! 1. the scales, `rows x S` f32 as 4 byte planes (plane `k`: byte `k` of every scale in row
//!    order), or with `SCALES_BF16` the bf16 `amax` of each (2 byte planes): one zstd frame, or raw;
//! 2. the modelled FP8 bytes: one zstd frame, or raw, of `W` channel bases, `rows` row
//!    offsets, then `rows x W` residual bytes.
//!
//! The model (docs/FORMAT.md, "Layout 3"): an e4m3fn byte is sign `s`, exponent `e` (4 bits),
//! mantissa `m` (3 bits). A hidden state's channels each have their own magnitude, and a
//! per-token scale moves a whole row's exponents together, so `e` is modelled as a channel
//! base plus a row offset (`log |x|` additive in channel and token), and `s` by the channel's
//! usual sign. Each residual byte is `((e - be[c] - ro[r]) mod 16) << 4 | m << 1 | (s ^ bs[c])`
//! with channel base byte `class[c] << 5 | be[c] << 1 | bs[c]`.
//!
//! Without flags (datasets written before them) the residuals are stored row by row, and zstd's
//! order-0 Huffman stage codes all channels with one table per block. `ORDER_CLASSES` (what the
//! writer sets) stores them channel by channel, the channels sorted (stably) by their class, which the
//! writer sets from the spread of the channel's exponent residuals; a zstd stream 2 is then one
//! frame for the bases and offsets and one per non-empty class (in class order), so channels of
//! similar spread share Huffman tables fitted to them.

use crate::quant::E4M3_MAX;

use super::{zstd_ctx, ChunkDesc, CodecOptions, EncodedChunk, CODEC_PLANES, LAYOUT_FP8, PROBE_BYTES};

/// Streams of a layout-3 chunk (geometry, scales, FP8 bytes).
pub const STREAMS: u8 = 3;
/// Rounds of alternating row offsets and channel bases (each a pass over the chunk).
const FIT_ROUNDS: usize = 2;
/// Bytes of the geometry stream.
pub const GEOMETRY_BYTES: u32 = 8;
/// Model flags (the geometry's high byte). None set: residuals row by row, scales as f32
/// (datasets written before the flags).
/// Flag: residuals channel by channel, channels stably sorted by class (bits 5..7 of the base byte).
const ORDER_CLASSES: u32 = 1;
/// Flag: stream 1 holds each scale's `amax` as bf16 (2 byte planes); the scale is
/// `f32(amax) / 448`, exactly as the quantiser computes it from a bf16 tensor.
const SCALES_BF16: u32 = 2;
/// Bits of the geometry's second word that hold `S`; the model flags are above them.
const SCALES_MASK: u32 = (1 << 24) - 1;
/// Channel classes (3 bits of the base byte).
const CLASSES: usize = 8;
/// Classes per bit of exponent-residual entropy (the class of a channel is `entropy x this`).
const CLASSES_PER_BIT: f64 = 2.0;

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
    // `counts` holds each channel's exponent histogram given the final row offsets; the class is
    // the entropy of its residuals against the final base.
    for ((b, &s), cnt) in be.iter_mut().zip(&sign).zip(counts.chunks_exact(16)) {
        let class = (entropy_bits(cnt) * CLASSES_PER_BIT) as usize;
        *b = (class.min(CLASSES - 1) as u8) << 5 | *b << 1 | (2 * s as usize > n_rows) as u8;
    }
    (be, ro)
}

/// Plug-in entropy (bits per value) of a histogram.
fn entropy_bits(counts: &[u32]) -> f64 {
    let n: u32 = counts.iter().sum();
    if n == 0 {
        return 0.0;
    }
    let n = n as f64;
    counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = c as f64 / n;
            -p * p.log2()
        })
        .sum()
}

/// `f32(a) / 448` of bf16 bits `a`: the quantiser's scale of a bf16 block whose `amax` is `a`.
fn bf16_scale(a: u16) -> f32 {
    f32::from_bits((a as u32) << 16) / E4M3_MAX
}

/// The bf16 `amax` whose scale is exactly `scale`, if there is one (tried: the bf16 values
/// either side of `scale x 448`).
fn bf16_amax(scale: f32) -> Option<u16> {
    let hi = ((scale * E4M3_MAX).to_bits() >> 16) as u16;
    [hi, hi.wrapping_add(1)]
        .into_iter()
        .find(|&a| bf16_scale(a).to_bits() == scale.to_bits())
}

/// Channels per class (bits 5..7 of the base bytes).
fn class_sizes(be: &[u8]) -> [usize; CLASSES] {
    let mut n = [0; CLASSES];
    for &b in be {
        n[(b >> 5) as usize] += 1;
    }
    n
}

/// The channels in `ORDER_CLASSES` order: stably sorted by the class bits of their base byte.
fn class_order(be: &[u8]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..be.len()).collect();
    order.sort_by_key(|&c| be[c] >> 5);
    order
}

/// The residual byte of FP8 byte `b` given its channel's base byte and its row's offset.
#[inline]
fn residual(b: u8, base: u8, o: u8) -> u8 {
    let e = exponent(b).wrapping_sub((base >> 1) & 15).wrapping_sub(o) & 15;
    e << 4 | (b & 7) << 1 | ((b >> 7) ^ (base & 1))
}

/// The FP8 byte of residual `d` given its channel's base byte and its row's offset.
#[inline]
fn unresidual(d: u8, base: u8, o: u8) -> u8 {
    let e = (d >> 4).wrapping_add((base >> 1) & 15).wrapping_add(o) & 15;
    ((d ^ base) & 1) << 7 | e << 3 | (d >> 1) & 7
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
    desc.stored[0] = GEOMETRY_BYTES;

    // The scales as 4 byte planes (plane k: byte k of every scale, in row order): their exponent
    // bytes compress. When every scale is `f32(a) / 448` of a bf16 `a` (the quantiser's scale of
    // a bf16 tensor), the 2 byte planes of those `a` instead.
    let n = rows * n_scales;
    let values = || {
        data.chunks_exact(row_bytes)
            .flat_map(|r| r[..4 * n_scales].chunks_exact(4))
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
    };
    let amax: Option<Vec<u16>> = values().map(bf16_amax).collect();
    let (elem, flags) = match &amax {
        Some(_) => (2, ORDER_CLASSES | SCALES_BF16),
        None => (4, ORDER_CLASSES),
    };
    payload.extend_from_slice(&(n_scales as u32 | flags << 24).to_le_bytes());
    let mut scales = vec![0u8; elem * n];
    let bytes: Box<dyn Iterator<Item = [u8; 4]>> = match amax {
        Some(a) => Box::new(a.into_iter().map(|a| {
            let [x, y] = a.to_le_bytes();
            [x, y, 0, 0]
        })),
        None => Box::new(values().map(f32::to_le_bytes)),
    };
    for (i, s) in bytes.enumerate() {
        for (k, &b) in s[..elem].iter().enumerate() {
            scales[k * n + i] = b;
        }
    }
    let fp8 = data.chunks_exact(row_bytes).map(|r| &r[4 * n_scales..]);
    let (be, ro) = fit(fp8.clone(), rows, width);
    let mut modelled = Vec::with_capacity(width + rows + rows * width);
    modelled.extend_from_slice(&be);
    modelled.extend_from_slice(&ro);
    let start = modelled.len();
    modelled.resize(start + rows * width, 0);
    let residuals = &mut modelled[start..];
    for (k, &c) in class_order(&be).iter().enumerate() {
        let base = be[c];
        let column = &mut residuals[k * rows..(k + 1) * rows];
        for ((d, row), &o) in column.iter_mut().zip(fp8.clone()).zip(&ro) {
            *d = residual(row[c], base, o);
        }
    }
    // The modelled stream as one zstd frame per part (bases and offsets, then each class's
    // residuals): each part gets Huffman tables of its own.
    let mut parts = vec![width + rows];
    parts.extend(class_sizes(&be).into_iter().filter(|&n| n > 0).map(|n| n * rows));
    let mut frames = Vec::new();
    let mut at = 0;
    for len in parts {
        zstd_ctx::compress_append(&modelled[at..at + len], opts.zstd_level, &mut frames);
        at += len;
    }
    let frames = zstd_ctx::pays(frames.len(), modelled.len()).then_some(frames);
    let scales_z = zstd_ctx::probe_pays(&scales, opts.zstd_level, PROBE_BYTES)
        .then(|| zstd_ctx::compress_if_pays(&scales, opts.zstd_level))
        .flatten();
    for (p, stream, z) in [(1, &scales, scales_z), (2, &modelled, frames)] {
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
    geometry_and_order(payload).map(|(w, s, _)| (w, s))
}

/// `(width, n_scales, residual order)` of a layout-3 chunk.
fn geometry_and_order(payload: &[u8]) -> Option<(u32, u32, u32)> {
    let g = payload.get(..GEOMETRY_BYTES as usize)?;
    let s = u32::from_le_bytes(g[4..8].try_into().unwrap());
    Some((
        u32::from_le_bytes(g[0..4].try_into().unwrap()),
        s & SCALES_MASK,
        s >> 24,
    ))
}

/// The modelled stream of an `ORDER_CLASSES` chunk from its frames: the bases and row
/// offsets (`width + rows` bytes), then each non-empty class's residuals (its channels x `rows`).
fn class_frames(stored: &[u8], width: usize, rows: usize) -> Result<Vec<u8>, String> {
    let mut buf = vec![0u8; width + rows + rows * width];
    let mut rest = stored;
    let mut next = |dst: &mut [u8]| -> Result<(), String> {
        let n = zstd::zstd_safe::find_frame_compressed_size(rest)
            .map_err(|_| format!("stream 2: {} bytes are not a complete zstd frame", rest.len()))?;
        zstd_ctx::decompress_exact(&rest[..n], dst).map_err(|e| format!("stream 2: {e}"))?;
        rest = &rest[n..];
        Ok(())
    };
    let (head, residuals) = buf.split_at_mut(width + rows);
    next(head)?;
    let mut at = 0;
    for n in class_sizes(&head[..width]).into_iter().filter(|&n| n > 0) {
        next(&mut residuals[at..at + n * rows])?;
        at += n * rows;
    }
    if !rest.is_empty() {
        return Err(format!("stream 2: {} bytes follow its last frame", rest.len()));
    }
    Ok(buf)
}

/// Decodes a layout-3 chunk into `out` (`rows x (4 S + W)` bytes).
pub fn decode(desc: &ChunkDesc, payload: &[u8], out: &mut [u8]) -> Result<(), String> {
    let (w, s, order) = geometry_and_order(payload).ok_or("layout-3 chunk without its geometry")?;
    if order & !(ORDER_CLASSES | SCALES_BF16) != 0 {
        return Err(format!("layout-3 chunk with unknown model flags {order:#x}"));
    }
    let elem = if order & SCALES_BF16 != 0 { 2 } else { 4 };
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
    let scales = stream(1, rows * elem * n_scales)?;
    let modelled = if order & ORDER_CLASSES != 0 && desc.plane_zstd & 0b100 != 0 {
        class_frames(&payload[offset..offset + desc.stored[2] as usize], width, rows)?
    } else {
        stream(2, width + rows + rows * width)?
    };
    let (be, rest) = modelled.split_at(width);
    let (ro, residuals) = rest.split_at(rows);
    let n = rows * n_scales;
    for (r, out_row) in out.chunks_exact_mut(row_bytes).enumerate() {
        let (sc, q) = out_row.split_at_mut(4 * n_scales);
        for (j, s) in sc.chunks_exact_mut(4).enumerate() {
            let i = r * n_scales + j;
            if elem == 2 {
                s.copy_from_slice(&bf16_scale(u16::from_le_bytes([scales[i], scales[n + i]])).to_le_bytes());
            } else {
                for (k, b) in s.iter_mut().enumerate() {
                    *b = scales[k * n + i];
                }
            }
        }
        if order & ORDER_CLASSES == 0 {
            let o = ro[r];
            for ((b, &d), &base) in q.iter_mut().zip(&residuals[r * width..(r + 1) * width]).zip(be) {
                *b = unresidual(d, base, o);
            }
        }
    }
    if order & ORDER_CLASSES != 0 {
        for (k, &c) in class_order(be).iter().enumerate() {
            let base = be[c];
            let column = &residuals[k * rows..(k + 1) * rows];
            for ((out_row, &d), &o) in out.chunks_exact_mut(row_bytes).zip(column).zip(ro) {
                out_row[4 * n_scales + c] = unresidual(d, base, o);
            }
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
    fn chunks_with_residuals_in_row_order_still_decode() {
        // A raw ORDER_ROWS chunk as written before ORDER_CLASSES: 2 rows x 3 channels, 1 scale.
        let (be, ro) = ([4u8 << 1 | 1, 5 << 1, 6 << 1], [0u8, 2]);
        let q = [[0xA3u8, 0x2A, 0x31], [0xB4, 0x38, 0x46]];
        let mut payload = [3u32.to_le_bytes(), 1u32.to_le_bytes()].concat();
        let scales = [0.5f32.to_le_bytes(), 2.0f32.to_le_bytes()];
        payload.extend((0..4).flat_map(|k| scales.iter().map(move |s| s[k])));
        payload.extend(be.iter().chain(&ro));
        for (row, &o) in q.iter().zip(&ro) {
            payload.extend(row.iter().zip(&be).map(|(&b, &base)| residual(b, base, o)));
        }
        let desc = ChunkDesc {
            codec: CODEC_PLANES,
            planes: STREAMS,
            layout: LAYOUT_FP8,
            rows: 2,
            stored: [GEOMETRY_BYTES, 8, 3 + 2 + 6, 0],
            ..Default::default()
        };
        let mut out = vec![0u8; 2 * 7];
        decode_chunk(&desc, &payload, &mut out).unwrap();
        let want: Vec<u8> = (0..2).flat_map(|r| scales[r].iter().chain(&q[r]).copied()).collect();
        assert_eq!(out, want);
        // Unknown model flags are refused.
        payload[7] = 9;
        assert!(decode_chunk(&desc, &payload, &mut out)
            .unwrap_err()
            .contains("unknown model flags 0x9"));
    }

    #[test]
    fn channels_are_grouped_by_the_spread_of_their_exponents() {
        // Channel 0 varies over 4 exponents, channel 1 is constant: classes 4 (2 bits x 2) and 0.
        let mut data = Vec::new();
        for r in 0..64usize {
            data.extend_from_slice(&1.0f32.to_le_bytes());
            data.extend([((4 + r % 4) as u8) << 3, 6 << 3]);
        }
        let enc = encode(&data, 64, 2, 1, &CodecOptions::default());
        assert_eq!(geometry(&enc.payload), Some((2, 1)));
        assert_eq!(enc.payload[7], (ORDER_CLASSES | SCALES_BF16) as u8); // 1.0 = f32(448 as bf16) / 448
        let mut out = vec![0u8; data.len()];
        decode_chunk(&enc.desc, &enc.payload, &mut out).unwrap();
        assert_eq!(out, data);
        let (be, _) = fit(data.chunks_exact(6).map(|r| &r[4..]), 64, 2);
        assert_eq!(be.iter().map(|b| b >> 5).collect::<Vec<_>>(), [4, 0]);
        assert_eq!(class_order(&be), [1, 0]);
    }

    #[test]
    fn scales_of_bf16_maxima_are_stored_as_those_maxima() {
        for a in [0u16, 0x3F80, 0x4480, 0x0001, 0x7F7F, 0xBF00, 0x3C23] {
            let s = bf16_scale(a);
            assert_eq!(bf16_scale(bf16_amax(s).unwrap()).to_bits(), s.to_bits(), "{a:#x}");
        }
        assert_eq!(bf16_amax(0.1), None); // 0.1 x 448 is no bf16
                                          // A chunk with such a scale keeps its f32 planes, and both decode.
        let mut data = Vec::new();
        for (r, s) in [0.1f32, bf16_scale(0x4049)].iter().enumerate() {
            data.extend_from_slice(&s.to_le_bytes());
            data.extend([0x38u8, 0x40 + r as u8, 0xB1]);
        }
        let enc = encode(&data, 2, 3, 1, &CodecOptions::default());
        assert_eq!(enc.payload[7], ORDER_CLASSES as u8);
        let mut out = vec![0u8; data.len()];
        decode_chunk(&enc.desc, &enc.payload, &mut out).unwrap();
        assert_eq!(out, data);
        let enc = encode(&data[7..], 1, 3, 1, &CodecOptions::default());
        assert_eq!(enc.payload[7], (ORDER_CLASSES | SCALES_BF16) as u8);
        let mut out = vec![0u8; 7];
        decode_chunk(&enc.desc, &enc.payload, &mut out).unwrap();
        assert_eq!(out, data[7..]);
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
