"""Capture-rate simulation at Kimi-K2.5 width (issue 10, item 4): a producer pushes samples whose rows are
21,504 (aux, 3 x 7,168) + 7,168 (final) bf16 through the real capture ring (``RingSink`` -> Rust sink -> encode
pool -> shards), at a set token rate or as fast as the writer takes them, and reports the sustained tokens/s per
writer thread, the ring's high-water mark, the producer's stall time, and the smallest thread count that keeps up
with 10k, 30k and 100k tokens/s (extrapolated from the thread counts measured, assuming the scaling measured
between them continues; measured directly on a 16-core machine with ``--threads 1,2,4,8,16``). The written
dataset is verified (``Dataset.verify``) after each run.

The rows are real: SmolLM2 states from realdata.py (aux [L, 1728], final [L, 576]) tiled to production width
through a fixed random channel permutation per tile, so the per-channel statistics the codec models stay real.

    cd benches && ../.venv/bin/python bench_capture_rate.py [-n 44] [--tokens 512] [--samples 12] \\
        [--threads 1,2] [--rates inf,10000]
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch
from realdata import CACHE, load_states

import eagle_io
from eagle_io.capturing.ring import RingSink

AUX, FINAL = 21_504, 7_168
TOKEN_BYTES = 2 * (AUX + FINAL) + 8 + 1  # bf16 states + int64 id + uint8 mask = 57,353 bytes


def widen(x: torch.Tensor, width: int, gen: torch.Generator) -> torch.Tensor:
    """``x [L, w]`` -> ``[L, width]``: tiles of ``x``'s channels, each tile in its own random order."""
    w = x.shape[1]
    idx = torch.cat([torch.randperm(w, generator=gen) for _ in range(math.ceil(width / w))])[:width]
    return x[:, idx].contiguous()


def production_samples(n_conv: int, tokens: int, distinct: int) -> list[dict[str, torch.Tensor]]:
    """``distinct`` samples of ``tokens`` tokens at production width, cut from the real states."""
    real, _ = load_states(n_conv)
    gen = torch.Generator().manual_seed(10)
    long = [s for s in real if s["input_ids"].shape[0] >= tokens] or real
    out = []
    for k in range(distinct):
        s = long[k % len(long)]
        n = min(tokens, s["input_ids"].shape[0])
        out.append(
            {
                "input_ids": s["input_ids"][:n].clone(),
                "loss_mask": s["loss_mask"][:n].clone(),
                "aux_hidden_states": widen(s["aux_hidden_states"][:n], AUX, gen),
                "hidden_states": widen(s["hidden_states"][:n], FINAL, gen),
            }
        )
    return out


def run(samples, root: Path, threads: int, rate: float, count: int, ring_bytes: int) -> dict:
    """Pushes ``count`` samples (cycling through ``samples``) at ``rate`` tokens/s (inf: no pacing)."""
    shutil.rmtree(root, ignore_errors=True)
    writer = eagle_io.ShardWriter(root, eagle_io.eagle3_schema(FINAL), {"bench": "capture rate"}, threads=threads)
    sink = RingSink(writer, ring_bytes=ring_bytes)
    pushed = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(count):
        s = samples[i % len(samples)]
        if math.isfinite(rate):  # the producer's schedule: token k is due at t0 + k / rate
            delay = t0 + pushed / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        sink.put(i, s)
        pushed += s["input_ids"].shape[0]
    t_put = time.perf_counter() - t0
    stats = sink.stats()
    sink.close()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    bad = eagle_io.Dataset.verify(root, threads=threads)
    assert bad == [], bad[:3]
    size = sum(f.stat().st_size for f in (root / "shards").iterdir())
    return {
        "tokens": pushed,
        "tokens_per_s": pushed / wall,
        "put_s": t_put,
        "wall_s": wall,
        "cpu_s": cpu,
        "high_water_mb": stats["ring_high_water_bytes"] / 1e6,
        "ring_mb": stats["ring_capacity"] / 1e6,
        "stall_s": stats["producer_stall_seconds"],
        "ratio": pushed * 2 * (AUX + FINAL) / size,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=44, help="real conversations (realdata.py)")
    ap.add_argument("--tokens", type=int, default=512, help="tokens per sample")
    ap.add_argument("--samples", type=int, default=12, help="samples pushed per run")
    ap.add_argument("--distinct", type=int, default=4, help="distinct samples built (the rest repeat them)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rates", default="inf", help="token rates, comma-separated (inf: as fast as taken)")
    ap.add_argument("--ring-mb", type=int, default=1024)
    args = ap.parse_args()
    samples = production_samples(args.n, args.tokens, args.distinct)
    print(
        f"rows: aux {AUX} + final {FINAL} bf16 ({TOKEN_BYTES:,} bytes/token), {args.tokens} tokens/sample, "
        f"{args.samples} samples/run, ring {args.ring_mb} MB, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
    )
    print("| threads | rate (tok/s) | sustained tok/s | tok/s per thread | GB/s states | ring high-water MB | "
          "producer stall s | CPU s | ratio |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    best = {}
    CACHE.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as d:
        for threads in (int(t) for t in args.threads.split(",")):
            for rate in (float(r) for r in args.rates.split(",")):
                r = run(samples, Path(d) / "ds", threads, rate, args.samples, args.ring_mb << 20)
                if not math.isfinite(rate):
                    best[threads] = r["tokens_per_s"]
                print(
                    f"| {threads} | {rate:.0f} | {r['tokens_per_s']:.0f} | {r['tokens_per_s'] / threads:.0f} | "
                    f"{r['tokens_per_s'] * 2 * (AUX + FINAL) / 1e9:.2f} | {r['high_water_mb']:.0f} | "
                    f"{r['stall_s']:.2f} | {r['cpu_s']:.1f} | {r['ratio']:.3f} |",
                    flush=True,
                )
    if best:
        ts = sorted(best)
        lo, hi = ts[0], ts[-1]
        # Efficiency per doubling of threads, measured between the smallest and largest counts (1.0 = linear).
        per_doubling = ((best[hi] / best[lo]) / (hi / lo)) ** (1 / math.log2(hi / lo)) if hi > lo else 1.0

        def predicted(t: int) -> float:
            return best[lo] / lo * t * per_doubling ** math.log2(max(t / lo, 1))

        for target in (10_000, 30_000, 100_000):
            need = next((t for t in range(1, 1025) if predicted(t) >= target), None)
            print(
                f"keeps up with {target:,} tok/s: {need or 'more than 1024'} threads "
                f"(extrapolated from {lo}..{hi} threads: "
                f"{best[lo] / lo:.0f} tok/s/thread, {per_doubling:.2f} efficiency per doubling)"
            )


if __name__ == "__main__":
    main()
