"""Checks of what a writer left on disk, shared by the crash and fault tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import eagle_io
from eagle_io.store.manifest import manifest_bytes
from helpers import jobs
from helpers.shard_bytes import layout, shard_entry


def read_ids(manifest: Path) -> list[int]:
    ds = eagle_io.Dataset(manifest, threads=1)
    return [ds.entry(p).sample_id for p in range(len(ds))]


def on_disk(root: Path) -> dict:
    """Checks what a killed writer left and describes it: listed shards verify and the dataset opens;
    committed shards the manifest does not list yet (orphans) verify too (through a probe manifest
    that lists them, removed afterwards); temp shards are never listed."""
    shards = root / "shards"
    temps = sorted(p.name for p in shards.glob(".*.eio.tmp")) if shards.exists() else []
    files = sorted(p.name for p in shards.glob("r*.eio")) if shards.exists() else []
    manifest = root / "manifest.json"
    state = {"manifest": manifest.exists(), "temps": temps, "listed": [], "orphans": [], "listed_ids": []}
    state["manifest_temp"] = (root / ".manifest.json.tmp").exists()
    if not manifest.exists():
        # The manifest is written before any shard: no manifest means nothing was committed.
        assert files == [], f"committed shards without a manifest: {files}"
        with pytest.raises(eagle_io.StorageError):
            eagle_io.Dataset(root)
        state["orphan_ids"] = []
        return state
    assert eagle_io.Dataset.verify(root) == []
    m = json.loads(manifest.read_text())
    state["listed"] = [Path(s["file"]).name for s in m["shards"]]
    state["complete"] = m["complete"]
    assert all(f"shards/{n}" in {s["file"] for s in m["shards"]} for n in state["listed"])
    assert not any(n.endswith(".tmp") for n in state["listed"])
    state["listed_ids"] = read_ids(root)
    state["orphans"] = [f for f in files if f not in state["listed"]]
    state["orphan_ids"] = []
    if state["orphans"]:
        probe = root / "probe-orphans.json"
        probe.write_bytes(manifest_bytes({**m, "shards": [shard_entry(shards / n) for n in state["orphans"]]}))
        try:
            assert eagle_io.Dataset.verify(probe) == [], "an unlisted committed shard must be complete"
            state["orphan_ids"] = read_ids(probe)
        finally:
            probe.unlink()
    return state


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical (dtype, shape and bytes)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return a.numel() == 0 or torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def within_one_bf16_ulp(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape and every element of ``a`` within one bf16 ulp (2^-7 relative) of ``b``: what CPU kernels that
    are not batch-invariant (another batch size, padding or thread count changes the reduction order) allow."""
    a, b = a.float(), b.float()
    return a.shape == b.shape and bool(torch.all((a - b).abs() <= b.abs() * 2**-7 + 1e-6))


def check_samples(root: Path, expected_ids: list[int], long_from: int | None = None) -> None:
    """The dataset holds exactly ``expected_ids``, each once, each bit-identical to what was written."""
    ds = eagle_io.Dataset(root, threads=1)
    ids = [ds.entry(p).sample_id for p in range(len(ds))]
    assert len(ids) == len(set(ids)), "duplicate sample ids"
    assert sorted(ids) == sorted(expected_ids)
    for p, sid in enumerate(ids):
        got, want = ds[p], jobs.sample(sid, long_from=long_from)
        assert got["sample_id"] == sid and ds.entry(p).key == f"conv-{sid}"
        for name, t in want.items():
            assert same(got[name], t), (sid, name)


def damage_record(root: Path, sample_id: int) -> tuple[str, int, int]:
    """Flips a byte in the middle of ``sample_id``'s record (found through the shard indexes, FORMAT.md 4.3),
    leaving its index entry intact. Returns ``(shard path, record offset, record length)``."""
    for s in json.loads((root / "manifest.json").read_text())["shards"]:
        shard = root / s["file"]
        lay = layout(shard)
        for sid, off, length in lay["records"]:
            if sid == sample_id:
                data = bytearray(lay["data"])
                data[off + length // 2] ^= 0x5A
                shard.write_bytes(bytes(data))
                return str(shard), off, length
    raise AssertionError(f"sample {sample_id} is not in {root}")
