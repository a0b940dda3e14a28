"""Counters for records that dataset preparation skips or modifies.

Nothing in ``eagle_io.data`` drops a record or a turn silently: every skipped record is counted
by reason in :class:`SkipStats.skipped` (with the first few record indices kept as examples) and
every record that is kept but changed (merged turns, dropped leading/trailing turns, truncation)
is counted in :class:`SkipStats.modified`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SkipStats:
    """Per-reason counts of skipped and modified records.

    Attributes:
        skipped: reason -> number of records skipped (not yielded) for that reason.
        modified: reason -> number of times a kept record was changed for that reason.
        examples: reason -> the first ``max_examples`` record indices skipped for that reason
            (``None`` where the source has no record index).
        max_examples: how many example indices to keep per skip reason.
    """

    skipped: Counter[str] = field(default_factory=Counter)
    modified: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[int | None]] = field(default_factory=dict)
    max_examples: int = 5

    def skip(self, reason: str, index: int | None = None) -> None:
        """Count one skipped record under ``reason``; remember ``index`` as an example."""
        self.skipped[reason] += 1
        kept = self.examples.setdefault(reason, [])
        if len(kept) < self.max_examples:
            kept.append(index)

    def modify(self, reason: str, count: int = 1) -> None:
        """Count ``count`` modifications of kept records under ``reason``."""
        if count:
            self.modified[reason] += count

    @property
    def total_skipped(self) -> int:
        """Total number of skipped records over all reasons."""
        return sum(self.skipped.values())

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable summary: ``{"skipped": {...}, "modified": {...}, "examples": {...}}``."""
        return {
            "skipped": dict(sorted(self.skipped.items())),
            "modified": dict(sorted(self.modified.items())),
            "examples": {k: list(v) for k, v in sorted(self.examples.items())},
        }

    def __str__(self) -> str:
        skipped = ", ".join(f"{k}={v}" for k, v in sorted(self.skipped.items())) or "none"
        modified = ", ".join(f"{k}={v}" for k, v in sorted(self.modified.items())) or "none"
        return f"skipped: {skipped}; modified: {modified}"
