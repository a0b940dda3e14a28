"""What every bench script shares: best-of-N timing, the writer of its block in benches/README.md, and the setup of
the object-storage benches (real states, a local s3s-fs)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

README = Path(__file__).resolve().parent / "README.md"


def best(fn, repeat):
    """(least wall seconds, least CPU seconds of the whole process, results) of ``repeat`` calls of ``fn``."""
    walls, cpus, outs = [], [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        outs.append(fn())
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return min(walls), min(cpus), outs


def write_section(tag, heading, body):
    """Replaces (or appends) the block between this tag's markers in benches/README.md; other blocks stay."""
    text = (
        README.read_text()
        if README.exists()
        else "# eagle-io benches\n\nScripts in this folder; data from `realdata.py`.\n"
    )
    begin, end = f"<!-- {tag}:begin -->", f"<!-- {tag}:end -->"
    block = f"{begin}\n{heading}\n\n{body}{end}"
    if begin in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    README.write_text(text)


def object_store_args(ap: argparse.ArgumentParser, copies_help: str, quick_help: str) -> None:
    """The options of the object-storage benches: ``-n`` real conversations, ``--copies``, ``--repeat``, ``--quick``."""
    ap.add_argument("-n", type=int, default=44, help="real conversations (realdata.py's cache states-N.pt)")
    ap.add_argument("--copies", type=int, default=4, help=copies_help)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help=quick_help)


def object_store_setup(args: argparse.Namespace, work: Path):
    """Exits saying why when s3s-fs is not built; else loads the real states and starts s3s-fs on ``work/s3root``
    with the environment pointing eagle-io at it. Returns (samples, description, repeats, server)."""
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(here.parent / "tests")]
    from helpers import s3server
    from realdata import load_states

    if s3server.available():
        sys.exit(s3server.available())
    samples, desc = load_states(args.n)
    work.mkdir(parents=True, exist_ok=True)
    server = s3server.S3Server(work / "s3root")
    os.environ.update(server.env())
    return samples, desc, 1 if args.quick else args.repeat, server
