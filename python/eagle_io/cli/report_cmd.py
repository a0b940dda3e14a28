"""Write a self-contained HTML report of a dataset: lengths, loss-mask coverage, per-layer state statistics,
shards, capture throughput, skipped records, metadata (--json: the same figures as JSON)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from ..errors import InvalidArgumentError, StorageError
from ..report.figures import DEFAULT_SAMPLE
from ..store import layout
from .io_paths import check_output
from .progress import stage_progress


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="dataset directory or manifest file")
    p.add_argument("--out", help="HTML file to write (default: report.html in the dataset directory)")
    p.add_argument(
        "--sample",
        type=int,
        default=DEFAULT_SAMPLE,
        help=f"read the hidden states of at most N samples, drawn at random (default {DEFAULT_SAMPLE})",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the state sample")
    p.add_argument("--json", action="store_true", help="print the figures as JSON (and write HTML only with --out)")


def run(args: argparse.Namespace) -> int:
    from ..report import build_figures, render  # matplotlib is imported by render only

    # Where the page goes, checked before the figures are computed (they were, then the write failed).
    out = args.out
    if out is None and not args.json:
        if layout.is_url(args.path):  # the default, beside the manifest, is no local file
            raise InvalidArgumentError(f"{args.path} is in object storage: pass --out FILE.html (or --json)")
        out = os.path.join(os.path.dirname(layout.manifest_file(args.path)), "report.html")
    check_output("--out" if args.out else "the report (default --out)", out, directory=False, makes_parents=False)
    t0 = time.perf_counter()
    with stage_progress() as progress:
        figures = build_figures(args.path, sample=args.sample, seed=args.seed, progress=progress)
    if args.json:
        print(json.dumps(figures, indent=1))
        if not args.out:
            return 0
    page = render(figures)
    tmp = f"{out}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(page)
        os.replace(tmp, out)
    except OSError as e:
        err = StorageError(f"cannot write the report {out}: {e.strerror or e}")
        err.path, err.errno = out, e.errno
        raise err from e
    st = figures["states"]
    print(
        f"report    {out} ({len(page.encode()) / 1e3:,.0f} KB; states of {st['samples_read']:,} of {st['samples']:,} "
        f"samples; {time.perf_counter() - t0:.1f} s)",
        file=sys.stderr if args.json else sys.stdout,
    )
    return 0
