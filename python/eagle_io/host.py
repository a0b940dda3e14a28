"""What the host has: the memory available now, for the estimates made before a large allocation (the capture
ring, the Loader's batch buffers), so an option that cannot fit is refused with the figures instead of taking the
machine down."""

from __future__ import annotations

import os

__all__ = ["available_memory", "cache_dir", "human_bytes"]


def available_memory() -> int | None:
    """Bytes of memory available now (Linux ``SC_AVPHYS_PAGES``: free pages), None where it is not known."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def human_bytes(n: float) -> str:
    """``n`` bytes in a readable decimal unit (``1.50 GB``)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n:,.0f} B"


def cache_dir() -> str:
    """eagle-io's per-user cache directory: ``$EAGLE_IO_CACHE``, default ``~/.cache/eagle-io``."""
    return os.environ.get("EAGLE_IO_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "eagle-io")
