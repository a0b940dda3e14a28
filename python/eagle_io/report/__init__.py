"""``eagle-io report``: a self-contained HTML page (and JSON figures) describing a dataset before training on it.

:func:`build_figures` computes the numbers (:mod:`.figures`), :func:`render` draws the page (:mod:`.html`, plots by
matplotlib, imported only there); :mod:`.capture_log` is the per-interval log ``eagle-io generate`` keeps.
"""

from __future__ import annotations

from typing import Any

from .figures import build_figures

__all__ = ["build_figures", "render"]


def render(figures: dict[str, Any]) -> str:
    """The HTML page for ``figures``. Raises MissingDataPackageError when matplotlib is not installed."""
    from .html import render as _render

    return _render(figures)
