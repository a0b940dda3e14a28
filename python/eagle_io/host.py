"""What the host has: the memory available now, for the estimates made before a large allocation (the capture
ring, the Loader's batch buffers), so an option that cannot fit is refused with the figures instead of taking the
machine down."""

from __future__ import annotations

import os

__all__ = ["available_memory", "cache_dir", "gpu_memory", "human_bytes"]


def available_memory() -> int | None:
    """Bytes of memory available now: Linux's ``MemAvailable`` (free pages plus the page cache and other memory the
    kernel can reclaim; a checkpoint read once stays in the page cache), else ``SC_AVPHYS_PAGES`` (free pages), None
    where neither is known."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
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


def gpu_memory() -> list[tuple[int, int]] | None:
    """``(free, total)`` bytes of each visible NVIDIA GPU, in ``CUDA_VISIBLE_DEVICES`` order when it lists indices,
    from ``nvidia-smi`` (no CUDA context is made here: a server launched next gets all of each GPU). None where
    ``nvidia-smi`` is not installed or fails (no NVIDIA GPU, or another vendor's)."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    query = [smi, "--query-gpu=index,memory.free,memory.total", "--format=csv,noheader,nounits"]
    try:
        text = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True).stdout
        rows = {int(i): (int(f) << 20, int(t) << 20) for i, f, t in (line.split(",") for line in text.splitlines())}
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and all(v.strip().isdigit() for v in visible.split(",") if v.strip()):
        return [rows[int(v)] for v in visible.split(",") if v.strip() and int(v) in rows]
    return [rows[i] for i in sorted(rows)]
