//! Byte planes: plane `p` holds byte `p` of every little-endian element. Split for encoding,
//! scattered back into the elements for decoding.
//! For bf16, plane 1 (sign, exponent, top mantissa bit) compresses well; plane 0 (the
//! low mantissa) is near-random and is usually stored raw.

/// Splits `data` (elements of `planes.len()` bytes) into the plane buffers.
/// Each plane must be exactly `data.len() / planes.len()` bytes long.
pub fn split(data: &[u8], planes: &mut [&mut [u8]]) {
    let n = planes.len();
    debug_assert!(planes.iter().all(|p| p.len() * n == data.len()));
    match planes {
        [p0, p1] => {
            for ((e, a), b) in data.chunks_exact(2).zip(p0.iter_mut()).zip(p1.iter_mut()) {
                *a = e[0];
                *b = e[1];
            }
        }
        [p0, p1, p2, p3] => {
            let outs = p0.iter_mut().zip(p1.iter_mut()).zip(p2.iter_mut()).zip(p3.iter_mut());
            for (e, (((a, b), c), d)) in data.chunks_exact(4).zip(outs) {
                *a = e[0];
                *b = e[1];
                *c = e[2];
                *d = e[3];
            }
        }
        _ => {
            for (i, e) in data.chunks_exact(n).enumerate() {
                for (p, plane) in planes.iter_mut().enumerate() {
                    plane[i] = e[p];
                }
            }
        }
    }
}

/// Writes row-major plane `p` of `n` into its bytes of the interleaved elements:
/// `out[i * n + p] = plane[i]`.
pub fn scatter_row_major(plane: &[u8], n: usize, p: usize, out: &mut [u8]) {
    debug_assert_eq!(plane.len() * n, out.len());
    for (e, v) in out.chunks_exact_mut(n).zip(plane) {
        e[p] = *v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn split_then_scatter_is_identity(n in prop::sample::select(vec![1usize, 2, 3, 4, 8]),
                                        elems in 0usize..300, seed in any::<u64>()) {
            let data: Vec<u8> = (0..n * elems).map(|i| (seed.wrapping_mul(i as u64 + 7) >> 13) as u8).collect();
            let mut bufs = vec![vec![0u8; elems]; n];
            let mut views: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
            split(&data, &mut views);
            for (p, plane) in bufs.iter().enumerate() {
                for (i, b) in plane.iter().enumerate() {
                    prop_assert_eq!(*b, data[i * n + p]);
                }
            }
            let mut out = vec![0u8; data.len()];
            for (p, plane) in bufs.iter().enumerate() {
                scatter_row_major(plane, n, p, &mut out);
            }
            prop_assert_eq!(out, data);
        }
    }
}
