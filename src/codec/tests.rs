use super::*;
use proptest::prelude::*;

const ALL: [DType; 9] = [
    DType::Bool,
    DType::Uint8,
    DType::Int8,
    DType::Int16,
    DType::Int32,
    DType::Int64,
    DType::Float16,
    DType::Bfloat16,
    DType::Float32,
];

/// bf16 values shaped like real hidden states: small magnitudes (few distinct exponents),
/// random mantissas.
fn hidden_like_bf16(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(2 * n);
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let f = ((x % 2001) as f32 - 1000.0) / 400.0;
        let bits = (f.to_bits() >> 16) as u16;
        out.extend_from_slice(&bits.to_le_bytes());
    }
    out
}

fn roundtrip(data: &[u8], rows: u32, dtype: DType) -> EncodedChunk {
    let enc = encode_chunk(data, rows, dtype, &CodecOptions::default());
    let parsed = ChunkDesc::from_bytes(&enc.desc.to_bytes()).unwrap();
    assert_eq!(parsed, enc.desc);
    let mut out = vec![0xAAu8; data.len()];
    decode_chunk(&parsed, &enc.payload, &mut out).unwrap();
    assert_eq!(out, data);
    enc
}

#[test]
fn bf16_hidden_states_use_planes_with_raw_low_byte() {
    let data = hidden_like_bf16(300_000, 7);
    let enc = roundtrip(&data, 300, DType::Bfloat16);
    assert_eq!(enc.desc.codec, CODEC_PLANES);
    assert_eq!(enc.desc.planes, 2);
    assert_eq!(enc.desc.layout, LAYOUT_EXP_MODE_DELTA);
    // The sign + mantissa plane is noise: raw. The exponent plane compresses.
    assert_eq!(enc.desc.plane_zstd, 0b10);
    assert_eq!(enc.desc.stored[0], 300_000);
    assert!(
        enc.desc.stored[1] < 300_000 / 2,
        "high plane stored {}",
        enc.desc.stored[1]
    );
}

#[test]
fn incompressible_ints_are_stored_raw() {
    let data: Vec<u8> = (0..50_000u64)
        .flat_map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes())
        .collect();
    let enc = roundtrip(&data, 50_000, DType::Int64);
    assert_eq!(enc.desc.codec, CODEC_RAW);
    assert_eq!(enc.payload.len(), data.len());
}

#[test]
fn token_ids_are_zstd() {
    let data: Vec<u8> = (0..4096i64).flat_map(|i| (i % 50_000).to_le_bytes()).collect();
    let enc = roundtrip(&data, 4096, DType::Int64);
    assert_eq!(enc.desc.codec, CODEC_ZSTD);
    assert!(enc.payload.len() < data.len() / 2);
}

#[test]
fn empty_chunk_roundtrips_raw() {
    for dtype in ALL {
        let enc = roundtrip(&[], 0, dtype);
        assert_eq!(enc.desc.codec, CODEC_RAW);
        assert!(enc.payload.is_empty());
    }
}

#[test]
fn descriptor_rejects_bad_fields() {
    let good = ChunkDesc {
        codec: CODEC_PLANES,
        planes: 2,
        plane_zstd: 0b10,
        layout: LAYOUT_MODE_DELTA,
        rows: 3,
        stored: [6, 4, 0, 0],
    };
    assert!(ChunkDesc::from_bytes(&good.to_bytes()).is_ok());
    for bad in [
        ChunkDesc { codec: 9, ..good },
        ChunkDesc { planes: 3, ..good },
        ChunkDesc {
            plane_zstd: 0b100,
            ..good
        },
        ChunkDesc {
            stored: [6, 4, 1, 0],
            ..good
        },
        ChunkDesc {
            codec: CODEC_RAW,
            ..good
        },
    ] {
        assert!(ChunkDesc::from_bytes(&bad.to_bytes()).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn wrong_payload_sizes_are_errors_not_panics() {
    let data = hidden_like_bf16(10_000, 3);
    let enc = encode_chunk(&data, 10, DType::Bfloat16, &CodecOptions::default());
    let mut out = vec![0u8; data.len()];
    // Truncated payload.
    let short = &enc.payload[..enc.payload.len() - 1];
    assert!(decode_chunk(&enc.desc, short, &mut out).is_err());
    // Output of the wrong size.
    let mut small = vec![0u8; data.len() - 2];
    assert!(decode_chunk(&enc.desc, &enc.payload, &mut small).is_err());
    // A flipped byte inside the zstd frame of the high plane.
    let mut flipped = enc.payload.clone();
    let at = enc.desc.stored[0] as usize + 5;
    flipped[at] ^= 0xFF;
    let r = decode_chunk(&enc.desc, &flipped, &mut out);
    assert!(r.is_err() || out != data);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn every_dtype_roundtrips_bit_exactly(idx in 0usize..9, rows in 0u32..70, width in 1usize..400,
                                          seed in any::<u64>(), smooth in any::<bool>()) {
        let dtype = ALL[idx];
        let len = rows as usize * width * dtype.size();
        let data: Vec<u8> = if smooth {
            (0..len).map(|i| ((i / 64) as u64 ^ seed) as u8).collect()
        } else {
            let mut x = seed | 1;
            (0..len).map(|_| { x ^= x << 13; x ^= x >> 7; x ^= x << 17; x as u8 }).collect()
        };
        roundtrip(&data, rows, dtype);
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics(desc in prop::array::uniform24(any::<u8>()),
                                             payload in prop::collection::vec(any::<u8>(), 0..512),
                                             out_len in 0usize..2048) {
        if let Ok(d) = ChunkDesc::from_bytes(&desc) {
            let mut out = vec![0u8; out_len];
            let _ = decode_chunk(&d, &payload, &mut out);
        }
    }
}

#[test]
fn bytes_after_a_zstd_frame_are_refused() {
    let data: Vec<u8> = (0..4096i64).flat_map(|i| (i % 7).to_le_bytes()).collect();
    let enc = encode_chunk(&data, 4096, DType::Int64, &CodecOptions::default());
    assert_eq!(enc.desc.codec, CODEC_ZSTD);
    let mut padded = enc.payload.clone();
    padded.extend_from_slice(&enc.payload); // a second, valid frame: still not "one frame"
    let desc = ChunkDesc {
        stored: [padded.len() as u32, 0, 0, 0],
        ..enc.desc
    };
    let mut out = vec![0u8; data.len()];
    let err = decode_chunk(&desc, &padded, &mut out).unwrap_err();
    assert!(err.contains("follow the zstd frame"), "{err}");
}

#[test]
fn row_major_chunks_from_older_writers_still_decode() {
    // A PLANES chunk in LAYOUT_ROW_MAJOR, built by hand: the high plane zstd-compressed as is.
    let data = hidden_like_bf16(6_000, 11);
    let lo: Vec<u8> = data.iter().step_by(2).copied().collect();
    let hi: Vec<u8> = data.iter().skip(1).step_by(2).copied().collect();
    let z = zstd::bulk::compress(&hi, 1).unwrap();
    let desc = ChunkDesc {
        codec: CODEC_PLANES,
        planes: 2,
        plane_zstd: 0b10,
        layout: LAYOUT_ROW_MAJOR,
        rows: 60,
        stored: [lo.len() as u32, z.len() as u32, 0, 0],
    };
    let payload = [lo, z].concat();
    let mut out = vec![0u8; data.len()];
    decode_chunk(&ChunkDesc::from_bytes(&desc.to_bytes()).unwrap(), &payload, &mut out).unwrap();
    assert_eq!(out, data);
}

#[test]
fn v1_mode_delta_bf16_chunks_still_decode() {
    // Exactly what the format-1 writer made of bf16: 2 planes, layout 1 (tests/fixtures/v1_dataset has real ones).
    let data = hidden_like_bf16(60_000, 5);
    let enc = encode_planes(&data, 200, 2, &CodecOptions::default());
    assert_eq!((enc.desc.layout, enc.desc.plane_zstd), (LAYOUT_MODE_DELTA, 0b10));
    let mut out = vec![0u8; data.len()];
    decode_chunk(
        &ChunkDesc::from_bytes(&enc.desc.to_bytes()).unwrap(),
        &enc.payload,
        &mut out,
    )
    .unwrap();
    assert_eq!(out, data);
}

#[test]
fn v2_bf16_is_never_larger_than_v1_and_smaller_on_states() {
    let data = hidden_like_bf16(200_000, 9);
    let v1 = encode_planes(&data, 500, 2, &CodecOptions::default()).payload.len();
    let v2 = roundtrip(&data, 500, DType::Bfloat16).payload.len();
    assert!(v2 < v1, "v2 {v2} bytes, v1 {v1}");
}

#[test]
fn constant_and_nonfinite_bf16_roundtrip() {
    let one = 0x3F80u16.to_le_bytes();
    let constant: Vec<u8> = (0..4096 * 8).flat_map(|_| one).collect();
    let enc = roundtrip(&constant, 4096, DType::Bfloat16);
    // Both planes constant: both zstd, and tiny.
    assert_eq!(enc.desc.plane_zstd, 0b11);
    assert!(enc.payload.len() < 200, "{} bytes", enc.payload.len());
    let mut special = hidden_like_bf16(64 * 40, 4);
    for (i, v) in [0x7FC0u16, 0xFFC1, 0x7F80, 0xFF80, 0x8000, 0x7F81].iter().enumerate() {
        special[2 * (40 * 7 + i)..2 * (40 * 7 + i) + 2].copy_from_slice(&v.to_le_bytes());
    }
    roundtrip(&special, 64, DType::Bfloat16);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]
    #[test]
    fn two_byte_floats_roundtrip_at_production_widths(half in any::<bool>(), rows in 1u32..4,
                                                      width in 1usize..21_505, seed in any::<u64>()) {
        let dtype = if half { DType::Float16 } else { DType::Bfloat16 };
        roundtrip(&hidden_like_bf16(rows as usize * width, seed), rows, dtype);
    }
}
