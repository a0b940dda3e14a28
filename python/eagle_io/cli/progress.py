"""Progress bars for the long commands: a bar with a total and an ETA on a terminal; otherwise (a log file, CI) a
full line at most every :data:`eagle_io.defaults.PROGRESS_LOG_S` seconds while the work advances, plus the first
and the last.

Bars go to stderr, so a command's stdout (JSON, summaries) stays clean.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from typing import IO, Any

from .. import defaults

TTY_INTERVAL_S = 2.0  # a terminal's bar is redrawn at most this often


class LineStream:
    """A stream for tqdm off a terminal: each state tqdm draws (``"\\r" + line + padding``) becomes one full line;
    the blank writes that erase or end a bar are dropped."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def write(self, s: str) -> None:
        line = s.replace("\r", "").strip()
        if line:
            self.stream.write(line + "\n")
            self.stream.flush()

    def flush(self) -> None:
        self.stream.flush()

    @property
    def encoding(self) -> str | None:
        """The stream's encoding (tqdm draws its bar in Unicode blocks when it is UTF-8)."""
        return getattr(self.stream, "encoding", None)


def bar(total: int | None, unit: str, desc: str | None = None, *, unit_scale: bool = False) -> Any:
    """A tqdm bar on stderr; ``total`` None when unknown (then no ETA). Off a terminal it prints full lines, at most
    one per ``defaults.PROGRESS_LOG_S`` seconds (:class:`LineStream`)."""
    from tqdm import tqdm

    tty = sys.stderr.isatty()
    return tqdm(
        total=total,
        unit=unit,
        desc=desc,
        file=sys.stderr if tty else LineStream(sys.stderr),
        unit_scale=unit_scale,
        mininterval=TTY_INTERVAL_S if tty else defaults.PROGRESS_LOG_S,
        # Off a terminal, no redraw by tqdm's monitor thread: it does not reset the print time, so the next update
        # printed a second line seconds later (a log line pair 2 s apart, seen in a `make generate` log).
        maxinterval=10.0 if tty else float("inf"),
        dynamic_ncols=tty,
    )


class Callback:
    """Adapts a ``progress(done, total)`` callback to a bar created at the first call."""

    def __init__(self, unit: str, desc: str | None = None) -> None:
        self.unit, self.desc = unit, desc
        self.bar: Any = None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            self.bar = bar(total, self.unit, self.desc)
        self.bar.total = total
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


@contextlib.contextmanager
def callback(unit: str, desc: str | None = None) -> Iterator[Callback]:
    """A :class:`Callback` closed on exit."""
    cb = Callback(unit, desc)
    try:
        yield cb
    finally:
        cb.close()


@contextlib.contextmanager
def stage_progress() -> Iterator[Callable[[str, int, int], None]]:
    """``progress(stage, done, total)``: one bar per stage (a new stage closes the previous bar)."""
    current: dict[str, Callback] = {}

    def progress(stage: str, done: int, total: int) -> None:
        if stage not in current:
            for cb in current.values():
                cb.close()
            current.clear()
            current[stage] = Callback("sample", stage)
        current[stage](done, total)

    try:
        yield progress
    finally:
        for cb in current.values():
            cb.close()


def process_read_bytes() -> int | None:
    """Bytes this process has read so far (Linux ``/proc/self/io`` ``rchar``: read and pread calls), or None."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("rchar:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


@contextlib.contextmanager
def read_bytes_bar(total_bytes: int, desc: str) -> Iterator[None]:
    """A bar over ``total_bytes`` fed by the bytes this process reads while the block runs (for native work that
    reports no progress, e.g. ``verify``); nothing where ``/proc/self/io`` is unavailable."""
    start = process_read_bytes()
    if start is None:
        yield
        return
    b = bar(total_bytes, "B", desc, unit_scale=True)
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(0.5):
            now = process_read_bytes()
            if now is not None:
                b.update(min(total_bytes, now - start) - b.n)

    thread = threading.Thread(target=poll, name="eagle-io-progress", daemon=True)
    thread.start()
    ok = False
    try:
        yield
        ok = True
    finally:
        stop.set()
        thread.join()
        if ok:
            b.update(total_bytes - b.n)
        b.close()
