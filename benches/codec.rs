//! One-core codec throughput on real states: `cargo bench --bench codec -- FILE WIDTH`.
//! FILE holds raw little-endian bf16 rows of WIDTH values (e.g. aux states written by
//! `benches/realdata.py --dump`); without arguments it uses synthetic hidden-state-like data.
//! Prints ratio and encode/decode MB/s of the chunk codec alone (no I/O, no CRC).

use std::time::Instant;

use eagle_io::codec::{decode_chunk, encode_chunk, CodecOptions};
use eagle_io::DType;

fn synthetic(rows: usize, width: usize) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..rows * width)
        .flat_map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let scale = 1.0 + (i % width) as f32 / width as f32 * 8.0; // per-channel magnitudes
            let f = ((x % 20001) as f32 - 10000.0) / 10000.0 * scale;
            ((f.to_bits() >> 16) as u16).to_le_bytes()
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().filter(|a| a != "--bench").collect();
    let (data, width) = match (args.get(1), args.get(2)) {
        (Some(path), Some(w)) => (
            std::fs::read(path).expect("read FILE"),
            w.parse::<usize>().expect("WIDTH"),
        ),
        _ => (synthetic(20_000, 1728), 1728),
    };
    let row_bytes = width * 2;
    let rows_per_chunk = ((1 << 20) / row_bytes).max(1);
    let chunks: Vec<&[u8]> = data.chunks(rows_per_chunk * row_bytes).collect();
    for level in [1, -20] {
        let opts = CodecOptions { zstd_level: level };
        let t0 = Instant::now();
        let enc: Vec<_> = chunks
            .iter()
            .map(|c| encode_chunk(c, (c.len() / row_bytes) as u32, DType::Bfloat16, &opts))
            .collect();
        let enc_s = t0.elapsed().as_secs_f64();
        let stored: usize = enc.iter().map(|e| e.payload.len()).sum();
        let mut out = vec![0u8; rows_per_chunk * row_bytes];
        let t1 = Instant::now();
        for (e, c) in enc.iter().zip(&chunks) {
            decode_chunk(&e.desc, &e.payload, &mut out[..c.len()]).expect("decodes");
        }
        let dec_s = t1.elapsed().as_secs_f64();
        let mb = data.len() as f64 / 1e6;
        println!(
            "zstd level {level:>3}: {:.1} MB, ratio {:.4}, encode {:.0} MB/s, decode {:.0} MB/s (one core)",
            mb,
            data.len() as f64 / stored as f64,
            mb / enc_s,
            mb / dec_s
        );
    }
}
