//! The per-channel model of a byte plane (`LAYOUT_MODE_DELTA`): every channel (column) of a
//! hidden state has its own typical magnitude, so its high bytes cluster around its own value.
//! Subtracting each column's most frequent byte (mod 256) lines all channels up on 0, which
//! zstd's order-0 Huffman stage then codes close to the per-channel entropy
//! (benches/README.md: 1.45x -> 1.47x on real aux states), with sequential passes only.

/// Rows sampled per chunk to estimate the column modes.
const SAMPLE_ROWS: usize = 32;

/// Estimates each column's most frequent byte of the row-major `rows x cols` plane from up to
/// `SAMPLE_ROWS` evenly spaced rows (ties go to the smaller byte). `modes.len()` is `cols`.
pub fn column_modes(plane: &[u8], rows: usize, modes: &mut [u8]) {
    let cols = modes.len();
    let step = rows.div_ceil(SAMPLE_ROWS).max(1);
    let sampled: Vec<usize> = (0..rows).step_by(step).collect();
    let mut column = Vec::with_capacity(sampled.len());
    for (c, mode) in modes.iter_mut().enumerate() {
        column.clear();
        column.extend(sampled.iter().map(|&r| plane[r * cols + c]));
        column.sort_unstable();
        let (mut best, mut best_run, mut run) = (column.first().copied().unwrap_or(0), 0, 0);
        for (i, &v) in column.iter().enumerate() {
            run = if i > 0 && column[i - 1] == v { run + 1 } else { 1 };
            if run > best_run {
                (best, best_run) = (v, run);
            }
        }
        *mode = best;
    }
}

/// Writes `plane - modes[column]` (wrapping) into `out`, row by row.
pub fn subtract(plane: &[u8], modes: &[u8], out: &mut [u8]) {
    for (src, dst) in plane.chunks_exact(modes.len()).zip(out.chunks_exact_mut(modes.len())) {
        for ((d, s), m) in dst.iter_mut().zip(src).zip(modes) {
            *d = s.wrapping_sub(*m);
        }
    }
}

/// Restores plane `p` of `n` from its deltas straight into the interleaved elements:
/// `out[(r * cols + c) * n + p] = delta[r * cols + c] + modes[c]` (wrapping).
pub fn scatter_add(delta: &[u8], modes: &[u8], n: usize, p: usize, out: &mut [u8]) {
    let cols = modes.len();
    for (row, out_row) in delta.chunks_exact(cols).zip(out.chunks_exact_mut(cols * n)) {
        for ((d, m), e) in row.iter().zip(modes).zip(out_row.chunks_exact_mut(n)) {
            e[p] = d.wrapping_add(*m);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn modes_are_the_most_frequent_byte_per_column() {
        // 3 columns x 64 rows: column 0 mostly 7, column 1 mostly 200, column 2 a tie of 1 and 2.
        let plane: Vec<u8> = (0..64)
            .flat_map(|r| {
                [
                    if r % 4 == 0 { 9 } else { 7 },
                    if r % 5 == 0 { 3 } else { 200 },
                    1 + (r % 2) as u8,
                ]
            })
            .collect();
        let mut modes = [0u8; 3];
        column_modes(&plane, 64, &mut modes);
        assert_eq!(modes, [7, 200, 1]);
    }

    proptest! {
        #[test]
        fn subtract_then_scatter_add_restores_the_plane(rows in 1usize..80, cols in 1usize..60, seed in any::<u64>()) {
            let plane: Vec<u8> = (0..rows * cols).map(|i| (seed.wrapping_mul(i as u64 + 5) >> 19) as u8).collect();
            let mut modes = vec![0u8; cols];
            column_modes(&plane, rows, &mut modes);
            let mut delta = vec![0u8; plane.len()];
            subtract(&plane, &modes, &mut delta);
            let mut out = vec![0u8; 2 * plane.len()];
            scatter_add(&delta, &modes, 2, 1, &mut out);
            let back: Vec<u8> = out.iter().skip(1).step_by(2).copied().collect();
            prop_assert_eq!(back, plane);
        }
    }
}
