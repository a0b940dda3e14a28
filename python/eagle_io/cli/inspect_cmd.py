"""Summarise a dataset from its manifest and shard indexes: samples, tokens, bytes, ratio, metadata."""

from __future__ import annotations

import argparse
import json

from ..store.reader import Dataset


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="dataset directory or manifest file")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def summary(ds: Dataset) -> dict:
    """Totals over the committed shards (from the manifest, cross-checked against the indexes at open)."""
    shards = ds.manifest["shards"]
    raw = sum(s["raw_bytes"] for s in shards)
    stored = sum(s["bytes"] for s in shards)
    return {
        "manifest": ds.manifest_path,
        "complete": ds.manifest["complete"],
        "writer": ds.manifest["writer"],
        "format_version": ds.manifest["format_version"],
        "shards": len(shards),
        "samples": len(ds),
        "tokens": sum(s["tokens"] for s in shards),
        "raw_bytes": raw,
        "stored_bytes": stored,
        "ratio": round(raw / stored, 4) if stored else None,
        "schema": ds.manifest["schema"]["tensors"],
        "codec": ds.manifest["codec"],
        "metadata": ds.metadata,
    }


def run(args: argparse.Namespace) -> int:
    s = summary(Dataset(args.path, threads=1))
    if args.json:
        print(json.dumps(s, indent=2))
        return 0
    print(f"dataset   {s['manifest']} ({'complete' if s['complete'] else 'INCOMPLETE: writer did not close'})")
    print(f"written   by {s['writer']}, format v{s['format_version']}")
    print(f"samples   {s['samples']:,} in {s['shards']} shard(s), {s['tokens']:,} tokens")
    ratio = f"{s['ratio']:.3f}x" if s["ratio"] else "n/a"
    print(f"bytes     {s['stored_bytes']:,} stored, {s['raw_bytes']:,} decoded (ratio {ratio})")
    print(
        "schema    "
        + ", ".join(f"{t['name']} {t['dtype']}" + (f"[L, {t['width']}]" if t["width"] else "[L]") for t in s["schema"])
    )
    print("metadata  " + json.dumps(s["metadata"], indent=2, sort_keys=True).replace("\n", "\n          "))
    return 0
