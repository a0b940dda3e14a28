"""Decode alone, as a trainer's batches read it: the real states written once with ``ShardWriter``, then ``passes``
passes of ``Dataset.read_batch`` over batches of 4 into preallocated tensors (page cache warm, CRC included);
prints MB of bf16 states per CPU-second of the whole process, best pass. ``--collate`` also times the warm feed
without a DataLoader: ``PaddingCollator`` over ``ShardDataset`` batches of 4 in one shuffled order (fresh batch
tensors each time, as a trainer gets them), GB per CPU-second. The decode runs on the reader's pool
thread (``eagle-io-read-0``), so ``perf record`` of this script, filtered to that thread, profiles the read path
without the setup: ``perf report --comm eagle-io-read-0``.

    cd benches && ../.venv/bin/python bench_read_batch.py [-n 44] [--passes 6] [--collate]

Results in benches/README.md (format v2 section).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from realdata import CACHE, load_states

import eagle_io
from eagle_io.feed import PaddingCollator, ShardDataset

STATES = ("aux_hidden_states", "hidden_states")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=44)
    ap.add_argument("--passes", type=int, default=6)
    ap.add_argument("--collate", action="store_true", help="also time PaddingCollator batches (the warm feed)")
    args = ap.parse_args()
    samples, _ = load_states(args.n)
    mb = sum(s[k].nbytes for s in samples for k in STATES) / 1e6
    CACHE.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as d:
        root = Path(d) / "eio"
        w = eagle_io.ShardWriter(root, eagle_io.eagle3_schema(576), {"aux_layer_ids": [2, 15, 27]}, threads=1)
        rows = [(i, {k: s[k] for k in ("input_ids", "loss_mask", *STATES)}, s["key"]) for i, s in enumerate(samples)]
        for b in range(0, len(rows), 8):
            w.write_batch(rows[b : b + 8])
        w.close()
        ds = eagle_io.Dataset(root, threads=1)
        lens = ds.lengths()
        outs = [
            {s.name: torch.empty((n, s.width) if s.width else (n,), dtype=getattr(torch, s.dtype)) for s in ds.schema}
            for n in lens
        ]
        least = float("inf")
        for _ in range(args.passes):
            c0 = time.process_time()
            for b in range(0, len(lens), 4):
                ds.read_batch([(p, outs[p]) for p in range(b, min(b + 4, len(lens)))])
            least = min(least, time.process_time() - c0)
        for pos, s in enumerate(samples):
            assert all(torch.equal(outs[pos][k], s[k]) for k in ("input_ids", *STATES)), "round trip mismatch"
        print(f"read_batch (threads=1, batches of 4), best of {args.passes} passes: {mb / least:.0f} MB/CPU-s")
        if args.collate:
            sd, collate = ShardDataset(str(root), threads=1), PaddingCollator()
            order = torch.randperm(len(sd), generator=torch.Generator().manual_seed(0)).tolist()
            batches = [order[i : i + 4] for i in range(0, len(order), 4)]
            least = float("inf")
            for _ in range(args.passes):
                c0 = time.process_time()
                n = sum(int(collate(sd.__getitems__(b))["lengths"].sum()) for b in batches)
                least = min(least, time.process_time() - c0)
            assert n == sum(lens)
            gb_s = mb / 1e3 / least
            print(f"PaddingCollator warm feed (workers=0, batches of 4), best of {args.passes}: {gb_s:.2f} GB/CPU-s")


if __name__ == "__main__":
    main()
