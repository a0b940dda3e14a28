//! FP8 rows of one tensor as one chunk: quantised here from the tensor's dtype
//! (`crate::quant::quantize`), or given quantised on the source device and checked
//! (`crate::quant::check_quantised`), then entropy-coded as chunk layout 3 (`fp8.rs`). Both
//! inputs make the same chunk of the same values. Spec: docs/FORMAT.md, "FP8 storage".

use std::cell::RefCell;

use crate::quant::{self, Precision, QuantCounts};
use crate::schema::TensorSpec;

use super::{fp8, CodecOptions, EncodedChunk};

/// What the rows given to [`encode_fp8_rows`] hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fp8Input {
    /// Rows in the tensor's dtype (bf16 / f32), quantised here.
    Unquantised,
    /// Rows as stored (per row: the f32 scales, then the e4m3fn bytes), quantised on the source
    /// device: checked, then coded as given.
    Quantised,
}

thread_local! {
    /// The encoding thread's quantised rows, reused across chunks (a fresh buffer per chunk
    /// would cost a page fault per page).
    static FP8_ROWS: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Encodes `rows` rows of tensor `spec` (starting at the sample's row `first`) stored in
/// precision `p`. Returns the chunk and the quantiser's counts (for [`Fp8Input::Quantised`]:
/// the values and zero blocks seen; the clamps were counted where the rows were quantised).
///
/// Errors (a message naming the tensor and token): a NaN or Inf in unquantised rows (FP8 cannot
/// hold it), or quantised rows that do not check (a bad scale or byte).
pub fn encode_fp8_rows(
    data: &[u8],
    input: Fp8Input,
    first: u64,
    rows: usize,
    spec: &TensorSpec,
    p: &Precision,
    opts: &CodecOptions,
) -> Result<(EncodedChunk, QuantCounts), String> {
    let width = spec.elems_per_row() as usize;
    let n_scales = p.scales_per_row(width as u64) as usize;
    match input {
        Fp8Input::Quantised => {
            let counts = quant::check_quantised(data, rows, width, p).map_err(|(row, what)| {
                format!(
                    "tensor {:?} given quantised (FP8 scales and bytes), token {}: {what}",
                    spec.name,
                    first + row
                )
            })?;
            Ok((fp8::encode(data, rows, width, n_scales, opts), counts))
        }
        Fp8Input::Unquantised => FP8_ROWS.with_borrow_mut(|q| {
            // `quantize` writes every byte: only growth is zero-filled.
            let n = rows * spec.stored_row_bytes() as usize;
            q.resize(n, 0);
            let q = &mut q[..n];
            let counts = quant::quantize(data, spec.dtype, rows, width, p, q).map_err(|nf| {
                format!(
                    "tensor {:?} holds a NaN or Inf at token {}, channel {}: FP8 storage cannot hold it \
                     (the capture's nonfinite policy skips or refuses such samples before writing)",
                    spec.name,
                    first + nf.row,
                    nf.channel
                )
            })?;
            Ok((fp8::encode(q, rows, width, n_scales, opts), counts))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::quant::f32_to_bf16;

    fn spec(p: Precision) -> TensorSpec {
        TensorSpec {
            name: "hidden_states".into(),
            dtype: DType::Bfloat16,
            width: Some(4),
            precision: Some(p),
        }
    }

    #[test]
    fn rows_quantised_elsewhere_make_the_chunk_quantising_here_makes() {
        let p = Precision::PER_TOKEN;
        let vals = [0.5f32, -3.0, 1.0, 0.25, 7.0, 0.0, -0.125, 2.0, 0.0, 0.0, 0.0, 0.0];
        let src: Vec<u8> = vals.iter().flat_map(|&x| f32_to_bf16(x).to_le_bytes()).collect();
        let (s, opts) = (spec(p), CodecOptions::default());
        let (own, own_counts) = encode_fp8_rows(&src, Fp8Input::Unquantised, 0, 3, &s, &p, &opts).unwrap();
        let mut q = vec![0u8; 3 * s.stored_row_bytes() as usize];
        quant::quantize(&src, DType::Bfloat16, 3, 4, &p, &mut q).unwrap();
        let (given, given_counts) = encode_fp8_rows(&q, Fp8Input::Quantised, 0, 3, &s, &p, &opts).unwrap();
        assert_eq!((own.desc, &own.payload), (given.desc, &given.payload));
        assert_eq!((own_counts.values, own_counts.zero_blocks), (12, 1));
        assert_eq!((given_counts.values, given_counts.zero_blocks), (12, 1));
    }

    #[test]
    fn errors_name_the_tensor_and_the_token() {
        let p = Precision::PER_TOKEN;
        let mut src: Vec<u8> = [1.0f32; 8].iter().flat_map(|&x| f32_to_bf16(x).to_le_bytes()).collect();
        src[12..14].copy_from_slice(&f32_to_bf16(f32::NAN).to_le_bytes()); // token 1, channel 2
        let (s, opts) = (spec(p), CodecOptions::default());
        let e = encode_fp8_rows(&src, Fp8Input::Unquantised, 10, 2, &s, &p, &opts)
            .err()
            .expect("refused");
        assert!(
            e.contains("\"hidden_states\"") && e.contains("token 11, channel 2"),
            "{e}"
        );
        let mut q = vec![0u8; 2 * s.stored_row_bytes() as usize];
        q[..4].copy_from_slice(&f32::NAN.to_le_bytes()); // token 0's scale
        let e = encode_fp8_rows(&q, Fp8Input::Quantised, 10, 2, &s, &p, &opts)
            .err()
            .expect("refused");
        assert!(e.contains("given quantised") && e.contains("token 10"), "{e}");
    }
}
