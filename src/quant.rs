//! Lossy FP8 storage (`float8_e4m3fn` with f32 scales): quantise rows of a floating tensor,
//! dequantise them back. Kept apart from the chunk codec: the writer quantises before
//! encoding (the codec's layout 3 then entropy-codes the FP8 bytes, `codec/fp8.rs`), and the
//! reader dequantises after decoding. Spec: docs/FORMAT.md, "FP8 storage".
//!
//! A quantised row of `W` channels with `S` scales is stored as `S` little-endian f32 scales
//! followed by `W` e4m3fn bytes (`4 S + W` bytes). Scale `j` covers channels
//! `[j B, min((j + 1) B, W))` with `B` = the block (`W` for one scale per token, as vLLM
//! speculators stores it): `scale = amax / 448` over those channels, `q = e4m3fn(x / scale)`
//! rounded to nearest even and saturated at +-448 (each saturation counted), `x' = q * scale`.
//! An all-zero block has scale 0 and bytes 0. NaN and Inf are refused (the capture's nonfinite
//! policy drops or raises on such samples before they reach the writer).

use serde::{Deserialize, Serialize};

use crate::dtype::DType;

/// Largest finite e4m3fn magnitude.
pub const E4M3_MAX: f32 = 448.0;

/// Largest scale a quantiser makes (`f32::MAX / 448`): a larger one dequantises a code of
/// magnitude up to 448 to more than `f32::MAX`, i.e. to Inf.
pub const MAX_SCALE: f32 = f32::MAX / E4M3_MAX;

/// The name of the FP8 storage type in schemas.
pub const FLOAT8_E4M3FN: &str = "float8_e4m3fn";

/// How a tensor is stored: which FP8 type and how its scales are laid out. Part of the schema
/// (`TensorSpec::precision`); absent means the tensor's own dtype, losslessly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Precision {
    /// Always [`FLOAT8_E4M3FN`] in this version (checked by the schema).
    pub storage: Fp8Type,
    /// Channels per scale; `None` = one scale per token over the whole row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<u32>,
}

/// The FP8 element types this build stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Fp8Type {
    #[serde(rename = "float8_e4m3fn")]
    E4m3fn,
}

impl Fp8Type {
    /// The schema name, e.g. [`FLOAT8_E4M3FN`].
    pub fn name(self) -> &'static str {
        match self {
            Fp8Type::E4m3fn => FLOAT8_E4M3FN,
        }
    }

    /// Parses a schema name; `None` for names this build does not store.
    pub fn parse(name: &str) -> Option<Fp8Type> {
        (name == FLOAT8_E4M3FN).then_some(Fp8Type::E4m3fn)
    }
}

impl Precision {
    /// One scale per token (speculators-compatible).
    pub const PER_TOKEN: Precision = Precision {
        storage: Fp8Type::E4m3fn,
        block: None,
    };

    /// Channels covered by one scale in a row of `width` channels.
    pub fn block_len(&self, width: u64) -> u64 {
        self.block.map_or(width, |b| (b as u64).min(width)).max(1)
    }

    /// Scales per row of `width` channels.
    pub fn scales_per_row(&self, width: u64) -> u64 {
        width.div_ceil(self.block_len(width))
    }

    /// Stored bytes of one quantised row: the scales, then one byte per channel.
    pub fn row_bytes(&self, width: u64) -> u64 {
        4 * self.scales_per_row(width) + width
    }
}

/// What quantising counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuantCounts {
    /// Values quantised.
    pub values: u64,
    /// Values whose `x / scale` rounded beyond +-448 and were saturated.
    pub clamped: u64,
    /// Scale blocks that were all zero (scale 0).
    pub zero_blocks: u64,
}

impl QuantCounts {
    pub fn add(&mut self, o: &QuantCounts) {
        self.values += o.values;
        self.clamped += o.clamped;
        self.zero_blocks += o.zero_blocks;
    }
}

/// A NaN or Inf met while quantising: row and channel within the rows given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NonFinite {
    pub row: u64,
    pub channel: u64,
}

/// The e4m3fn byte nearest to `v` (ties to even), saturated to +-448. `v` must not be NaN.
/// Returns the byte and whether it saturated.
pub fn f32_to_e4m3(v: f32) -> (u8, bool) {
    let sign = if v.is_sign_negative() { 0x80u8 } else { 0 };
    let a = v.abs();
    // Below the smallest normal (2^-6): subnormals are multiples of 2^-9 (exact scaling);
    // 8 x 2^-9 rounds up into the smallest normal, whose code is 8 too.
    if a < 0.015625 {
        return (sign | (a * 512.0).round_ties_even() as u8, false);
    }
    let bits = a.to_bits();
    let exp = (bits >> 23) as i32 - 127 + 7;
    if exp > 15 {
        return (sign | 0x7E, true);
    }
    let mant = bits & 0x7F_FFFF;
    // Round the 23-bit mantissa to 3 bits, ties to even; a carry moves into the exponent.
    let rounded = (mant + 0x7_FFFF + ((mant >> 20) & 1)) >> 20;
    let code = ((exp as u32) << 3) + rounded;
    if code > 0x7E {
        // 0x7F is NaN in e4m3fn: whatever rounds above 448 saturates.
        return (sign | 0x7E, true);
    }
    (sign | code as u8, false)
}

/// The value of every e4m3fn byte (0x7F and 0xFF, NaN, map to NaN).
pub fn e4m3_table() -> &'static [f32; 256] {
    static TABLE: std::sync::OnceLock<[f32; 256]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = [0f32; 256];
        for (b, v) in t.iter_mut().enumerate() {
            let e = ((b >> 3) & 0xF) as i32;
            let m = (b & 7) as f32;
            let mag = if e == 0xF && b & 7 == 7 {
                f32::NAN
            } else if e == 0 {
                m * (1.0 / 512.0)
            } else {
                (1.0 + m / 8.0) * 2f32.powi(e - 7)
            };
            *v = if b & 0x80 != 0 { -mag } else { mag };
        }
        t
    })
}

/// Reads element `i` of a little-endian bf16 or f32 buffer as f32 (exact).
fn load(src: &[u8], dtype: DType, i: usize) -> f32 {
    match dtype {
        DType::Bfloat16 => f32::from_bits((u16::from_le_bytes([src[2 * i], src[2 * i + 1]]) as u32) << 16),
        DType::Float32 => f32::from_le_bytes(src[4 * i..4 * i + 4].try_into().unwrap()),
        _ => unreachable!("the schema allows FP8 storage only for bfloat16 and float32 tensors"),
    }
}

/// Writes `v` into element `i` of a little-endian bf16 or f32 buffer (round to nearest even).
fn store(dst: &mut [u8], dtype: DType, i: usize, v: f32) {
    match dtype {
        DType::Bfloat16 => dst[2 * i..2 * i + 2].copy_from_slice(&f32_to_bf16(v).to_le_bytes()),
        DType::Float32 => dst[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes()),
        _ => unreachable!("the schema allows FP8 storage only for bfloat16 and float32 tensors"),
    }
}

/// bf16 nearest to `v`, ties to even (NaN stays NaN).
pub fn f32_to_bf16(v: f32) -> u16 {
    let b = v.to_bits();
    if v.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

/// Quantises `rows` rows of `width` channels (`src`, `dtype` elements) into `dst`
/// (`rows x precision.row_bytes(width)` bytes). Errors at the first NaN/Inf.
pub fn quantize(
    src: &[u8],
    dtype: DType,
    rows: usize,
    width: usize,
    p: &Precision,
    dst: &mut [u8],
) -> Result<QuantCounts, NonFinite> {
    let block = p.block_len(width as u64) as usize;
    let n_scales = p.scales_per_row(width as u64) as usize;
    let out_row = 4 * n_scales + width;
    debug_assert_eq!(dst.len(), rows * out_row);
    let mut counts = QuantCounts {
        values: (rows * width) as u64,
        ..Default::default()
    };
    let mut vals = vec![0f32; width];
    for (r, out) in dst.chunks_exact_mut(out_row).enumerate().take(rows) {
        for (c, v) in vals.iter_mut().enumerate() {
            *v = load(src, dtype, r * width + c);
            if !v.is_finite() {
                return Err(NonFinite {
                    row: r as u64,
                    channel: c as u64,
                });
            }
        }
        let (scales, bytes) = out.split_at_mut(4 * n_scales);
        for (j, (xs, qs)) in vals.chunks(block).zip(bytes.chunks_mut(block)).enumerate() {
            let amax = xs.iter().fold(0f32, |m, x| m.max(x.abs()));
            let scale = amax / E4M3_MAX;
            scales[4 * j..4 * j + 4].copy_from_slice(&scale.to_le_bytes());
            if scale == 0.0 {
                // An all-zero block (or one so small its scale underflows f32): stored as zeros.
                counts.zero_blocks += 1;
                qs.fill(0);
                continue;
            }
            for (q, &x) in qs.iter_mut().zip(xs) {
                let (b, sat) = f32_to_e4m3(x / scale);
                *q = b;
                counts.clamped += sat as u64;
            }
        }
    }
    Ok(counts)
}

/// Checks `rows` stored rows quantised elsewhere (`src`, laid out as [`quantize`] writes them:
/// the torch quantiser of `eagle_io.store.fp8` on the source device) before they are stored as
/// given: every scale finite, not negative and at most [`MAX_SCALE`] (a NaN or Inf in a block
/// makes its scale NaN or Inf; a larger finite scale dequantises to Inf), every byte of a block whose scale is 0 zero, no byte a NaN code (`0x7F`, `0xFF`).
/// Returns what quantising counted, but `clamped` (the quantiser reports it), or the row at
/// fault and what is wrong with it.
pub fn check_quantised(src: &[u8], rows: usize, width: usize, p: &Precision) -> Result<QuantCounts, (u64, String)> {
    let block = p.block_len(width as u64) as usize;
    let n_scales = p.scales_per_row(width as u64) as usize;
    let mut counts = QuantCounts {
        values: (rows * width) as u64,
        ..Default::default()
    };
    for (r, row) in src.chunks_exact(4 * n_scales + width).enumerate().take(rows) {
        let (scales, bytes) = row.split_at(4 * n_scales);
        for (j, qs) in bytes.chunks(block).enumerate() {
            let scale = f32::from_le_bytes(scales[4 * j..4 * j + 4].try_into().unwrap());
            let bad = |what: String| (r as u64, format!("scale {j} (channels from {}) {what}", j * block));
            if !scale.is_finite() {
                return Err(bad(format!(
                    "is {scale}: the block holds a NaN or Inf, which FP8 cannot store"
                )));
            }
            if scale.is_sign_negative() {
                return Err(bad(format!("is {scale}; scales are amax / 448, never negative")));
            }
            if scale > MAX_SCALE {
                return Err(bad(format!(
                    "is {scale}, above f32::MAX / 448 = {MAX_SCALE}: its values would dequantise to Inf"
                )));
            }
            if scale == 0.0 {
                counts.zero_blocks += 1;
                if let Some(c) = qs.iter().position(|&q| q != 0) {
                    return Err(bad(format!(
                        "is 0 but channel {} holds byte {:#04x}; a zero block stores zeros",
                        j * block + c,
                        qs[c]
                    )));
                }
            } else if let Some(c) = qs.iter().position(|&q| q & 0x7F == 0x7F) {
                return Err(bad(format!(
                    "covers channel {} holding {:#04x}, an e4m3fn NaN",
                    j * block + c,
                    qs[c]
                )));
            }
        }
    }
    Ok(counts)
}

/// Dequantises `rows` stored rows (`src`, as [`quantize`] writes them) into `dst`
/// (`rows x width` elements of `dtype`): `x = e4m3fn(q) x scale`, rounded once into `dtype`.
pub fn dequantize(src: &[u8], rows: usize, width: usize, p: &Precision, dtype: DType, dst: &mut [u8]) {
    let block = p.block_len(width as u64) as usize;
    let n_scales = p.scales_per_row(width as u64) as usize;
    let table = e4m3_table();
    for (r, row) in src.chunks_exact(4 * n_scales + width).enumerate().take(rows) {
        let (scales, bytes) = row.split_at(4 * n_scales);
        for (j, qs) in bytes.chunks(block).enumerate() {
            let scale = f32::from_le_bytes(scales[4 * j..4 * j + 4].try_into().unwrap());
            for (k, &q) in qs.iter().enumerate() {
                store(dst, dtype, r * width + j * block + k, table[q as usize] * scale);
            }
        }
    }
}

#[cfg(test)]
mod tests;
