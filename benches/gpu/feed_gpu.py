"""Feeding a GPU: GB/s of EAGLE-3 states delivered to the device, and CPU-seconds (all processes) per GB, for

* ``eagle-io Loader``: ``eagle_io.feed.Loader(ShardDataset(threads=T), device="cuda")``: native decode threads
  into reused pinned buffers, ``non_blocking`` copies on a side stream, no worker process;
* ``eagle-io DataLoader``: ``DataLoader(ShardDataset, workers=W, pin_memory=True, persistent_workers=True)`` and the
  training loop's ``.to("cuda", non_blocking=True)`` (what users run today);
* ``SpecForge DataLoader``: the same DataLoader over SpecForge's per-sample ``.ckpt`` files read as its
  ``OfflineEagle3Dataset._open_file`` does (``torch.load(mmap=True)``, ``benches/peers.py``);

all with ``PaddingCollator`` batches in one fixed shuffled order, warm (page cache) and cold (``posix_fadvise``
eviction). The data are synthetic bf16 states written here in both formats (``torch.randn`` times per-channel
scales, as residual streams have; eagle-io compresses them less than real states, which favours the peer).

Usage (on the lent GPU machine, from the repository root, the built extension importable)::

    python benches/gpu/feed_gpu.py --out "$OUT"               # ~3-4 minutes on one H200 with 16 cores
    python benches/gpu/feed_gpu.py --smoke --out /tmp/x       # tiny data, on the CPU: the script still works

Writes ``feed_gpu.json`` in ``--out`` and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from peers import AllProcesses, SpecForgeStyleDataset, evict, fsync_write, specforge_bytes, specforge_path

import eagle_io
from eagle_io.feed import Loader, PaddingCollator, ShardDataset


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for feed_gpu.json")
    p.add_argument("--hidden", type=int, default=4096, help="hidden size H: aux rows are 3H wide")
    p.add_argument("--samples", type=int, default=128)
    p.add_argument("--min-len", type=int, default=512)
    p.add_argument("--max-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--threads", type=int, default=min(16, os.cpu_count() or 1), help="eagle-io decode threads")
    p.add_argument("--workers", type=int, default=4, help="DataLoader worker processes")
    p.add_argument("--prefetch", type=int, default=4, help="Loader batches decoded ahead")
    p.add_argument("--passes", type=int, default=2, help="warm passes per row (the fastest counts)")
    p.add_argument("--work", help="data folder (default: a temporary one, removed at the end)")
    p.add_argument("--smoke", action="store_true", help="tiny data, CPU only: checks that the script runs")
    args = p.parse_args(argv)
    if args.smoke:
        args.hidden, args.samples, args.min_len, args.max_len, args.threads, args.workers = 8, 12, 4, 40, 1, 2
        args.prefetch, args.passes = 2, 1
    return args


def write_data(root: Path, args: argparse.Namespace) -> tuple[list[int], list[str]]:
    """Synthetic states in both formats (fsynced, so eviction drops them): -> (lengths, SpecForge paths)."""
    H, g = args.hidden, torch.Generator().manual_seed(0)
    scale = torch.rand(4 * H, generator=g) * 4 + 0.1
    lengths = torch.randint(args.min_len, args.max_len + 1, (args.samples,), generator=g).tolist()
    paths = []
    with eagle_io.ShardWriter(root / "eagleio", eagle_io.eagle3_schema(H), {"hidden_size": H}, threads=0) as w:
        for i, n in enumerate(lengths):
            x = (torch.randn(n, 4 * H, generator=g) * scale).to(torch.bfloat16)
            s = {
                "input_ids": torch.randint(0, 32000, (n,), generator=g),
                "loss_mask": (torch.rand(n, generator=g) > 0.4).to(torch.uint8),
                "aux_hidden_states": x[:, : 3 * H].contiguous(),
                "hidden_states": x[:, 3 * H :].contiguous(),
            }
            w.write(i, s)
            path = specforge_path(root / "ckpt", i, False)
            fsync_write(path, specforge_bytes(s, False))
            paths.append(str(path))
    return lengths, paths


def run_pass(loader, device: torch.device | None, ours: bool, lengths: list[int]) -> tuple[int, int]:
    """One pass: every batch on the device (ours: the Loader copied it; else ``.to(non_blocking=True)`` here),
    synchronised once at the end (tokens are counted from the sample ids, which stay on the host). -> (tokens,
    bytes of tensors delivered)."""
    tokens = nbytes = 0
    for b in loader:
        tensors = {k: v for k, v in b.items() if isinstance(v, torch.Tensor)}
        if device is not None and not ours:
            tensors = {k: v.to(device, non_blocking=True) for k, v in tensors.items()}
        tokens += sum(lengths[i] for i in b["sample_ids"])
        nbytes += sum(t.numel() * t.element_size() for t in tensors.values())
    if device is not None:
        torch.cuda.synchronize(device)
    return tokens, nbytes


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda") if torch.cuda.is_available() and not args.smoke else None
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="feed-gpu-"))
    try:
        t0 = time.perf_counter()
        lengths, ckpt = write_data(work, args)  # torch's default threads: the random states are generated fast
        setup_s = time.perf_counter() - t0
        torch.set_num_threads(1)  # as DataLoader workers run; the main process only iterates
        state_gb = sum(lengths) * 8 * args.hidden / 1e9
        order = np.random.default_rng(0).permutation(len(lengths)).tolist()
        batches = [order[i : i + args.batch_size] for i in range(0, len(order), args.batch_size)]
        eio_files = [str(p) for p in (work / "eagleio").rglob("*") if p.is_file()]
        cpu = AllProcesses()
        rows = []

        def make(path: str):
            if path == "eagle-io Loader":
                ds = ShardDataset(work / "eagleio", threads=args.threads)
                return Loader(ds, batch_sampler=batches, collate_fn=PaddingCollator(), prefetch=args.prefetch,
                              device=device, pin_memory=device is not None), eio_files  # fmt: skip
            ds = (
                ShardDataset(work / "eagleio", threads=1)
                if path.startswith("eagle-io")
                else SpecForgeStyleDataset(ckpt)
            )
            loader = torch.utils.data.DataLoader(
                ds, batch_sampler=batches, collate_fn=PaddingCollator(), num_workers=args.workers,
                pin_memory=device is not None, persistent_workers=True, multiprocessing_context="fork", timeout=300,
            )  # fmt: skip
            return loader, eio_files if path.startswith("eagle-io") else ckpt

        for path in ("eagle-io Loader", "eagle-io DataLoader", "SpecForge DataLoader"):
            loader, files = make(path)
            ours = isinstance(loader, Loader)
            figures = {}
            for phase in ["cold", *["warm"] * args.passes]:
                if phase == "cold":
                    evict(files)  # DataLoader workers start inside the cold pass, as at a job's start
                w0, c0 = time.perf_counter(), cpu.seconds()
                tokens, nbytes = run_pass(loader, device, ours, lengths)
                wall, cpu_s = time.perf_counter() - w0, max(cpu.seconds() - c0, 0.01)
                assert tokens == sum(lengths), (path, tokens)
                if phase not in figures or wall < figures[phase]["wall_s"]:
                    figures[phase] = {"wall_s": wall, "cpu_s": cpu_s, "gb": nbytes / 1e9}
            del loader
            for phase, f in figures.items():
                row = {"path": path, "phase": phase, **f, "state_gb": state_gb}
                row["gb_per_s"] = f["gb"] / f["wall_s"]
                row["cpu_s_per_gb"] = f["cpu_s"] / f["gb"]
                rows.append(row)
                print(f"{path:22} {phase}: {row['gb_per_s']:.2f} GB/s to the device, "
                      f"{row['cpu_s_per_gb']:.3f} CPU-s per GB", flush=True)  # fmt: skip
        result = {
            "device": torch.cuda.get_device_name(device) if device is not None else "cpu (smoke)",
            "cpus": os.cpu_count(),
            "settings": {k: v for k, v in vars(args).items() if k not in ("out", "work")},
            "data": {"samples": len(lengths), "tokens": sum(lengths), "state_gb": state_gb, "setup_s": setup_s},
            "rows": rows,
            "notes": "gb = bytes of every batch tensor delivered (padding included); cpu_s = user + system of this "
            "process and its DataLoader workers (psutil); cold = after posix_fadvise(DONTNEED) of the files",
        }
        (out / "feed_gpu.json").write_text(json.dumps(result, indent=1))
        print(json.dumps(result, indent=1))
        return 0
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
