//! Order-0 coders against zstd's Huffman stage on eagle-io's real modelled planes.
//!
//! `cargo run --release -- PLANES_FILE [REPEATS]`, PLANES_FILE written by
//! `EAGLE_IO_BENCH_DUMP_PLANES=PATH cargo bench --bench codec -- FILE WIDTH -1000` in the main
//! repo (the exact bytes the codec hands zstd, one plane per chunk). Each candidate codes every
//! plane on its own (as the codec would, one frame per chunk and plane), round-trips it, and is
//! timed in CPU seconds of this thread (`CLOCK_THREAD_CPUTIME_ID`) over REPEATS passes in which
//! the candidates take turns; best, median and worst are reported, and each candidate's speed over
//! zstd's in the same pass (median of the passes). MB = 1e6 bytes of plane per CPU-second.

use std::time::Duration;

// Links htslib (with htscodecs), whose C API coders.rs declares itself.
extern crate hts_sys;

mod coders;
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
    Planes {
        bf16,
        raw,
        shipped_zstd,
        planes,
    }
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
        "| coder | coded bytes | plane ratio | ratio over all stored | enc MB/CPU-s best / median / worst | dec MB/CPU-s best / median / worst | dec / zstd dec, same pass (median) | enc / zstd enc, same pass (median) |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let max_len = p.planes.iter().map(Vec::len).max().unwrap_or(0);
    let mut coders: Vec<Box<dyn Coder>> = coders::all()
        .into_iter()
        .filter(|c| c.name().contains(filter.as_str()))
        .collect();
    // Encode once with each, check that every plane round-trips bit for bit.
    let mut out = vec![1u8; max_len];
    let frames: Vec<Vec<Vec<u8>>> = coders
        .iter_mut()
        .map(|c| {
            p.planes
                .iter()
                .map(|plane| {
                    let mut f = Vec::new();
                    c.encode(plane, &mut f);
                    c.decode(&f, &mut out[..plane.len()]);
                    assert!(out[..plane.len()] == plane[..], "{}: round trip differs", c.name());
                    f
                })
                .collect()
        })
        .collect();
    // Timed passes, the candidates taking turns within each pass so that the machine's load
    // drifts over all of them alike; the first candidate (zstd as shipped) is the baseline
    // each pass is compared with.
    let mut enc = vec![Vec::new(); coders.len()];
    let mut dec = vec![Vec::new(); coders.len()];
    let mut f = Vec::with_capacity(2 * max_len + 4096);
    for _ in 0..repeats {
        for (i, c) in coders.iter_mut().enumerate() {
            if c.times_encode() {
                let t = thread_cpu();
                for plane in &p.planes {
                    f.clear();
                    c.encode(plane, &mut f);
                }
                enc[i].push(mb / (thread_cpu() - t).as_secs_f64());
            }
            let t = thread_cpu();
            for (fr, plane) in frames[i].iter().zip(&p.planes) {
                c.decode(fr, &mut out[..plane.len()]);
            }
            dec[i].push(mb / (thread_cpu() - t).as_secs_f64());
        }
    }
    let stats = |v: &[f64]| {
        let mut s = v.to_vec();
        s.sort_by(|a, b| b.partial_cmp(a).unwrap());
        format!("{:.0} / {:.0} / {:.0}", s[0], s[s.len() / 2], s[s.len() - 1])
    };
    let median_ratio = |v: &[f64], base: &[f64]| {
        if v.is_empty() {
            return "".to_string();
        }
        let mut r: Vec<f64> = v.iter().zip(base).map(|(a, b)| a / b).collect();
        r.sort_by(|a, b| a.partial_cmp(b).unwrap());
        format!("{:.2}", r[r.len() / 2])
    };
    for (i, c) in coders.iter().enumerate() {
        let coded: u64 = frames[i].iter().map(|f| f.len() as u64).sum();
        let enc_s = if enc[i].is_empty() {
            "(as above)".to_string()
        } else {
            stats(&enc[i])
        };
        println!(
            "| {} | {} | {:.4} | {:.4} | {} | {} | {} | {} |",
            c.name(),
            coded,
            plane_bytes as f64 / coded as f64,
            ratio_all(coded),
            enc_s,
            stats(&dec[i]),
            median_ratio(&dec[i], &dec[0]),
            median_ratio(&enc[i], &enc[0]),
        );
    }
}
