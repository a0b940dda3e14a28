"""Summarise a dataset from its manifest and shard indexes: samples, tokens, length percentiles, bytes, ratio,
metadata, and the supervised-token share (from the records' loss_mask tensors alone: each record checksummed, no
hidden state decoded; local or object storage)."""

from __future__ import annotations

import argparse
import json

import numpy as np

from ..report.figures import mask_figures, percentiles
from ..store.masks import mask_counts
from ..store.reader import Dataset
from ..store.transcode import lossy_history


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="dataset directory or manifest file")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument(
        "--no-masks",
        action="store_true",
        help="skip the loss masks (they read every record: manifest and indexes only)",
    )


def mask_summary(ds: Dataset) -> dict:
    """Supervised-token figures (:func:`eagle_io.report.figures.mask_figures`, without the histogram) from the
    loss_mask tensors alone (every record checksummed, local or object storage), plus how many were unreadable."""
    counts = mask_counts(ds)
    figures = mask_figures(counts.lengths, counts.supervised)
    del figures["share_histogram"]
    return {**figures, "unreadable": len(counts.unreadable)}


def summary(ds: Dataset, *, masks: bool = True) -> dict:
    """Totals over the committed shards (from the manifest, cross-checked against the indexes at open), token
    length percentiles (from the indexes) and, with ``masks``, :func:`mask_summary`."""
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
        "length_percentiles": percentiles(np.asarray(ds.lengths(), dtype=np.int64)),
        "loss_mask": mask_summary(ds) if masks else None,
        "raw_bytes": raw,
        "stored_bytes": stored,
        "ratio": round(raw / stored, 4) if stored else None,
        "schema": ds.manifest["schema"]["tensors"],
        "codec": ds.manifest["codec"],
        "lossy_history": lossy_history(ds.metadata, ds.schema),
        "metadata": ds.metadata,
    }


def run(args: argparse.Namespace) -> int:
    s = summary(Dataset(args.path, threads=1), masks=not args.no_masks)
    if args.json:
        print(json.dumps(s, indent=2))
        return 0
    print(f"dataset   {s['manifest']} ({'complete' if s['complete'] else 'INCOMPLETE: writer did not close'})")
    print(f"written   by {s['writer']}, format v{s['format_version']}")
    print(f"samples   {s['samples']:,} in {s['shards']} shard(s), {s['tokens']:,} tokens")
    p = s["length_percentiles"]
    if p["max"] is not None:
        print(
            f"lengths   min {p['min']:,}, p10 {p['p10']:,}, p50 {p['p50']:,}, p90 {p['p90']:,}, p99 {p['p99']:,}, "
            f"max {p['max']:,} tokens (mean {p['mean']:,.1f})"
        )
    m = s["loss_mask"]
    if m and m["supervised_share"] is not None:
        print(
            f"masks     {100 * m['supervised_share']:.1f}% of tokens supervised ({m['supervised_tokens']:,}); per "
            f"sample mean {100 * m['mean_sample_share']:.1f}%; {m['all_zero']:,} all-zero, {m['all_one']:,} all-one"
            + (f"; {m['unreadable']:,} masks unreadable (run eagle-io verify)" if m["unreadable"] else "")
        )
    ratio = f"{s['ratio']:.3f}x" if s["ratio"] else "n/a"
    print(f"bytes     {s['stored_bytes']:,} stored, {s['raw_bytes']:,} decoded (ratio {ratio})")
    print(
        "schema    "
        + ", ".join(f"{t['name']} {t['dtype']}" + (f"[L, {t['width']}]" if t["width"] else "[L]") for t in s["schema"])
    )
    print(
        "lossy     " + ("; ".join(s["lossy_history"]) or "no: every state stored lossless, never transcoded from lossy")
    )
    print("metadata  " + json.dumps(s["metadata"], indent=2, sort_keys=True).replace("\n", "\n          "))
    return 0
