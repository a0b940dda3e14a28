//! One-core codec throughput on real states: `cargo bench --bench codec -- FILE WIDTH [LEVEL [ROWS]]`.
//! FILE holds raw little-endian bf16 rows of WIDTH values (e.g. aux states written by
//! `benches/realdata.py --dump`); without arguments it uses synthetic hidden-state-like data.
//! Prints ratio and encode/decode MB per CPU-second of this thread (steadier than wall time
//! on a shared machine) for the chunk codec alone (no I/O, no CRC).
//! `EAGLE_IO_BENCH_ZSTD_PARAMS=1` also recompresses the modelled planes with other zstd settings;
//! `EAGLE_IO_BENCH_DUMP_PLANES=PATH` writes them to PATH for the order-0 coder bench
//! (`benches/coders/`).

use eagle_io::codec::{decode_chunk, encode_chunk, recycle_payload, CodecOptions};
use eagle_io::DType;

/// CPU seconds this thread has run (user + system).
fn thread_cpu_seconds() -> f64 {
    // SAFETY: `getrusage` fills the zeroed struct it is given; RUSAGE_THREAD is valid on Linux.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut ru);
        ru
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    secs(ru.ru_utime) + secs(ru.ru_stime)
}

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
    // An optional fourth argument sets the rows per chunk (default: the writer's, 1 MiB of rows).
    let rows_per_chunk = match args.get(4) {
        Some(r) => r.parse::<usize>().expect("ROWS"),
        None => ((1 << 20) / row_bytes).max(1),
    };
    let chunks: Vec<&[u8]> = data.chunks(rows_per_chunk * row_bytes).collect();
    // An optional third argument runs one level only (e.g. under `perf record`).
    let levels: Vec<i32> = match args.get(3) {
        Some(l) => vec![l.parse().expect("LEVEL")],
        None => vec![1, -1000],
    };
    for level in levels {
        let opts = CodecOptions { zstd_level: level };
        let enc: Vec<_> = chunks
            .iter()
            .map(|c| encode_chunk(c, (c.len() / row_bytes) as u32, DType::Bfloat16, &opts))
            .collect();
        // Timed as the writer runs: each payload goes back to the pool once written.
        let t0 = thread_cpu_seconds();
        for c in &chunks {
            recycle_payload(encode_chunk(c, (c.len() / row_bytes) as u32, DType::Bfloat16, &opts).payload);
        }
        let enc_s = thread_cpu_seconds() - t0;
        let stored: usize = enc.iter().map(|e| e.payload.len()).sum();
        let mut out = vec![0u8; rows_per_chunk * row_bytes];
        let t1 = thread_cpu_seconds();
        for (e, c) in enc.iter().zip(&chunks) {
            decode_chunk(&e.desc, &e.payload, &mut out[..c.len()]).expect("decodes");
        }
        let dec_s = thread_cpu_seconds() - t1;
        let mb = data.len() as f64 / 1e6;
        let (coder_enc_s, coder_dec_s) = coder_alone(&enc, level);
        if std::env::var_os("EAGLE_IO_BENCH_ZSTD_PARAMS").is_some() {
            zstd_params(&enc, level, data.len());
        }
        if let Some(path) = std::env::var_os("EAGLE_IO_BENCH_DUMP_PLANES") {
            dump_planes(&enc, data.len(), std::path::Path::new(&path));
        }
        println!(
            "zstd level {level:>5}: {:.1} MB, ratio {:.4}, encode {:.0} MB/CPU-s, decode {:.0} MB/CPU-s (one thread); \
             zstd alone on the same modelled planes: encode {:.0}, decode {:.0} MB of bf16/CPU-s",
            mb,
            data.len() as f64 / stored as f64,
            mb / enc_s,
            mb / dec_s,
            mb / coder_enc_s,
            mb / coder_dec_s
        );
    }
}

/// CPU seconds zstd alone takes to encode and decode the chunks' zstd-coded planes with the
/// codec's settings (the same bytes the codec hands it): the floor the fused passes add to.
fn coder_alone(chunks: &[eagle_io::codec::EncodedChunk], level: i32) -> (f64, f64) {
    use zstd::zstd_safe::{CParameter, ParamSwitch};
    let mut frames = Vec::new();
    let mut start = 0usize;
    for e in chunks {
        for p in 0..e.desc.planes as usize {
            let len = e.desc.stored[p] as usize;
            if e.desc.plane_zstd & (1 << p) != 0 {
                frames.push(&e.payload[start..start + len]);
            }
            start += len;
        }
        start = 0;
    }
    let mut d = zstd::bulk::Decompressor::new().expect("context");
    let sizes: Vec<usize> = frames
        .iter()
        .map(|f| zstd::zstd_safe::get_frame_content_size(f).unwrap().unwrap() as usize)
        .collect();
    // One reused output buffer, filled (not zeroed) so its pages are mapped before the clock
    // starts, as the codec's reused buffers are.
    let mut buf = vec![1u8; sizes.iter().max().copied().unwrap_or(0)];
    let t0 = thread_cpu_seconds();
    for (f, &n) in frames.iter().zip(&sizes) {
        d.decompress_to_buffer(f, &mut buf[..n]).expect("decodes");
    }
    let dec_s = thread_cpu_seconds() - t0;
    let planes: Vec<Vec<u8>> = frames
        .iter()
        .zip(&sizes)
        .map(|(f, &n)| {
            d.decompress_to_buffer(f, &mut buf[..n]).expect("decodes");
            buf[..n].to_vec()
        })
        .collect();
    let mut c = zstd::bulk::Compressor::new(level).expect("context");
    c.set_parameter(CParameter::LiteralCompressionMode(ParamSwitch::Enable))
        .expect("a valid parameter");
    let mut out = Vec::with_capacity(zstd::zstd_safe::compress_bound(
        sizes.iter().max().copied().unwrap_or(0),
    ));
    let t1 = thread_cpu_seconds();
    for p in &planes {
        out.clear();
        c.compress_to_buffer(p, &mut out).expect("compresses");
    }
    (thread_cpu_seconds() - t1, dec_s)
}

/// The chunks' zstd-coded planes, decompressed (the exact bytes the codec hands zstd, one per
/// chunk and plane, in order), the bytes stored raw, and the zstd frames' bytes.
fn zstd_planes(chunks: &[eagle_io::codec::EncodedChunk]) -> (Vec<Vec<u8>>, usize, usize) {
    let mut d = zstd::bulk::Decompressor::new().expect("context");
    let (mut raw_bytes, mut zstd_bytes) = (0usize, 0usize);
    let mut planes = Vec::new();
    for e in chunks {
        let mut start = 0usize;
        for p in 0..e.desc.planes as usize {
            let len = e.desc.stored[p] as usize;
            let frame = &e.payload[start..start + len];
            if e.desc.plane_zstd & (1 << p) != 0 {
                let n = zstd::zstd_safe::get_frame_content_size(frame).unwrap().unwrap() as usize;
                planes.push(d.decompress(frame, n).expect("decodes"));
                zstd_bytes += len;
            } else {
                raw_bytes += len;
            }
            start += len;
        }
    }
    (planes, raw_bytes, zstd_bytes)
}

/// Writes the chunks' zstd-coded planes, decompressed (the exact bytes the codec hands zstd,
/// one per chunk and plane, in order) to `path` for `benches/coders/`
/// (`EAGLE_IO_BENCH_DUMP_PLANES=PATH`). Layout, all integers u64 little-endian: magic
/// `EIOPLN01`, the bf16 bytes, the bytes stored raw (planes not zstd-coded), the shipped zstd
/// frames' bytes, the plane count, then each plane as its length and its bytes.
fn dump_planes(chunks: &[eagle_io::codec::EncodedChunk], bf16_bytes: usize, path: &std::path::Path) {
    let (planes, raw_bytes, zstd_bytes) = zstd_planes(chunks);
    let mut out = b"EIOPLN01".to_vec();
    for v in [bf16_bytes, raw_bytes, zstd_bytes, planes.len()].map(|v| v as u64) {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for p in &planes {
        out.extend_from_slice(&(p.len() as u64).to_le_bytes());
        out.extend_from_slice(p);
    }
    std::fs::write(path, out).expect("write the planes file");
    println!(
        "  dumped {} zstd planes ({} bytes) to {}",
        planes.len(),
        planes.iter().map(Vec::len).sum::<usize>(),
        path.display()
    );
}

/// zstd's parameters for the modelled planes (`EAGLE_IO_BENCH_ZSTD_PARAMS=1`): the same planes
/// recompressed with each setting; prints the stored size of all chunks (the raw planes kept as
/// they are) as a ratio over the bf16 bytes, and zstd's encode / decode MB of bf16 per CPU-second.
fn zstd_params(chunks: &[eagle_io::codec::EncodedChunk], level: i32, bf16_bytes: usize) {
    use zstd::zstd_safe::{CParameter, ParamSwitch, Strategy};
    let (planes, raw_bytes, _) = zstd_planes(chunks);
    let mut d = zstd::bulk::Decompressor::new().expect("context");
    let lit = CParameter::LiteralCompressionMode(ParamSwitch::Enable);
    let variants: Vec<(&str, Vec<CParameter>)> = vec![
        ("level, Huffman literals (shipped)", vec![lit]),
        ("+ minMatch 7", vec![lit, CParameter::MinMatch(7)]),
        (
            "+ minMatch 7, targetLength 131072",
            vec![lit, CParameter::MinMatch(7), CParameter::TargetLength(131072)],
        ),
        ("+ windowLog 10", vec![lit, CParameter::WindowLog(10)]),
        ("+ hashLog 6", vec![lit, CParameter::HashLog(6)]),
        (
            "+ strategy dfast",
            vec![lit, CParameter::Strategy(Strategy::ZSTD_dfast)],
        ),
    ];
    let mut buf = vec![1u8; planes.iter().map(Vec::len).max().unwrap_or(0)];
    for (name, params) in variants {
        let mut c = zstd::bulk::Compressor::new(level).expect("context");
        for p in &params {
            c.set_parameter(*p).expect("a valid parameter");
        }
        let t0 = thread_cpu_seconds();
        let frames: Vec<Vec<u8>> = planes.iter().map(|p| c.compress(p).expect("compresses")).collect();
        let enc_s = thread_cpu_seconds() - t0;
        let t1 = thread_cpu_seconds();
        for (f, p) in frames.iter().zip(&planes) {
            d.decompress_to_buffer(f, &mut buf[..p.len()]).expect("decodes");
        }
        let dec_s = thread_cpu_seconds() - t1;
        let stored = raw_bytes + frames.iter().map(Vec::len).sum::<usize>();
        let mb = bf16_bytes as f64 / 1e6;
        println!(
            "  zstd params {name:<36}: ratio {:.4}, zstd enc {:.0}, dec {:.0} MB of bf16/CPU-s",
            bf16_bytes as f64 / stored as f64,
            mb / enc_s,
            mb / dec_s
        );
    }
}
