"""Read, checksum and decode every record; list every bad record; exit 1 if any."""

from __future__ import annotations

import argparse

from ..store.manifest import read_manifest
from ..store.masks import manifest_file
from ..store.reader import Dataset
from .progress import read_bytes_bar


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="dataset directory or manifest file")
    p.add_argument("--threads", type=int, default=0, help="decode threads (0 = one per CPU)")


def run(args: argparse.Namespace) -> int:
    total = sum(s["bytes"] for s in read_manifest(manifest_file(args.path))["shards"])
    with read_bytes_bar(total, "verify"):  # the native pass reports no progress: count the bytes it reads
        bad = Dataset.verify(args.path, threads=args.threads)
    for shard, sample_id, offset, message in bad:
        who = f"sample id {sample_id}" if sample_id is not None else "whole shard"
        print(f"BAD {shard}: {who}, byte offset {offset}: {message}")
    if bad:
        print(f"{len(bad)} bad record(s)")
        return 1
    ds = Dataset(args.path, threads=1)
    print(f"OK {len(ds):,} samples in {len(ds.manifest['shards'])} shard(s) verified")
    return 0
