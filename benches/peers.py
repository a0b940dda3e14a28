"""The peer baseline of the feed benches, run the way its users run it, and the accounting that keeps the comparison
honest: SpecForge's per-sample ``.ckpt`` files read as its ``OfflineEagle3Dataset._open_file`` reads them
(``torch.load(mmap=True)``, v0.2.0), page-cache eviction for cold passes, and the CPU of every process.

Used by ``bench_loader.py`` (this machine) and ``gpu/feed_gpu.py`` (a lent GPU machine, where SpecForge itself is
not installed: the reading code below is its ``_open_file``, line for line).
"""

from __future__ import annotations

import ctypes
import gzip
import io
import mmap
import os
from pathlib import Path

import psutil
import torch

# ----------------------------------------------------------------------------------------------- page cache


def evict(paths) -> None:
    """Drops the files' pages from this machine's page cache: ``posix_fadvise(DONTNEED)`` per file (clean pages only:
    every file the benches write is fsynced). Not ``echo 1 > /proc/sys/vm/drop_caches``: it is permitted here, but it
    drops every other user's cache of this shared machine too, and dentries/inodes, which a training job keeps."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)


def resident_fraction(paths) -> float:
    """Fraction of the files' pages in the page cache (``mincore`` on a read-only shared mapping)."""
    page, total, resident = mmap.PAGESIZE, 0, 0
    for p in paths:
        size = os.path.getsize(p)
        if size == 0:
            continue
        fd = os.open(p, os.O_RDONLY)
        try:
            addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                raise OSError(ctypes.get_errno(), f"mmap {p}")
            n = (size + page - 1) // page
            vec = (ctypes.c_ubyte * n)()
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore {p}")
            _libc.munmap(addr, size)
            total += n
            resident += sum(v & 1 for v in vec)
        finally:
            os.close(fd)
    return resident / max(total, 1)


def fsync_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


# ------------------------------------------------------------------------------------------------------ CPU


class AllProcesses:
    """CPU seconds (user + system) of this process and every live child process (DataLoader workers), from
    ``psutil``: persistent workers are counted while they run, which ``getrusage(RUSAGE_CHILDREN)`` (reaped children
    only) misses."""

    def __init__(self) -> None:
        self.me = psutil.Process()

    def seconds(self) -> float:
        total = 0.0
        for p in [self.me, *self.me.children(recursive=True)]:
            try:
                t = p.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += t.user + t.system
        return total


# -------------------------------------------------------------------------------------------- SpecForge files


def specforge_bytes(s: dict, gz: bool) -> bytes:
    """SpecForge's per-sample file: ``torch.save`` of input_ids [L] int64, loss_mask [L] int64,
    aux_hidden_state [1, L, 3H], hidden_state [1, L, H] (scripts/prepare_hidden_states.py), optionally gzip-6."""
    buf = io.BytesIO()
    torch.save(
        {
            "input_ids": s["input_ids"],
            "loss_mask": s["loss_mask"].to(torch.int64),
            "aux_hidden_state": s["aux_hidden_states"][None],
            "hidden_state": s["hidden_states"][None],
        },
        buf,
    )
    return gzip.compress(buf.getvalue(), 6) if gz else buf.getvalue()


def specforge_path(root: Path, idx: int, gz: bool) -> Path:
    g = idx // 2000 * 2000
    return root / f"rows_{g}-{g + 2000}" / f"data_{idx}.ckpt{'.gz' if gz else ''}"


def list_local_files(root, suffixes) -> list[str]:
    """SpecForge's listing (``os.walk`` + suffix filter), then sorted by sample index so all formats share ids."""
    out = [os.path.join(d, f) for d, _, files in os.walk(root) for f in files if f.endswith(suffixes)]
    return sorted(out, key=lambda p: int(os.path.basename(p).split("_")[1].split(".")[0]))


def load_specforge(path: str):
    """SpecForge's ``OfflineEagle3Dataset._open_file``: gzip fully inflated, else ``torch.load(mmap=True)``."""
    if path.endswith(".gz"):
        with gzip.open(path, "rb") as f:
            return torch.load(io.BytesIO(f.read()), weights_only=False)
    return torch.load(path, weights_only=False, mmap=True)


class SpecForgeStyleDataset(torch.utils.data.Dataset):
    """Per-sample files (``paths``, in the order of the eagle-io items they hold) -> the same items as
    ``eagle_io.feed.ShardDataset``, so that both feed the same collator (which is where mmap'd pages are read)."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> dict:
        d = load_specforge(self.paths[i])
        return {
            "input_ids": d["input_ids"],
            "loss_mask": d["loss_mask"],
            "aux_hidden_states": d["aux_hidden_state"][0],
            "hidden_states": d["hidden_state"][0],
            "sample_id": i,
            "dataset_index": 0,
        }
