//! The chunk codec. A tensor is cut into chunks of whole rows; each chunk is encoded on
//! its own (so one large sample encodes and decodes on several threads) and described by
//! a [`ChunkDesc`] that records every parameter needed to decode it, so data written with
//! older settings stays readable. Layout: docs/FORMAT.md, "Chunks".

mod fp8;
mod fp8_rows;
mod fused;
mod mode_delta;
mod payload_pool;
mod planes;
mod zstd_ctx;

use std::cell::RefCell;

use crate::dtype::DType;

pub use fp8::geometry as fp8_geometry;
pub use fp8_rows::{encode_fp8_rows, Fp8Input};
pub use payload_pool::give_back as recycle_payload;

thread_local! {
    /// Per-thread work buffers, reused across chunks: fresh megabyte buffers would cost a
    /// page fault per page on every chunk.
    static WORK: RefCell<(Vec<u8>, Vec<u8>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Runs `f` with the first `a` and `b` bytes of this thread's two work buffers (contents
/// unspecified). The buffers only grow: shrinking and regrowing them zero-filled the regrown
/// bytes on every chunk of another size.
fn with_work<R>(a: usize, b: usize, f: impl FnOnce(&mut [u8], &mut [u8]) -> R) -> R {
    WORK.with(|w| {
        let (x, y) = &mut *w.borrow_mut();
        for (v, n) in [(&mut *x, a), (&mut *y, b)] {
            if v.len() < n {
                v.resize(n, 0);
            }
        }
        f(&mut x[..a], &mut y[..b])
    })
}

/// Chunk payload stored as is.
pub const CODEC_RAW: u8 = 0;
/// Chunk payload is one zstd frame of the chunk's bytes.
pub const CODEC_ZSTD: u8 = 1;
/// Chunk split into byte planes; each plane one zstd frame or raw (see `plane_zstd`).
pub const CODEC_PLANES: u8 = 2;

/// Size of a serialised [`ChunkDesc`].
pub const CHUNK_DESC_BYTES: usize = 24;

/// Planes smaller than this are compressed whole; larger ones are first probed on this
/// many leading bytes, and stored raw without further work when the probe does not pay.
const PROBE_BYTES: usize = 64 * 1024;

/// Plane bytes in token order: plane index `row * width + column`.
pub const LAYOUT_ROW_MAJOR: u8 = 0;
/// Every zstd plane is modelled per channel (`mode_delta.rs`): its frame decodes to the
/// `cols` column modes followed by the row-major plane minus each column's mode (mod 256).
/// Raw planes stay plain row-major.
pub const LAYOUT_MODE_DELTA: u8 = 1;
/// FP8-quantised rows (`crate::quant`), entropy-coded in three streams (`fp8.rs`).
pub const LAYOUT_FP8: u8 = 3;

/// Format v2: 2-byte elements split into the 8-bit exponent (plane 1, bits 7..14) and sign
/// plus 7 mantissa bits (plane 0: bit 15 -> bit 7, bits 0..6); every zstd plane modelled as in
/// `LAYOUT_MODE_DELTA`. Meant for bf16, whose exponent is exactly those bits (`fused.rs`).
pub const LAYOUT_EXP_MODE_DELTA: u8 = 2;

/// Whether a PLANES chunk of `planes` byte planes may use `layout`. One arm per layout id:
/// a new layout adds its arm here and its decoder in `decode_planes`.
fn layout_fits(layout: u8, planes: usize) -> bool {
    match layout {
        LAYOUT_ROW_MAJOR | LAYOUT_MODE_DELTA => true,
        LAYOUT_EXP_MODE_DELTA => planes == 2,
        _ => false,
    }
}

/// A raw plane whose sampled bytes carry less than this many bits each is tried with zstd.
const RAW_PLANE_MAX_BITS: f64 = 7.5;
/// Bytes sampled from the start of a raw plane to estimate its entropy.
const ENTROPY_SAMPLE: usize = 4096;

/// zstd level of integer tensors (token ids, masks: small, LZ matches pay).
const INT_LEVEL: i32 = 1;

/// How encoding is done. Decoding needs none of it: each chunk records its own parameters.
#[derive(Debug, Clone, Copy)]
pub struct CodecOptions {
    /// zstd level of the byte planes of floating tensors. Literals are always Huffman-coded
    /// (zstd otherwise drops that stage at negative levels), so a very negative level gives
    /// order-0 entropy coding at high speed: the default -1000 compresses bf16 planes better
    /// than level 1, and faster (benches/README.md).
    pub zstd_level: i32,
}

impl Default for CodecOptions {
    fn default() -> Self {
        CodecOptions { zstd_level: -1000 }
    }
}

/// The 24-byte descriptor of one chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChunkDesc {
    /// `CODEC_RAW`, `CODEC_ZSTD` or `CODEC_PLANES`.
    pub codec: u8,
    /// Number of byte planes (the element size) for `CODEC_PLANES`; 1 otherwise.
    pub planes: u8,
    /// Bit `p` set: plane `p` is a zstd frame; clear: plane `p` is stored raw.
    pub plane_zstd: u8,
    /// `LAYOUT_ROW_MAJOR`, `LAYOUT_MODE_DELTA`, `LAYOUT_EXP_MODE_DELTA` or `LAYOUT_FP8` (PLANES
    /// only; 0 otherwise).
    pub layout: u8,
    /// Rows (tokens) in this chunk.
    pub rows: u32,
    /// Stored bytes of each plane (`[0]` only for RAW and ZSTD; unused entries are 0).
    pub stored: [u32; 4],
}

impl ChunkDesc {
    /// Total payload bytes of the chunk.
    pub fn stored_len(&self) -> u64 {
        self.stored.iter().map(|&s| s as u64).sum()
    }

    /// Serialises into `CHUNK_DESC_BYTES` little-endian bytes.
    pub fn to_bytes(&self) -> [u8; CHUNK_DESC_BYTES] {
        let mut b = [0u8; CHUNK_DESC_BYTES];
        b[0] = self.codec;
        b[1] = self.planes;
        b[2] = self.plane_zstd;
        b[3] = self.layout;
        b[4..8].copy_from_slice(&self.rows.to_le_bytes());
        for (i, s) in self.stored.iter().enumerate() {
            b[8 + 4 * i..12 + 4 * i].copy_from_slice(&s.to_le_bytes());
        }
        b
    }

    /// Parses a descriptor and checks its fields are self-consistent.
    pub fn from_bytes(b: &[u8; CHUNK_DESC_BYTES]) -> Result<ChunkDesc, String> {
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let d = ChunkDesc {
            codec: b[0],
            planes: b[1],
            plane_zstd: b[2],
            layout: b[3],
            rows: u32_at(4),
            stored: [u32_at(8), u32_at(12), u32_at(16), u32_at(20)],
        };
        let n = d.planes as usize;
        let ok = match d.codec {
            CODEC_RAW | CODEC_ZSTD => n == 1 && d.plane_zstd == 0 && d.layout == 0 && d.stored[1..] == [0, 0, 0],
            CODEC_PLANES if d.layout == LAYOUT_FP8 => {
                n == fp8::STREAMS as usize
                    && d.plane_zstd & !0b110 == 0
                    && d.stored[0] == fp8::GEOMETRY_BYTES
                    && d.stored[3] == 0
            }
            CODEC_PLANES => {
                (n == 2 || n == 4)
                    && (d.plane_zstd as usize) < (1 << n)
                    && layout_fits(d.layout, n)
                    && d.stored[n..].iter().all(|&s| s == 0)
            }
            _ => return Err(format!("unknown chunk codec {}", d.codec)),
        };
        if !ok {
            return Err(format!("inconsistent chunk descriptor {d:?}"));
        }
        Ok(d)
    }
}

/// One encoded chunk: its descriptor and payload.
pub struct EncodedChunk {
    pub desc: ChunkDesc,
    pub payload: Vec<u8>,
}

/// Encodes `rows` rows of `data` (`dtype` elements). Floating types go to byte planes,
/// everything else to one zstd frame; any part that zstd does not shrink is stored raw.
pub fn encode_chunk(data: &[u8], rows: u32, dtype: DType, opts: &CodecOptions) -> EncodedChunk {
    let n = dtype.size();
    if dtype.is_float() && !data.is_empty() {
        return match dtype {
            DType::Bfloat16 => encode_fused(data, rows as usize, LAYOUT_EXP_MODE_DELTA, opts),
            DType::Float16 => encode_fused(data, rows as usize, LAYOUT_MODE_DELTA, opts),
            _ => encode_planes(data, rows as usize, n, opts),
        };
    }
    let mut desc = ChunkDesc {
        codec: CODEC_RAW,
        planes: 1,
        rows,
        ..Default::default()
    };
    let compressed = zstd_ctx::probe_pays(data, INT_LEVEL, PROBE_BYTES)
        .then(|| zstd_ctx::compress_if_pays(data, INT_LEVEL))
        .flatten();
    let payload = match compressed {
        Some(z) => {
            desc.codec = CODEC_ZSTD;
            z
        }
        None => data.to_vec(),
    };
    desc.stored[0] = payload.len() as u32;
    EncodedChunk { desc, payload }
}

/// Order-0 entropy of the first `ENTROPY_SAMPLE` bytes, in bits per byte.
fn sampled_entropy(bytes: &[u8]) -> f64 {
    let sample = &bytes[..bytes.len().min(ENTROPY_SAMPLE)];
    let mut counts = [0u32; 256];
    for &b in sample {
        counts[b as usize] += 1;
    }
    let n = sample.len() as f64;
    counts
        .iter()
        .filter(|&&k| k > 0)
        .map(|&k| {
            let p = k as f64 / n;
            -p * p.log2()
        })
        .sum()
}

/// 2-byte elements in one pass (`fused.rs`): plane 0 goes straight into the payload, plane 1
/// minus its channel modes into a reused per-thread buffer that zstd codes straight onto the
/// payload's tail. Plane 0 (near-random mantissa bits) is stored raw unless its sampled
/// entropy says zstd may pay (e.g. constant data); plane 1 raw when zstd does not pay.
fn encode_fused(data: &[u8], rows: usize, layout: u8, opts: &CodecOptions) -> EncodedChunk {
    let exp = layout == LAYOUT_EXP_MODE_DELTA;
    let plane_len = data.len() / 2;
    let cols = plane_len / rows;
    let mut desc = ChunkDesc {
        codec: CODEC_PLANES,
        planes: 2,
        layout,
        rows: rows as u32,
        ..Default::default()
    };
    // A recycled buffer (`payload_pool.rs`): its pages are mapped already, so filling it costs no
    // faults, and its old bytes are kept, so only growth is zero-filled (the split overwrites them all).
    let mut payload = payload_pool::take(plane_len + zstd::zstd_safe::compress_bound(cols + plane_len));
    payload.resize(plane_len, 0);
    with_work(cols + plane_len, 0, |modelled, _| {
        let (modes, delta) = modelled.split_at_mut(cols);
        fused::channel_modes(data, rows, exp, modes);
        fused::split_subtract(data, exp, modes, &mut payload, delta);
        if sampled_entropy(&payload) < RAW_PLANE_MAX_BITS {
            // A zstd plane is modelled too: here with modes 0, the plane as is after them.
            let framed = [&vec![0u8; cols][..], &payload[..]].concat();
            let z = zstd_ctx::compress_if_pays(&framed, opts.zstd_level).filter(|z| zstd_ctx::pays(z.len(), plane_len));
            if let Some(z) = z {
                desc.plane_zstd |= 1;
                payload.clear();
                payload.extend_from_slice(&z);
            }
        }
        desc.stored[0] = payload.len() as u32;
        let start = payload.len();
        let z = zstd_ctx::compress_append(modelled, opts.zstd_level, &mut payload);
        if zstd_ctx::pays(z, plane_len) {
            desc.plane_zstd |= 2;
        } else {
            payload.truncate(start);
            payload.resize(start + plane_len, 0);
            fused::plane1(data, exp, &mut payload[start..]);
        }
        desc.stored[1] = (payload.len() - start) as u32;
    });
    EncodedChunk { desc, payload }
}

fn encode_planes(data: &[u8], rows: usize, n: usize, opts: &CodecOptions) -> EncodedChunk {
    let plane_len = data.len() / n;
    let cols = plane_len / rows;
    let mut desc = ChunkDesc {
        codec: CODEC_PLANES,
        planes: n as u8,
        layout: LAYOUT_MODE_DELTA,
        rows: rows as u32,
        ..Default::default()
    };
    let mut payload = Vec::with_capacity(data.len());
    // `split`: the planes; `modelled`: a plane's `cols` modes followed by its deltas.
    with_work(data.len(), cols + plane_len, |split, modelled| {
        {
            let mut views: Vec<&mut [u8]> = split.chunks_exact_mut(plane_len).collect();
            planes::split(data, &mut views);
        }
        for (p, plane) in split.chunks_exact(plane_len).enumerate() {
            let before = payload.len();
            // A noise plane (the low mantissa byte) fails the probe and is neither modelled nor compressed.
            let compressed = zstd_ctx::probe_pays(plane, opts.zstd_level, PROBE_BYTES)
                .then(|| {
                    let (modes, deltas) = modelled.split_at_mut(cols);
                    mode_delta::column_modes(plane, rows, modes);
                    mode_delta::subtract(plane, modes, deltas);
                    zstd_ctx::compress_if_pays(modelled, opts.zstd_level)
                })
                .flatten();
            match compressed {
                Some(z) if z.len() < plane.len() => {
                    desc.plane_zstd |= 1 << p;
                    payload.extend_from_slice(&z);
                }
                _ => payload.extend_from_slice(plane),
            }
            desc.stored[p] = (payload.len() - before) as u32;
        }
    });
    EncodedChunk { desc, payload }
}

/// Decodes one chunk into `out`, which must be exactly the chunk's decoded size.
/// Errors describe what is inconsistent; the caller adds file, sample and offset.
pub fn decode_chunk(desc: &ChunkDesc, payload: &[u8], out: &mut [u8]) -> Result<(), String> {
    if payload.len() as u64 != desc.stored_len() {
        return Err(format!(
            "chunk payload is {} bytes, its descriptor says {}",
            payload.len(),
            desc.stored_len()
        ));
    }
    match desc.codec {
        CODEC_RAW => {
            if payload.len() != out.len() {
                return Err(format!(
                    "raw chunk holds {} bytes, expected {}",
                    payload.len(),
                    out.len()
                ));
            }
            out.copy_from_slice(payload);
            Ok(())
        }
        CODEC_ZSTD => zstd_ctx::decompress_exact(payload, out),
        _ if desc.layout == LAYOUT_FP8 => fp8::decode(desc, payload, out),
        _ => decode_planes(desc, payload, out),
    }
}

fn decode_planes(desc: &ChunkDesc, payload: &[u8], out: &mut [u8]) -> Result<(), String> {
    let n = desc.planes as usize;
    if !out.len().is_multiple_of(n) {
        return Err(format!("{} decoded bytes do not split into {n} planes", out.len()));
    }
    let plane_len = out.len() / n;
    let rows = desc.rows as usize;
    if rows == 0 {
        return match (out.len(), payload.len()) {
            (0, 0) => Ok(()),
            _ => Err("a PLANES chunk of 0 rows holds bytes".into()),
        };
    }
    if !plane_len.is_multiple_of(rows) {
        return Err(format!("{plane_len}-byte planes do not hold {rows} whole rows"));
    }
    let cols = plane_len / rows;
    let modelled = matches!(desc.layout, LAYOUT_MODE_DELTA | LAYOUT_EXP_MODE_DELTA);
    if n == 2 {
        return decode_two(desc, payload, out, cols, modelled);
    }
    // Each plane is written straight into its bytes of `out`.
    with_work(plane_len + if modelled { cols } else { 0 }, 0, |scratch, _| {
        let mut offset = 0usize;
        for p in 0..n {
            let stored = &payload[offset..offset + desc.stored[p] as usize];
            offset += stored.len();
            if desc.plane_zstd & (1 << p) == 0 {
                if stored.len() != plane_len {
                    return Err(format!(
                        "raw plane {p} holds {} bytes, expected {plane_len}",
                        stored.len()
                    ));
                }
                planes::scatter_row_major(stored, n, p, out);
                continue;
            }
            zstd_ctx::decompress_exact(stored, scratch).map_err(|e| format!("plane {p}: {e}"))?;
            if modelled {
                let (modes, deltas) = scratch.split_at(cols);
                mode_delta::scatter_add(deltas, modes, n, p, out);
            } else {
                planes::scatter_row_major(scratch, n, p, out);
            }
        }
        Ok(())
    })
}

/// Two planes in one pass (`fused.rs`): each zstd plane is decoded into a reused per-thread
/// buffer (its modes, then its deltas), a raw plane is read where it lies in the payload, and
/// one pass adds the modes and interleaves both planes into `out`.
fn decode_two(desc: &ChunkDesc, payload: &[u8], out: &mut [u8], cols: usize, modelled: bool) -> Result<(), String> {
    let plane_len = out.len() / 2;
    let (s0, s1) = payload.split_at(desc.stored[0] as usize);
    let framed = |p: usize| desc.plane_zstd & (1 << p) != 0;
    let head = if modelled { cols } else { 0 };
    let size = |p: usize| if framed(p) { head + plane_len } else { 0 };
    // Modes of 0 for a plane without its own (raw, or not modelled); not allocated when both have theirs.
    let zeros = if modelled && framed(0) && framed(1) {
        Vec::new()
    } else {
        vec![0u8; cols]
    };
    // Plane `p`: its bytes and its channel modes (all 0 when stored raw or not modelled).
    let plane = |p: usize, stored: &'_ [u8], work: &'_ mut [u8]| -> Result<(), String> {
        if framed(p) {
            zstd_ctx::decompress_exact(stored, work).map_err(|e| format!("plane {p}: {e}"))
        } else if stored.len() != plane_len {
            Err(format!(
                "raw plane {p} holds {} bytes, expected {plane_len}",
                stored.len()
            ))
        } else {
            Ok(())
        }
    };
    with_work(size(0), size(1), |w0, w1| {
        plane(0, s0, w0)?;
        plane(1, s1, w1)?;
        let (lo, lo_modes) = split_plane(framed(0), head, s0, w0, &zeros);
        let (hi, hi_modes) = split_plane(framed(1), head, s1, w1, &zeros);
        fused::join_add(lo, lo_modes, hi, hi_modes, desc.layout == LAYOUT_EXP_MODE_DELTA, out);
        Ok(())
    })
}

/// A decoded plane's bytes and modes: from its work buffer (`head` mode bytes first) when it
/// was a zstd frame, else the raw bytes where they lie, with modes 0.
fn split_plane<'a>(
    framed: bool,
    head: usize,
    stored: &'a [u8],
    work: &'a [u8],
    zeros: &'a [u8],
) -> (&'a [u8], &'a [u8]) {
    match (framed, head) {
        (true, 0) => (work, zeros),
        (true, _) => (&work[head..], &work[..head]),
        (false, _) => (stored, zeros),
    }
}

#[cfg(test)]
mod tests;
