"""What every bench script shares: best-of-N timing and the writer of its block in benches/README.md."""

from __future__ import annotations

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
