use super::*;
use proptest::prelude::*;

fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|&x| f32_to_bf16(x).to_le_bytes()).collect()
}

fn bf16_values(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(2)
        .map(|e| f32::from_bits((u16::from_le_bytes([e[0], e[1]]) as u32) << 16))
        .collect()
}

#[test]
fn e4m3_encoding_matches_the_table_and_rounds_to_nearest_even() {
    let t = e4m3_table();
    // Every finite code round-trips.
    for b in 0u8..=255 {
        if b & 0x7F == 0x7F {
            assert!(t[b as usize].is_nan());
            continue;
        }
        assert_eq!(f32_to_e4m3(t[b as usize]).0, b, "code {b:#x}");
    }
    assert_eq!(t[0x7E], 448.0);
    assert_eq!(t[0x08], 0.015625); // smallest normal
    assert_eq!(t[0x01], 1.0 / 512.0); // smallest subnormal
                                      // Ties to even: 1.0625 lies between 1.0 (mantissa 0) and 1.125 (mantissa 1).
    assert_eq!(f32_to_e4m3(1.0625), (0x38, false));
    assert_eq!(f32_to_e4m3(1.1875), (0x3A, false)); // between 1.125 and 1.25: to 1.25 (even)
                                                    // Subnormal tie: 1.5 / 512 -> 2 / 512.
    assert_eq!(f32_to_e4m3(1.5 / 512.0), (0x02, false));
    // Saturation is flagged; 460 still rounds to 448 without saturating.
    assert_eq!(f32_to_e4m3(460.0), (0x7E, false));
    assert_eq!(f32_to_e4m3(470.0), (0x7E, true));
    assert_eq!(f32_to_e4m3(-1e9), (0xFE, true));
    assert_eq!(f32_to_e4m3(-0.0), (0x80, false));
}

#[test]
fn per_token_scale_is_amax_over_448_and_its_max_maps_to_448() {
    let row = [0.5f32, -3.0, 1.0, 0.0];
    let src = bf16_bytes(&row);
    let p = Precision::PER_TOKEN;
    let mut q = vec![0u8; p.row_bytes(4) as usize];
    let counts = quantize(&src, DType::Bfloat16, 1, 4, &p, &mut q).unwrap();
    assert_eq!(q.len(), 4 + 4);
    assert_eq!(f32::from_le_bytes(q[0..4].try_into().unwrap()), 3.0 / 448.0);
    assert_eq!(q[4 + 1], 0xFE); // -448
    assert_eq!(q[4 + 3], 0);
    assert_eq!(
        counts,
        QuantCounts {
            values: 4,
            clamped: 0,
            zero_blocks: 0
        }
    );
}

#[test]
fn blocks_have_their_own_scales_and_a_short_last_block() {
    let p = Precision {
        storage: Fp8Type::E4m3fn,
        block: Some(2),
    };
    assert_eq!(p.scales_per_row(5), 3);
    assert_eq!(p.row_bytes(5), 12 + 5);
    let row = [1.0f32, 2.0, 100.0, -50.0, 0.25];
    let mut q = vec![0u8; 17];
    quantize(&bf16_bytes(&row), DType::Bfloat16, 1, 5, &p, &mut q).unwrap();
    let scales: Vec<f32> = q[..12]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(scales, vec![2.0 / 448.0, 100.0 / 448.0, 0.25 / 448.0]);
    let mut back = vec![0u8; 10];
    dequantize(&q, 1, 5, &p, DType::Bfloat16, &mut back);
    // Each block's largest magnitude comes back exactly (448 x amax / 448).
    let v = bf16_values(&back);
    assert_eq!((v[1], v[2], v[4]), (2.0, 100.0, 0.25));
}

#[test]
fn all_zero_rows_get_scale_zero_and_read_back_as_zero() {
    let p = Precision::PER_TOKEN;
    let src = bf16_bytes(&[0.0; 6]);
    let mut q = vec![0xAAu8; 2 * p.row_bytes(3) as usize];
    let counts = quantize(&src, DType::Bfloat16, 2, 3, &p, &mut q).unwrap();
    assert_eq!(counts.zero_blocks, 2);
    assert!(q.iter().all(|&b| b == 0));
    let mut back = vec![0xFFu8; 12];
    dequantize(&q, 2, 3, &p, DType::Bfloat16, &mut back);
    assert!(back.iter().all(|&b| b == 0));
}

#[test]
fn nan_and_inf_are_refused_with_their_position() {
    let p = Precision::PER_TOKEN;
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let src = bf16_bytes(&[1.0, 2.0, 3.0, bad]);
        let mut q = vec![0u8; 2 * p.row_bytes(2) as usize];
        assert_eq!(
            quantize(&src, DType::Bfloat16, 2, 2, &p, &mut q),
            Err(NonFinite { row: 1, channel: 1 })
        );
    }
}

#[test]
fn subnormal_and_tiny_inputs() {
    // A row whose amax is a bf16 subnormal: the scale is an f32 subnormal, still nonzero.
    let tiny = f32::from_bits(1 << 16); // the smallest positive bf16
    let p = Precision::PER_TOKEN;
    let mut q = vec![0u8; p.row_bytes(2) as usize];
    quantize(&bf16_bytes(&[tiny, -tiny]), DType::Bfloat16, 1, 2, &p, &mut q).unwrap();
    let mut back = vec![0u8; 4];
    dequantize(&q, 1, 2, &p, DType::Bfloat16, &mut back);
    assert_eq!(bf16_values(&back), vec![tiny, -tiny]);
    // Values below 2^-9 of the row's scale flush to (signed) zero.
    let mut q = vec![0u8; p.row_bytes(3) as usize];
    quantize(
        &bf16_bytes(&[448.0, 1.0 / 2048.0, -1.0 / 2048.0]),
        DType::Bfloat16,
        1,
        3,
        &p,
        &mut q,
    )
    .unwrap();
    assert_eq!(&q[4..], &[0x7E, 0x00, 0x80]);
}

#[test]
fn float32_tensors_quantise_and_dequantise_too() {
    let row = [3.0f32, -1.5, 0.1];
    let src: Vec<u8> = row.iter().flat_map(|v| v.to_le_bytes()).collect();
    let p = Precision::PER_TOKEN;
    let mut q = vec![0u8; p.row_bytes(3) as usize];
    quantize(&src, DType::Float32, 1, 3, &p, &mut q).unwrap();
    let mut back = vec![0u8; 12];
    dequantize(&q, 1, 3, &p, DType::Float32, &mut back);
    let v: Vec<f32> = back
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(v[0], 3.0);
    assert_eq!(v[1], -1.5);
    assert!((v[2] - 0.1).abs() <= 0.1 / 16.0, "{}", v[2]);
}

proptest! {
    /// Within a block, every element's error is at most half an e4m3 step at its magnitude
    /// (2^-4 relative for normals), or half the subnormal step 2^-10 x scale x 448... i.e.
    /// `scale / 1024`; plus the final bf16 rounding (2^-9 relative).
    #[test]
    fn round_trip_error_is_within_the_documented_bound(
        rows in 1usize..6, width in 1usize..70, block in prop::option::of(1u32..40),
        seed in any::<u64>(), outlier in 1f32..1000.0,
    ) {
        let p = Precision { storage: Fp8Type::E4m3fn, block };
        let vals: Vec<f32> = (0..rows * width).map(|i| {
            let h = seed.wrapping_mul(0x9E3779B97F4A7C15).wrapping_add(i as u64 * 0x632BE59BD9B4E5B).rotate_left(17);
            let v = ((h >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0;
            if i % width == 3 { v * outlier } else { v }
        }).collect();
        let src = bf16_bytes(&vals);
        let x = bf16_values(&src);
        let mut q = vec![0u8; rows * p.row_bytes(width as u64) as usize];
        let counts = quantize(&src, DType::Bfloat16, rows, width, &p, &mut q).unwrap();
        prop_assert_eq!(counts.clamped, 0);
        let mut back = vec![0u8; src.len()];
        dequantize(&q, rows, width, &p, DType::Bfloat16, &mut back);
        let y = bf16_values(&back);
        let b = p.block_len(width as u64) as usize;
        for r in 0..rows {
            for c in 0..width {
                let i = r * width + c;
                let blk = &x[r * width + (c / b) * b..(r * width + ((c / b) + 1) * b).min((r + 1) * width)];
                let scale = blk.iter().fold(0f32, |m, v| m.max(v.abs())) / 448.0;
                let bound = (x[i].abs() / 16.0).max(scale / 1024.0) * 1.01 + x[i].abs() / 256.0;
                prop_assert!((y[i] - x[i]).abs() <= bound, "x {} y {} bound {}", x[i], y[i], bound);
            }
        }
    }
}

#[test]
fn rows_quantised_elsewhere_are_checked_and_counted_like_the_writers_own() {
    let p = Precision {
        storage: Fp8Type::E4m3fn,
        block: Some(2),
    };
    // Token 0: a real row; token 1: an all-zero row (two zero blocks).
    let src = bf16_bytes(&[0.5, -3.0, 1.0, 0.25, 0.0, 0.0, 0.0, 0.0]);
    let mut q = vec![0u8; 2 * p.row_bytes(4) as usize];
    let own = quantize(&src, DType::Bfloat16, 2, 4, &p, &mut q).unwrap();
    assert_eq!(check_quantised(&q, 2, 4, &p), Ok(own));
    assert_eq!(own.zero_blocks, 2);
    let rb = p.row_bytes(4) as usize;
    let bad = |edit: &dyn Fn(&mut [u8])| {
        let mut b = q.clone();
        edit(&mut b);
        check_quantised(&b, 2, 4, &p).unwrap_err()
    };
    let e = bad(&|b| b[4..8].copy_from_slice(&f32::NAN.to_le_bytes()));
    assert_eq!(e.0, 0);
    assert!(e.1.starts_with("scale 1 (channels from 2) is NaN"), "{}", e.1);
    assert!(bad(&|b| b[rb..rb + 4].copy_from_slice(&f32::INFINITY.to_le_bytes()))
        .1
        .contains("is inf"));
    assert!(bad(&|b| b[0..4].copy_from_slice(&(-1.0f32).to_le_bytes()))
        .1
        .contains("never negative"));
    assert!(bad(&|b| b[rb..rb + 4].copy_from_slice(&(-0.0f32).to_le_bytes()))
        .1
        .contains("never negative"));
    let e = bad(&|b| b[rb + 8 + 3] = 0x80);
    assert_eq!(
        e,
        (
            1,
            "scale 1 (channels from 2) is 0 but channel 3 holds byte 0x80; a zero block stores zeros".into()
        )
    );
    assert!(bad(&|b| b[8] = 0xFF)
        .1
        .contains("channel 0 holding 0xff, an e4m3fn NaN"));
}

#[test]
fn check_quantised_refuses_finite_scales_that_dequantise_to_inf() {
    // A finite scale above f32::MAX / 448 was accepted, and a code of 448 then dequantised to inf.
    let p = Precision {
        storage: Fp8Type::E4m3fn,
        block: Some(2),
    };
    let src = bf16_bytes(&[0.5, -3.0, 1.0, 0.25, 2.0, 1.0, -1.0, 0.5]);
    let mut q = vec![0u8; 2 * p.row_bytes(4) as usize];
    quantize(&src, DType::Bfloat16, 2, 4, &p, &mut q).unwrap();
    let rb = p.row_bytes(4) as usize;
    let with_scale = |scale: f32| {
        let mut b = q.clone();
        b[rb + 4..rb + 8].copy_from_slice(&scale.to_le_bytes()); // row 1, scale 1
        b[rb + 8 + 2] = 0x7E; // channel 2: e4m3fn 448, the largest code
        b
    };
    let at_max = with_scale(MAX_SCALE);
    assert!(check_quantised(&at_max, 2, 4, &p).is_ok());
    let mut back = vec![0u8; 2 * 4 * 4];
    dequantize(&at_max, 2, 4, &p, DType::Float32, &mut back);
    let x = f32::from_le_bytes(back[4 * 6..4 * 7].try_into().unwrap());
    assert!(x.is_finite() && x > 3.0e38, "{x}");
    for scale in [MAX_SCALE.next_up(), 1.0e38, f32::MAX] {
        let e = check_quantised(&with_scale(scale), 2, 4, &p).unwrap_err();
        assert_eq!(e.0, 1, "row 1");
        assert!(
            e.1.starts_with(&format!("scale 1 (channels from 2) is {scale}, above f32::MAX / 448")),
            "{}",
            e.1
        );
    }
}
