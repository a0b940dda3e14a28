"""Rewrite a dataset with its states stored in another precision (bf16 lossless, or fp8: docs/FORMAT.md 3.1)."""

from __future__ import annotations

import argparse
import json

from ..store.transcode import transcode
from .io_paths import check_output
from .progress import callback


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="the dataset to read (a directory with manifest.json, or a manifest file)")
    p.add_argument("--out", required=True, help="the new dataset's directory (must not hold a dataset)")
    p.add_argument("--precision", required=True, choices=["bf16", "fp8"], help="storage of the state tensors")
    p.add_argument("--threads", type=int, default=0, help="encode/decode threads (0 = one per CPU)")


def run(args: argparse.Namespace) -> int:
    check_output("--out", args.out, directory=True, makes_parents=True)
    with callback("samples", "transcode") as cb:
        stats = transcode(args.src, args.out, args.precision, threads=args.threads, progress=cb)
    ratio = stats["raw_bytes"] / max(stats["stored_bytes"], 1)
    keys = ("samples", "tokens", "raw_bytes", "stored_bytes", "fp8_values", "fp8_clamped", "fp8_zero_blocks")
    print(json.dumps({**{k: stats[k] for k in keys}, "ratio": round(ratio, 4)}))
    return 0
