"""The capture log: one JSON line per interval of an ``eagle-io generate`` run, kept in the dataset directory.

``capture_log.jsonl`` (``capture_log.r{rank:05}.jsonl`` for rank > 0 or world size > 1) is appended to by every
run (a resumed run appends its own lines), so ``eagle-io report`` can plot capture throughput over time and the
share of time spent outside the target's forward. Lines, each a JSON object with ``"event"`` and ``"run"`` (the
run's start, Unix seconds):

* ``{"event": "start", "run", "rank", "world_size", "records_total", "max_length", "batch_size"}``
* ``{"event": "interval", "run", "t", "records", "samples", "tokens", "forward_s", "store_s"}``: cumulative since
  the run's capture loop began ``t`` seconds ago: source records done, samples and tokens given to the target
  (committed ones skipped), seconds in the target's forward and in storing states (``None`` where the backend
  does not measure them, e.g. SGLang)
* ``{"event": "end", ...interval fields, "samples_written", "skipped", "modified", "nonfinite_skipped",
  "dropped_ring_full", "already_committed"}``: the run finished; ``skipped`` / ``modified``: source records
  skipped or changed, by reason (:class:`eagle_io.data.SkipStats`)

A line torn by a crash is ignored when read. The file stays small: one line per ``interval_s`` (10 s by default).
"""

from __future__ import annotations

import glob
import json
import os
import time
from typing import Any

from ..errors import StorageError

INTERVAL_S = 10.0


def log_path(root: str | os.PathLike[str], rank: int = 0, world_size: int = 1) -> str:
    """Where the run of ``rank`` (of ``world_size``) logs inside the dataset directory ``root``."""
    name = "capture_log.jsonl" if world_size == 1 and rank == 0 else f"capture_log.r{rank:05}.jsonl"
    return os.path.join(os.fspath(root), name)


def _storage_error(path: str, e: OSError) -> StorageError:
    err = StorageError(f"capture log {path}: {e.strerror or e}")
    err.path, err.errno = path, e.errno
    return err


class CaptureLog:
    """Appends one run's lines; :meth:`tick` writes an ``interval`` line when ``interval_s`` has passed.

    Raises:
        StorageError: the log file cannot be opened or written.
    """

    def __init__(self, path: str, *, interval_s: float | None = None, **start: Any) -> None:
        self.path = path
        self.run = round(time.time(), 3)
        self.interval_s = INTERVAL_S if interval_s is None else interval_s
        self.t0 = time.perf_counter()
        self._last = self.t0
        try:
            self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed by close())
        except OSError as e:
            raise _storage_error(path, e) from e
        self._write({"event": "start", **start})

    def _write(self, line: dict[str, Any]) -> None:
        try:
            self._file.write(json.dumps({**line, "run": self.run}) + "\n")
            self._file.flush()
        except OSError as e:
            raise _storage_error(self.path, e) from e

    def _point(self, counters: dict[str, Any]) -> dict[str, Any]:
        return {"t": round(time.perf_counter() - self.t0, 3), **counters}

    def tick(self, **counters: Any) -> None:
        """Writes an ``interval`` line with these cumulative counters if ``interval_s`` has passed since the last."""
        now = time.perf_counter()
        if now - self._last >= self.interval_s:
            self._last = now
            self._write({"event": "interval", **self._point(counters)})

    def end(self, **fields: Any) -> None:
        """Writes the ``end`` line (final counters, skip counts) and closes the file."""
        self._write({"event": "end", **self._point(fields)})
        self.close()

    def close(self) -> None:
        self._file.close()


def read_logs(root: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], int]:
    """Every line of every capture log in ``root``, in file then line order, and the number of lines skipped
    because they do not parse (torn by a crash). Returns ``([], 0)`` when there is no log."""
    lines: list[dict[str, Any]] = []
    torn = 0
    for path in sorted(glob.glob(os.path.join(os.fspath(root), "capture_log*.jsonl"))):
        with open(path, encoding="utf-8", errors="replace") as f:
            for text in f:
                try:
                    line = json.loads(text)
                except ValueError:
                    torn += 1
                    continue
                if isinstance(line, dict) and "event" in line and "run" in line:
                    lines.append({**line, "log": os.path.basename(path)})
                else:
                    torn += 1
    return lines, torn
