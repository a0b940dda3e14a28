"""Batch reads from object storage (docs/STORAGE.md "How it reads"): a batch's adjacent records coalesced into one
ranged GET, long spans cut into parts, several GETs in flight per reader; against the real s3s-fs of
tests/helpers/s3server.py (skipped, saying why, without it)."""

from __future__ import annotations

import math
import os

import pytest
import test_object_store
import torch
from helpers import s3server
from test_object_store import requests, served_dataset

import eagle_io
from eagle_io import _native, defaults
from eagle_io.feed import PaddingCollator

s3 = test_object_store.s3  # the running server fixture

pytestmark = pytest.mark.skipif(s3server.available() is not None, reason=str(s3server.available()))


def outputs(ds: eagle_io.Dataset, pos: int) -> dict[str, torch.Tensor]:
    n = ds.entry(pos).n_tokens
    return {s.name: torch.empty((n,) if s.width is None else (n, s.width), dtype=getattr(torch, s.dtype))
            for s in ds.schema}  # fmt: skip


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    for name, t in want.items():
        assert torch.equal(got[name].view(torch.uint8), t.view(torch.uint8)), name


def shard_of_positions(ds: eagle_io.Dataset) -> list[int]:
    return [k for k, s in enumerate(ds.manifest["shards"]) for _ in range(s["samples"])]


def test_defaults_are_exported():
    assert defaults.REMOTE_IN_FLIGHT == _native.DEFAULTS["remote_in_flight"] == 8
    assert defaults.REMOTE_COALESCE_GAP == 256 << 10 and defaults.REMOTE_PART_BYTES == 8 << 20


def test_batch_coalesces_adjacent_records_one_get_per_shard(s3):
    url, root, samples = served_dataset(s3, n=24)
    ds, local = eagle_io.Dataset(url), eagle_io.Dataset(root)
    shards = shard_of_positions(ds)
    assert len(set(shards)) > 2 and len(shards) == 24
    order = list(reversed(range(len(ds))))  # any order: spans are planned by offset
    items = [(p, outputs(ds, p)) for p in order]
    before = requests()
    ds.read_batch(items)
    assert requests() - before == len(set(shards)), "one ranged GET per shard touched (its records are adjacent)"
    for p, out in items:
        assert_same(out, samples[local.entry(p).sample_id])
    # Records of one shard that are not adjacent (a gap over coalesce_gap=0) take one GET each.
    picked = [p for p in range(len(ds)) if shards[p] == shards[0]][::2]
    sparse = eagle_io.Dataset(url)
    sparse._native = _native.Reader(url, 0, 4, 0)
    before = requests()
    sparse.read_batch([(p, outputs(ds, p)) for p in picked])
    assert requests() - before == len(picked) >= 2


def test_a_long_span_is_fetched_in_parts(s3):
    url, root, samples = served_dataset(s3, n=8)
    part = 300  # bytes per GET: below most records here, so those are cut into parts
    ds = eagle_io.Dataset(url)
    ds._native = _native.Reader(url, 0, 2, 1 << 20, part)
    items = [(p, outputs(ds, p)) for p in range(len(ds))]
    before = requests()
    ds.read_batch(items)
    sent = requests() - before
    shards = ds.manifest["shards"]
    assert len(shards) < len(items) < sent, f"{sent} GETs: spans were cut at {part} bytes"
    assert sent <= sum(math.ceil(s["bytes"] / part) for s in shards) + len(items)
    local = eagle_io.Dataset(root)
    for p, out in items:
        assert_same(out, samples[local.entry(p).sample_id])


def test_requests_in_flight_are_bounded_per_reader(s3, monkeypatch):
    url, _, _ = served_dataset(s3, n=24)
    proxy = s3server.FaultProxy(s3.port)
    try:
        monkeypatch.setenv("AWS_ENDPOINT", proxy.endpoint)  # a new client: the endpoint is part of its key
        for bound in (2, 5):
            ds = eagle_io.Dataset(url)
            ds._native = _native.Reader(url, 0, bound, 0, 2_000)  # 2 kB parts: dozens of GETs per batch
            proxy.most_at_once = 0
            before = proxy.forwarded
            ds.read_batch([(p, outputs(ds, p)) for p in range(len(ds))])
            assert proxy.forwarded - before > 3 * bound
            assert 2 <= proxy.most_at_once <= bound, (bound, proxy.most_at_once)
    finally:
        proxy.stop()


def test_in_flight_must_be_positive(s3):
    url, _, _ = served_dataset(s3, n=2)
    with pytest.raises(eagle_io.InvalidArgumentError, match="in_flight"):
        eagle_io.Dataset(url, in_flight=0)
    with pytest.raises(eagle_io.InvalidArgumentError, match="in_flight"):
        _native.Reader(url, 0, 0)


def test_failed_get_in_a_batch_names_the_object(s3):
    url, root, _ = served_dataset(s3, n=12)
    ds = eagle_io.Dataset(url, in_flight=3)
    shard = sorted((root / "shards").iterdir())[-1]
    os.truncate(shard, shard.stat().st_size // 2)
    with pytest.raises(eagle_io.ObjectStorageError) as e:
        ds.read_batch([(p, outputs(ds, p)) for p in range(len(ds))])
    assert e.value.url == f"{url}/shards/{shard.name}" and "truncated object" in str(e.value)


def test_dataloader_batches_through_read_many_coalesce(s3):
    url, _, samples = served_dataset(s3, n=24)
    sd = eagle_io.ShardDataset(url)
    loader = torch.utils.data.DataLoader(sd, batch_size=8, collate_fn=PaddingCollator())
    before = requests()
    seen = []
    for batch in loader:
        seen += batch["sample_ids"]
    sent = requests() - before
    assert sorted(seen) == sorted(samples)
    assert sent < len(sd), f"{sent} GETs for {len(sd)} records"
