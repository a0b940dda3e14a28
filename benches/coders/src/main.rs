//! Order-0 coders against zstd's Huffman stage on eagle-io's real modelled planes.
//!
//! `cargo run --release -- PLANES_FILE [REPEATS]`, PLANES_FILE written by
//! `EAGLE_IO_BENCH_DUMP_PLANES=PATH cargo bench --bench codec -- FILE WIDTH -1000` in the main
//! repo (the exact bytes the codec hands zstd, one plane per chunk). Each candidate codes every
//! plane on its own (as the codec would, one frame per chunk and plane), round-trips it, and is
//! timed in CPU seconds of this thread (`CLOCK_THREAD_CPUTIME_ID`), REPEATS passes, best and
//! worst reported. MB = 1e6 bytes of plane per CPU-second.

use std::time::Duration;

// Links htslib (with htscodecs), whose C API coders.rs declares itself.
extern crate hts_sys;

mod coders;
#[allow(unused_imports)]
use coders::Coder;

/// CPU time this thread has run.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec; CLOCK_THREAD_CPUTIME_ID exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

struct Planes {
    bf16: u64,
    raw: u64,
    shipped_zstd: u64,
    planes: Vec<Vec<u8>>,
}

fn read_planes(path: &str) -> Planes {
    let b = std::fs::read(path).expect("read the planes file");
    assert_eq!(&b[..8], b"EIOPLN01", "not a planes file (EAGLE_IO_BENCH_DUMP_PLANES)");
    let u = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let (bf16, raw, shipped_zstd, n) = (u(8), u(16), u(24), u(32) as usize);
    let mut planes = Vec::with_capacity(n);
    let mut o = 40;
    for _ in 0..n {
        let len = u(o) as usize;
        planes.push(b[o + 8..o + 8 + len].to_vec());
        o += 8 + len;
    }
    assert_eq!(o, b.len(), "trailing bytes");
    Planes { bf16, raw, shipped_zstd, planes }
}

/// Order-0 entropy of the planes (each plane its own histogram), in bytes: the floor any
/// order-0 coder with one table per plane can reach (tables not counted).
fn order0_bytes(planes: &[Vec<u8>]) -> f64 {
    planes
        .iter()
        .map(|p| {
            let mut h = [0u64; 256];
            p.iter().for_each(|&b| h[b as usize] += 1);
            let n = p.len() as f64;
            h.iter()
                .filter(|&&c| c > 0)
                .map(|&c| -(c as f64) * (c as f64 / n).log2())
                .sum::<f64>()
                / 8.0
        })
        .sum()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).expect("usage: coders PLANES_FILE [REPEATS] [CODER_FILTER]");
    let repeats: usize = args.get(2).map(|r| r.parse().expect("REPEATS")).unwrap_or(5);
    let filter = args.get(3).cloned().unwrap_or_default();
    let p = read_planes(path);
    let plane_bytes: usize = p.planes.iter().map(Vec::len).sum();
    let mb = plane_bytes as f64 / 1e6;
    let ratio_all = |coded: u64| p.bf16 as f64 / (p.raw + coded) as f64;
    let h0 = order0_bytes(&p.planes);
    println!(
        "{path}: {} planes, {:.1} MB of modelled plane, {:.1} MB raw plane, {:.1} MB of bf16; shipped zstd frames {} B \
         (ratio over all stored {:.4}); order-0 entropy {:.0} B (plane ratio {:.4}, over all stored {:.4})",
        p.planes.len(),
        mb,
        p.raw as f64 / 1e6,
        p.bf16 as f64 / 1e6,
        p.shipped_zstd,
        ratio_all(p.shipped_zstd),
        h0,
        plane_bytes as f64 / h0,
        ratio_all(h0 as u64)
    );
    println!(
        "| coder | coded bytes | plane ratio | ratio over all stored | enc MB/CPU-s best (worst) | dec MB/CPU-s best (worst) | dec / zstd dec |"
    );
    println!("|---|---|---|---|---|---|---|");
    let max_len = p.planes.iter().map(Vec::len).max().unwrap_or(0);
    let mut zstd_dec_best = None;
    for mut c in coders::all() {
        if !c.name().contains(filter.as_str()) {
            continue;
        }
        // Encode once, check every plane round-trips bit for bit.
        let mut frames: Vec<Vec<u8>> = Vec::with_capacity(p.planes.len());
        let mut out = vec![1u8; max_len];
        for plane in &p.planes {
            let mut f = Vec::new();
            c.encode(plane, &mut f);
            c.decode(&f, &mut out[..plane.len()]);
            assert!(out[..plane.len()] == plane[..], "{}: round trip differs", c.name());
            frames.push(f);
        }
        let coded: u64 = frames.iter().map(|f| f.len() as u64).sum();
        let mut enc = Vec::new();
        let mut dec = Vec::new();
        let mut f = Vec::with_capacity(2 * max_len + 4096);
        for _ in 0..repeats {
            if c.times_encode() {
                let t = thread_cpu();
                for plane in &p.planes {
                    f.clear();
                    c.encode(plane, &mut f);
                }
                enc.push(mb / (thread_cpu() - t).as_secs_f64());
            }
            let t = thread_cpu();
            for (fr, plane) in frames.iter().zip(&p.planes) {
                c.decode(fr, &mut out[..plane.len()]);
            }
            dec.push(mb / (thread_cpu() - t).as_secs_f64());
        }
        let best = |v: &[f64]| v.iter().cloned().fold(f64::MIN, f64::max);
        let worst = |v: &[f64]| v.iter().cloned().fold(f64::MAX, f64::min);
        let dec_best = best(&dec);
        if zstd_dec_best.is_none() {
            zstd_dec_best = Some(dec_best);
        }
        let enc_s = if enc.is_empty() {
            "(as above)".to_string()
        } else {
            format!("{:.0} ({:.0})", best(&enc), worst(&enc))
        };
        println!(
            "| {} | {} | {:.4} | {:.4} | {} | {:.0} ({:.0}) | {:.2} |",
            c.name(),
            coded,
            plane_bytes as f64 / coded as f64,
            ratio_all(coded),
            enc_s,
            dec_best,
            worst(&dec),
            dec_best / zstd_dec_best.unwrap()
        );
    }
}
