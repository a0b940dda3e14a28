"""Read, checksum and decode every record, then check the decoded states' values; list every bad record and value
problem. Exit 1 for a bad record or NaN/Inf states, and under --strict for implausible states too. A dataset on
object storage also gets its orphan objects listed (objects under its prefix that no manifest names: an interrupted
upload), never deleted; they do not fail the run."""

from __future__ import annotations

import argparse

from ..errors import EagleIOError
from ..store.layout import is_url
from ..store.manifest import read_manifest
from ..store.masks import manifest_file
from ..store.reader import Dataset
from ..store.value_scan import scan_dataset
from ..store.values import IMPLAUSIBLE, KINDS
from .progress import read_bytes_bar

SHOWN_PER_KIND = 20


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="dataset directory or manifest file")
    p.add_argument("--threads", type=int, default=0, help="decode threads (0 = one per CPU)")
    p.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 also for implausible states (all-zero samples or layers, rows copied from another sample)",
    )
    p.add_argument("--no-values", action="store_true", help="skip the value section (checksums and decoding only)")
    p.add_argument("--window", type=int, default=256, help="samples compared with each other for copied rows")


def run(args: argparse.Namespace) -> int:
    total = sum(s["bytes"] for s in read_manifest(manifest_file(args.path))["shards"])
    with read_bytes_bar(total, "verify"):  # the native pass reports no progress: count the bytes it reads
        bad = Dataset.verify(args.path, threads=args.threads)
    for shard, sample_id, offset, message in bad:
        who = f"sample id {sample_id}" if sample_id is not None else "whole shard"
        print(f"BAD {shard}: {who}, byte offset {offset}: {message}")
    if bad:
        print(f"{len(bad)} bad record(s)")
    else:
        ds = Dataset(args.path, threads=1)
        print(f"OK {len(ds):,} samples in {len(ds.manifest['shards'])} shard(s) verified")
    if is_url(args.path):
        _orphans(args.path)
    if args.no_values:
        return 1 if bad else 0
    failed = _values(args)
    return 1 if bad or failed else 0


def _orphans(url: str) -> None:
    """Lists the objects under the dataset's prefix that no manifest names (nothing is deleted)."""
    from ..store.remote import orphan_objects

    orphans = orphan_objects(url)
    for u, n in orphans:
        print(f"ORPHAN {u}: {n:,} bytes that no manifest names (an interrupted upload?); not deleted")
    total = sum(n for _, n in orphans)
    print(f"orphans   {len(orphans)} object(s), {total:,} bytes (incomplete multipart uploads are not listed: abort "
          "them with a lifecycle rule, docs/STORAGE.md)")  # fmt: skip


def _values(args: argparse.Namespace) -> bool:
    """Prints the value section; returns whether it fails the run (NaN/Inf, or any problem under --strict)."""
    try:
        r = scan_dataset(args.path, window=args.window, threads=args.threads)
    except EagleIOError as e:  # a missing or truncated shard, listed above: the dataset does not open
        print(f"values    not checked: the dataset does not open ({type(e).__name__}: {e})")
        return False
    if not r["checked"]:
        print("values    not checked: the schema has no aux_hidden_states [L, k*H] / hidden_states [L, H] pair")
        return False
    counts = ", ".join(f"{k} {r['counts'][k]:,}" for k in KINDS)
    print(
        f"values    {r['samples']:,} samples, {r['tokens']:,} tokens decoded and checked; samples with a problem, "
        f"by kind: {counts}"
    )
    blocks = r["absmax"]["blocks"]
    print("max |x|   " + ", ".join(f"{b} {v:.4g}" for b, v in zip(blocks, r["absmax"]["values"], strict=True)))
    for kind in KINDS:
        problems = [p for p in r["problems"] if p["kind"] == kind]
        label = "VALUE FAIL" if kind not in IMPLAUSIBLE or args.strict else "VALUE WARN"
        for p in problems[:SHOWN_PER_KIND]:
            print(f"{label} {kind}: {p['message']}")
        if len(problems) > SHOWN_PER_KIND:
            print(f"{label} {kind}: ... and {len(problems) - SHOWN_PER_KIND} more")
    nonfinite = r["counts"]["nonfinite"]
    implausible = sum(r["counts"][k] for k in IMPLAUSIBLE)
    if nonfinite or implausible:
        tail = "" if args.strict or not implausible else " (implausible states fail only under --strict)"
        print(f"{nonfinite} sample(s) with NaN/Inf states, {implausible} with implausible states{tail}")
    return bool(nonfinite or (args.strict and implausible))
