"""The read-through cache of shard objects (``Dataset(url, cache_dir=...)``, docs/STORAGE.md): a later epoch reads
local copies without a GET, the size cap holds (LRU eviction), and a corrupted copy is detected and read again; against
the real s3s-fs of tests/helpers/s3server.py (skipped, saying why, without it)."""

from __future__ import annotations

import pickle

import pytest
import test_object_store
import torch
from helpers import s3server
from test_object_store import requests, served_dataset

import eagle_io
from eagle_io import _native

s3 = test_object_store.s3  # the running server fixture

pytestmark = pytest.mark.skipif(s3server.available() is not None, reason=str(s3server.available()))


def epoch(ds: eagle_io.Dataset, samples: dict) -> None:
    """Reads every sample and checks it bit for bit."""
    for pos in range(len(ds)):
        item = ds[pos]
        for name, t in samples[item["sample_id"]].items():
            assert torch.equal(item[name].view(torch.uint8), t.view(torch.uint8)), (pos, name)


def cached_files(cache) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in cache.rglob("*.eio")}


def delta(before: dict) -> dict:
    now = _native.storage_stats()
    return {k: now[k] - before[k] for k in now}


def test_second_epoch_issues_no_gets(s3, tmp_path):
    url, _, samples = served_dataset(s3, n=12)
    cache = tmp_path / "cache"
    before = _native.storage_stats()
    ds = eagle_io.Dataset(url, cache_dir=cache)
    epoch(ds, samples)
    shards = ds.manifest["shards"]
    d = delta(before)
    assert d["cache_fills"] == len(shards) and d["cache_hits"] == 0
    assert cached_files(cache) == {s["file"].split("/")[-1]: s["bytes"] for s in shards}
    before = _native.storage_stats()
    again = eagle_io.Dataset(url, cache_dir=cache)
    epoch(again, samples)
    d = delta(before)
    assert d["requests"] == 1, "the manifest only"
    assert d["cache_hits"] == len(shards) and d["cache_fills"] == 0
    before = requests()
    epoch(ds, samples)  # the first reader reads its filled copies too
    assert requests() == before


def test_cap_is_respected_by_evicting_the_least_recently_used(s3, tmp_path):
    url, _, samples = served_dataset(s3, n=12)
    cache = tmp_path / "cache"
    shards = eagle_io.Dataset(url).manifest["shards"]
    cap = max(s["bytes"] for s in shards) * 2
    assert sum(s["bytes"] for s in shards) > cap
    before = _native.storage_stats()
    ds = eagle_io.Dataset(url, cache_dir=cache, cache_bytes=cap)
    epoch(ds, samples)
    assert 0 < sum(cached_files(cache).values()) <= cap
    assert delta(before)["cache_evicted"] >= len(shards) - 2
    last = shards[-1]["file"].split("/")[-1]
    assert last in cached_files(cache), "the most recently used shard is kept"
    # A cap below one shard: nothing is cached, each such shard counted, reads still exact.
    before = _native.storage_stats()
    tiny = eagle_io.Dataset(url, cache_dir=tmp_path / "tiny", cache_bytes=1)
    epoch(tiny, samples)
    assert delta(before)["cache_too_big"] == len(shards) and cached_files(tmp_path / "tiny") == {}


def test_corrupted_copies_are_detected_and_read_again(s3, tmp_path):
    url, _, samples = served_dataset(s3, n=12)
    cache = tmp_path / "cache"
    epoch(eagle_io.Dataset(url, cache_dir=cache), samples)
    files = sorted(cache.rglob("*.eio"))
    assert len(files) >= 3
    # 1: a record byte flipped (same size, same index): caught by the record's checksum.
    data = bytearray(files[0].read_bytes())
    data[len(data) // 2] ^= 0xFF
    files[0].write_bytes(bytes(data))
    # 2: a footer byte flipped: caught at open against the manifest.
    data = bytearray(files[1].read_bytes())
    data[-3] ^= 0xFF
    files[1].write_bytes(bytes(data))
    # 3: truncated: not the manifest's size, so not used.
    files[2].write_bytes(files[2].read_bytes()[:100])
    before = _native.storage_stats()
    ds = eagle_io.Dataset(url, cache_dir=cache)
    epoch(ds, samples)
    d = delta(before)
    assert d["cache_refetched"] == 2, d
    assert d["cache_fills"] == 2, "the truncated copy and the one refused at open are downloaded again"
    assert files[1].read_bytes() != bytes(data) and files[2].stat().st_size > 100


def test_bad_cache_arguments(s3, tmp_path):
    url, _, _ = served_dataset(s3, n=2)
    with pytest.raises(eagle_io.InvalidArgumentError, match="cache_bytes"):
        eagle_io.Dataset(url, cache_dir=tmp_path, cache_bytes=-1)


def test_shard_dataset_passes_the_cache_on_and_pickles_it(s3, tmp_path):
    url, _, samples = served_dataset(s3, n=12)
    sd = eagle_io.ShardDataset(url, cache_dir=tmp_path / "c")

    def ids(dataset: eagle_io.ShardDataset) -> list[int]:
        loader = torch.utils.data.DataLoader(dataset, batch_size=4, collate_fn=eagle_io.feed.PaddingCollator())
        return sorted(sid for b in loader for sid in b["sample_ids"])

    assert ids(sd) == sorted(samples)
    before = requests()
    clone = pickle.loads(pickle.dumps(sd))
    assert ids(clone) == sorted(samples)
    assert requests() - before == 1, "the manifest only: every shard from the cache"


def test_follow_passes_the_cache_on(s3, tmp_path):
    url, _, samples = served_dataset(s3, n=12)
    shards = eagle_io.Dataset(url).manifest["shards"]
    for fills, hits in ((len(shards), 0), (0, len(shards))):  # a second follow reads the copies the first filled
        before = _native.storage_stats()
        follower = eagle_io.ShardDataset(url, follow=True, cache_dir=tmp_path / "c", timeout_s=10)
        assert sorted(item["sample_id"] for item in follower) == sorted(samples)
        d = delta(before)
        assert (d["cache_fills"], d["cache_hits"]) == (fills, hits)
