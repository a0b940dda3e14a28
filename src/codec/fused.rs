//! The fused kernels of 2-byte elements (format v2): one sequential pass per chunk that splits
//! the elements into the modelled plane and the raw plane and subtracts the channel modes on
//! the way (encode), and one pass that adds the modes back and interleaves the raw plane
//! straight into the caller's buffer (decode). No zero-filled scratch and no per-plane scatter.
//!
//! Two byte mappings of a little-endian `u16` element `u` share the kernels:
//! - `LAYOUT_MODE_DELTA` (v1): plane 0 = `u & 0xFF`, plane 1 = `u >> 8`;
//! - `LAYOUT_EXP_MODE_DELTA` (v2, bf16): plane 1 = the 8-bit exponent `(u >> 7) & 0xFF`,
//!   plane 0 = sign and 7 mantissa bits `((u >> 8) & 0x80) | (u & 0x7F)`. Every channel's
//!   exponent clusters tightly, so the modelled plane codes smaller (benches/README.md).
//!
//! The loops are plain zips over rows that LLVM auto-vectorises, in byte operations only; on
//! x86-64 CPUs with AVX2 (detected at run time) they run compiled for AVX2, 32 elements per
//! step instead of the baseline build's SSE2 8 (benches/README.md).

/// Splits element `u` into (plane 0 byte, plane 1 byte) for the exponent mapping.
#[inline(always)]
fn split_exp(u: u16) -> (u8, u8) {
    ((((u >> 8) & 0x80) | (u & 0x7F)) as u8, (u >> 7) as u8)
}

#[inline(always)]
fn split_bytes(u: u16) -> (u8, u8) {
    (u as u8, (u >> 8) as u8)
}

/// Rows sampled per chunk to estimate the channel modes.
const SAMPLE_ROWS: usize = 32;

/// Each channel's most frequent plane-1 byte (exponent mapping when `exp`) over up to
/// `SAMPLE_ROWS` evenly spaced rows of the `rows x modes.len()` elements in `data` (ties go
/// to the smaller byte). Only the sampled rows are read.
pub fn channel_modes(data: &[u8], rows: usize, exp: bool, modes: &mut [u8]) {
    /// Channels counted at once: their 256-entry tables (16 KB) stay in L1.
    const BLOCK: usize = 64;
    let cols = modes.len();
    let step = rows.div_ceil(SAMPLE_ROWS).max(1);
    let picked: Vec<usize> = (0..rows).step_by(step).collect();
    let byte = |e: &[u8]| {
        let u = u16::from_le_bytes([e[0], e[1]]);
        if exp {
            split_exp(u).1
        } else {
            split_bytes(u).1
        }
    };
    // Two passes in row order, no gather buffer and no sort. The first only counts. The second
    // reads each (channel, byte)'s full count at its first occurrence and zeroes it, so every
    // distinct byte is weighed once (later occurrences read 0) and the tables are clean for
    // the next block; the best (most frequent, the smaller on ties) rarely changes, so its
    // branch is predicted. A running best updated while counting stored on nearly every
    // element and cost twice as much on wide rows.
    let mut counts = [[0u8; 256]; BLOCK];
    let mut best = [(0u8, 0u8); BLOCK];
    for c0 in (0..cols).step_by(BLOCK) {
        let w = BLOCK.min(cols - c0);
        best[..w].fill((0, 0));
        let rows_of_block = || {
            picked
                .iter()
                .map(move |&r| &data[(r * cols + c0) * 2..(r * cols + c0 + w) * 2])
        };
        for row in rows_of_block() {
            for (e, table) in row.chunks_exact(2).zip(counts.iter_mut()) {
                table[byte(e) as usize] += 1;
            }
        }
        for row in rows_of_block() {
            for ((e, table), (b, bn)) in row.chunks_exact(2).zip(counts.iter_mut()).zip(best.iter_mut()) {
                let v = byte(e);
                let n = std::mem::take(&mut table[v as usize]);
                if n > *bn || (n == *bn && v < *b) {
                    (*b, *bn) = (v, n);
                }
            }
        }
        for (m, (b, _)) in modes[c0..c0 + w].iter_mut().zip(&best) {
            *m = *b;
        }
    }
}

/// The encode pass: for every element of the `rows x modes.len()` chunk `data`, writes its
/// plane-0 byte to `raw` and its plane-1 byte minus its channel's mode (mod 256) to `delta`
/// (both `rows x cols`, row-major).
pub fn split_subtract(data: &[u8], exp: bool, modes: &[u8], raw: &mut [u8], delta: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (detected at run time just above), all `split_subtract_avx2` needs.
        return unsafe { split_subtract_avx2(data, exp, modes, raw, delta) };
    }
    split_subtract_any(data, exp, modes, raw, delta)
}

/// `split_subtract` compiled for AVX2: the same loops, 32 elements per step instead of SSE2's 8.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn split_subtract_avx2(data: &[u8], exp: bool, modes: &[u8], raw: &mut [u8], delta: &mut [u8]) {
    split_subtract_any(data, exp, modes, raw, delta)
}

#[inline(always)]
fn split_subtract_any(data: &[u8], exp: bool, modes: &[u8], raw: &mut [u8], delta: &mut [u8]) {
    if exp {
        split_subtract_with(data, modes, raw, delta, split_exp_bytes)
    } else {
        split_subtract_with(data, modes, raw, delta, |b0, b1| (b0, b1))
    }
}

/// `split_exp` on the element's two bytes, in byte operations only (they vectorise 32 wide).
#[inline(always)]
fn split_exp_bytes(b0: u8, b1: u8) -> (u8, u8) {
    ((b1 & 0x80) | (b0 & 0x7F), (b1 << 1) | (b0 >> 7))
}

#[inline(always)]
fn split_subtract_with(
    data: &[u8],
    modes: &[u8],
    raw: &mut [u8],
    delta: &mut [u8],
    split: impl Fn(u8, u8) -> (u8, u8),
) {
    let cols = modes.len();
    let rows = data
        .chunks_exact(2 * cols)
        .zip(raw.chunks_exact_mut(cols))
        .zip(delta.chunks_exact_mut(cols));
    for ((src, r), d) in rows {
        // Zips over slices of one known length: no bounds checks, and LLVM vectorises the loop.
        let (src, r, d, m) = (&src[..2 * cols], &mut r[..cols], &mut d[..cols], &modes[..cols]);
        for (((e, r), d), &m) in src.chunks_exact(2).zip(r.iter_mut()).zip(d.iter_mut()).zip(m) {
            let (lo, hi) = split(e[0], e[1]);
            *r = lo;
            *d = hi.wrapping_sub(m);
        }
    }
}

/// Plane 1 as stored raw (no model): the plane-1 byte of every element.
pub fn plane1(data: &[u8], exp: bool, out: &mut [u8]) {
    for (e, o) in data.chunks_exact(2).zip(out.iter_mut()) {
        let u = u16::from_le_bytes([e[0], e[1]]);
        *o = if exp { split_exp(u).1 } else { split_bytes(u).1 };
    }
}

/// The decode pass: element `[r][c]` of `out` is rebuilt from plane 0 byte
/// `lo[r*C+c] + lo_modes[c]` and plane 1 byte `hi[r*C+c] + hi_modes[c]` (mod 256; a raw
/// plane's modes are all 0). `out` is `2 x lo.len()` bytes.
pub fn join_add(lo: &[u8], lo_modes: &[u8], hi: &[u8], hi_modes: &[u8], exp: bool, out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (detected at run time just above), all `join_add_avx2` needs.
        return unsafe { join_add_avx2(lo, lo_modes, hi, hi_modes, exp, out) };
    }
    join_add_any(lo, lo_modes, hi, hi_modes, exp, out)
}

/// `join_add` compiled for AVX2: the same loops, 32 elements per step instead of SSE2's 8
/// (3-4x the speed of the SSE2 build on 1 MiB chunks, benches/README.md).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn join_add_avx2(lo: &[u8], lo_modes: &[u8], hi: &[u8], hi_modes: &[u8], exp: bool, out: &mut [u8]) {
    join_add_any(lo, lo_modes, hi, hi_modes, exp, out)
}

#[inline(always)]
fn join_add_any(lo: &[u8], lo_modes: &[u8], hi: &[u8], hi_modes: &[u8], exp: bool, out: &mut [u8]) {
    if exp {
        join_add_with(lo, lo_modes, hi, hi_modes, out, join_exp_bytes)
    } else {
        join_add_with(lo, lo_modes, hi, hi_modes, out, |lo, hi| [lo, hi])
    }
}

/// `join_exp` as the element's two little-endian bytes, in byte operations only (they
/// vectorise 32 wide; the `u16` form widened every lane first).
#[inline(always)]
fn join_exp_bytes(lo: u8, hi: u8) -> [u8; 2] {
    [(lo & 0x7F) | (hi << 7), (lo & 0x80) | (hi >> 1)]
}

#[inline(always)]
fn join_add_with(
    lo: &[u8],
    lo_modes: &[u8],
    hi: &[u8],
    hi_modes: &[u8],
    out: &mut [u8],
    join: impl Fn(u8, u8) -> [u8; 2],
) {
    let cols = lo_modes.len();
    debug_assert_eq!(hi_modes.len(), cols);
    let rows = lo
        .chunks_exact(cols)
        .zip(hi.chunks_exact(cols))
        .zip(out.chunks_exact_mut(2 * cols));
    for ((l, h), o) in rows {
        let (l, lm, h, hm, o) = (
            &l[..cols],
            &lo_modes[..cols],
            &h[..cols],
            &hi_modes[..cols],
            &mut o[..2 * cols],
        );
        let lanes = o.chunks_exact_mut(2).zip(l).zip(lm).zip(h).zip(hm);
        for ((((o, &l), &lm), &h), &hm) in lanes {
            let [a, b] = join(l.wrapping_add(lm), h.wrapping_add(hm));
            o[0] = a;
            o[1] = b;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Plain scalar statement of both mappings, bit by bit, for the kernels to match.
    fn scalar_split(u: u16, exp: bool) -> (u8, u8) {
        if !exp {
            return ((u & 0xFF) as u8, (u >> 8) as u8);
        }
        let sign = (u >> 15) & 1;
        let exponent = (u >> 7) & 0xFF;
        let mantissa = u & 0x7F;
        (((sign << 7) | mantissa) as u8, exponent as u8)
    }

    fn elements(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .flat_map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x as u16).to_le_bytes()
            })
            .collect()
    }

    #[test]
    fn exponent_mapping_is_a_bijection_on_all_u16() {
        for u in 0..=u16::MAX {
            let (lo, hi) = split_exp(u);
            assert_eq!((lo, hi), scalar_split(u, true));
            let [b0, b1] = u.to_le_bytes();
            assert_eq!(split_exp_bytes(b0, b1), (lo, hi));
            assert_eq!(join_exp_bytes(lo, hi), [b0, b1]);
        }
    }

    #[test]
    fn nan_inf_and_signed_zero_keep_their_bits() {
        for u in [0x7FC0u16, 0xFFC1, 0x7F80, 0xFF80, 0x8000, 0x0000, 0x0001, 0x807F] {
            let (lo, hi) = split_exp(u);
            assert_eq!(join_exp_bytes(lo, hi), u.to_le_bytes(), "{u:#06x}");
        }
    }

    #[test]
    fn modes_are_the_most_frequent_exponent_per_channel() {
        // 2 channels x 64 rows: channel 0 is 1.0 (exponent 127) except every 4th row 4.0 (129);
        // channel 1 alternates 0.5 (126) and 2.0 (128): a tie, the smaller byte wins.
        let bf16 = |f: f32| ((f.to_bits() >> 16) as u16).to_le_bytes();
        let data: Vec<u8> = (0..64)
            .flat_map(|r| {
                let a = if r % 4 == 0 { 4.0 } else { 1.0 };
                let b = if r % 2 == 0 { 0.5 } else { 2.0 };
                [bf16(a), bf16(b)].concat()
            })
            .collect();
        let mut modes = [0u8; 2];
        channel_modes(&data, 64, true, &mut modes);
        assert_eq!(modes, [127, 126]);
        channel_modes(&data, 64, false, &mut modes);
        assert_eq!(modes, [0x3F, 0x3F]);
    }

    proptest! {
        #[test]
        fn kernels_match_the_scalar_statement(rows in 1usize..40, cols in 1usize..70, seed in any::<u64>(),
                                              exp in any::<bool>()) {
            let data = elements(rows * cols, seed);
            let mut modes = vec![0u8; cols];
            channel_modes(&data, rows, exp, &mut modes);
            let (mut raw, mut delta, mut hi) = (vec![0u8; rows * cols], vec![0u8; rows * cols], vec![0u8; rows * cols]);
            split_subtract(&data, exp, &modes, &mut raw, &mut delta);
            plane1(&data, exp, &mut hi);
            for i in 0..rows * cols {
                let u = u16::from_le_bytes([data[2 * i], data[2 * i + 1]]);
                let (lo, h) = scalar_split(u, exp);
                prop_assert_eq!(raw[i], lo);
                prop_assert_eq!(hi[i], h);
                prop_assert_eq!(delta[i], h.wrapping_sub(modes[i % cols]));
            }
            let zeros = vec![0u8; cols];
            let mut out = vec![0u8; data.len()];
            join_add(&raw, &zeros, &delta, &modes, exp, &mut out);
            prop_assert_eq!(&out, &data);
            // Modes on plane 0 too (v1's modelled zstd low plane).
            let lo_modes: Vec<u8> = (0..cols).map(|c| (c * 37) as u8).collect();
            let lo_delta: Vec<u8> = raw.iter().enumerate().map(|(i, b)| b.wrapping_sub(lo_modes[i % cols])).collect();
            join_add(&lo_delta, &lo_modes, &hi, &zeros, exp, &mut out);
            prop_assert_eq!(&out, &data);
            // The portable build of both passes (what a CPU without AVX2 runs) gives the same bytes.
            let (mut raw2, mut delta2) = (vec![0u8; rows * cols], vec![0u8; rows * cols]);
            split_subtract_any(&data, exp, &modes, &mut raw2, &mut delta2);
            prop_assert_eq!((&raw2, &delta2), (&raw, &delta));
            let mut out2 = vec![0u8; data.len()];
            join_add_any(&raw, &zeros, &delta, &modes, exp, &mut out2);
            prop_assert_eq!(&out2, &data);
        }
    }
}
