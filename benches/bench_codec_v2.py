"""Issue 10's targets on real states: eagle-io encode (ShardWriter, end to end) and decode (Dataset.read_into, one
call per sample, and Dataset.read_batch, one call per batch of 4; CRC included) in MB of bf16 states per CPU-second
of the whole process, against zstd-1 of the raw bytes in the same run, at threads=1 and 2; plus the ratio.

    cd benches && ../.venv/bin/python bench_codec_v2.py [-n 44] [--repeat 3] [--label v2] [--threads 1,2]

Prints one markdown table row per (method, threads); benches/README.md holds the results.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

import torch
from benchkit import best
from realdata import CACHE, load_states

import eagle_io

STATES = ("aux_hidden_states", "hidden_states")
try:  # zstd-1 of the raw bytes (python zstandard), the baseline; a machine without zstandard skips it
    from bench_codec import bench_zstd
except ImportError:
    bench_zstd = None


def bench_eagle(samples, d: Path, threads: int, repeat: int, batch: int = 4):
    meta = {"target_model": "SmolLM2-135M-Instruct Q4_1", "aux_layer_ids": [2, 15, 27]}
    rows = [(i, {k: s[k] for k in ("input_ids", "loss_mask", *STATES)}, s["key"]) for i, s in enumerate(samples)]
    root = d / "eio"

    def enc():
        shutil.rmtree(root, ignore_errors=True)
        w = eagle_io.ShardWriter(root, eagle_io.eagle3_schema(576), meta, threads=threads)
        for b in range(0, len(rows), 8):
            w.write_batch(rows[b : b + 8])
        w.close()
        return sum(f.stat().st_size for f in (root / "shards").iterdir())

    _, enc_cpu, sizes = best(enc, repeat)
    ds = eagle_io.Dataset(root, threads=threads)
    lens = ds.lengths()
    outs = [
        {s.name: torch.empty((n, s.width) if s.width else (n,), dtype=getattr(torch, s.dtype)) for s in ds.schema}
        for n in lens
    ]

    def dec_each():
        for pos in range(len(lens)):
            ds.read_into(pos, outs[pos])

    def dec_batch():
        for b in range(0, len(lens), batch):
            ds.read_batch([(p, outs[p]) for p in range(b, min(b + batch, len(lens)))])

    _, each_cpu, _ = best(dec_each, repeat)
    # Builds before read_batch existed (the v1 baseline) report read_into only.
    batch_cpu = best(dec_batch, repeat)[1] if hasattr(ds, "read_batch") else float("nan")
    for pos, s in enumerate(samples):
        assert all(torch.equal(outs[pos][k], s[k]) for k in ("input_ids", *STATES)), "round trip mismatch"
    return sizes[-1], enc_cpu, each_cpu, batch_cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=44)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--label", default=f"format v{eagle_io.FORMAT_VERSION}")
    ap.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    args = ap.parse_args()
    samples, desc = load_states(args.n)
    raw = sum(s[k].nbytes for s in samples for k in STATES)
    mb = raw / 1e6
    print(f"Data: {desc}. Load average {os.getloadavg()[0]:.1f} at start.")
    print("| build | threads | ratio | enc MB/CPU-s | x zstd-1 | read_into MB/CPU-s | read_batch MB/CPU-s | x zstd-1 |")
    print("|---|---|---|---|---|---|---|---|")
    CACHE.mkdir(exist_ok=True)
    for threads in (int(t) for t in args.threads.split(",")):
        with tempfile.TemporaryDirectory(dir=CACHE) as d:
            size, enc, each, batch = bench_eagle(samples, Path(d), threads, args.repeat)
            if bench_zstd is not None:
                zsize, (_, zenc), (_, zdec), _ = bench_zstd(samples, Path(d), threads, args.repeat)
            else:
                zsize, zenc, zdec = float("nan"), float("nan"), float("nan")
        zrow = f"| zstd-1 (raw bytes) | {threads} | {raw / zsize:.3f} | {mb / zenc:.0f} | 1.00 | {mb / zdec:.0f} |"
        print(zrow + " | 1.00 |")
        print(
            f"| eagle-io {args.label} | {threads} | {raw / size:.3f} | {mb / enc:.0f} | {zenc / enc:.2f} | "
            f"{mb / each:.0f} | {mb / batch:.0f} | {zdec / min(each, batch if batch == batch else each):.2f} |",
            flush=True,
        )
    print(f"Load average {os.getloadavg()[0]:.1f} at the end.")


if __name__ == "__main__":
    main()
