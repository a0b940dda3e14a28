"""Samplers (rank split, length grouping, uneven splits, resume) and DataLoader integration (fork, spawn,
pin_memory, persistent workers) of eagle_io.feed."""

from __future__ import annotations

import warnings
from collections import Counter

import pytest
import torch

import eagle_io
from conftest import FEED_LENGTHS as LENGTHS
from conftest import flat
from eagle_io.feed import (
    LengthGroupedBatchSampler,
    PackingCollator,
    PaddingCollator,
    RankSampler,
    ShardDataset,
    permutation,
    shift_targets,
)


def test_permutation_is_a_fixed_function_of_seed_and_epoch():
    p = permutation(10, seed=0, epoch=0)
    assert sorted(p.tolist()) == list(range(10))
    # Pinned values: the order must not change with library versions (resume across upgrades).
    assert p.tolist() == [0, 3, 5, 7, 9, 6, 2, 8, 1, 4]
    assert permutation(10, 0, 1).tolist() != p.tolist() and permutation(10, 1, 0).tolist() != p.tolist()


@pytest.mark.parametrize("mode", [{"batch_size": 4}, {"max_tokens": 48}])
def test_ranks_are_disjoint_and_cover_every_item(mode):
    W = 3
    lengths = LENGTHS[:58]
    for epoch in (0, 1):
        per_rank = []
        for r in range(W):
            s = LengthGroupedBatchSampler(lengths, rank=r, world_size=W, seed=7, uneven="uneven", **mode)
            s.set_epoch(epoch)
            per_rank.append(flat(s))
        assert sorted(flat(per_rank)) == list(range(58)), "every item exactly once over the ranks"
        assert min(map(len, per_rank)) > 0
        assert all(set(per_rank[a]).isdisjoint(per_rank[b]) for a in range(W) for b in range(a + 1, W))
    again = LengthGroupedBatchSampler(lengths, rank=1, world_size=W, seed=7, uneven="uneven", **mode)
    again.set_epoch(1)
    assert flat(again) == per_rank[1], "deterministic"
    again.set_epoch(0)
    assert flat(again) != per_rank[1], "a new order each epoch"


def test_uneven_splits_pad_drop_or_stay_uneven():
    lengths = [5] * 10  # batch_size 3 -> 4 batches over 3 ranks
    runs = {}
    for uneven in ("pad", "drop", "uneven"):
        samplers = [
            LengthGroupedBatchSampler(lengths, batch_size=3, rank=r, world_size=3, uneven=uneven) for r in range(3)
        ]
        runs[uneven] = [s.batches() for s in samplers]
        stats = samplers[0].epoch_stats()
        if uneven == "pad":
            assert [len(b) for b in runs[uneven]] == [2, 2, 2]
            assert stats["repeated_batches"] == 2 and stats["dropped_items"] == 0
            counts = Counter(flat(flat(runs[uneven])))
            assert set(counts) == set(range(10)), "nothing dropped"
            assert sum(counts.values()) == 10 + stats["repeated_items"]
        elif uneven == "drop":
            assert [len(b) for b in runs[uneven]] == [1, 1, 1]
            assert stats["dropped_batches"] == 1 and stats["dropped_items"] == 10 - len(flat(flat(runs[uneven])))
        else:
            assert sorted(len(b) for b in runs[uneven]) == [1, 1, 2]
            assert sorted(flat(flat(runs[uneven]))) == list(range(10))


def test_length_grouping_cuts_padding_and_respects_the_token_budget():
    lengths = [(i * 7919) % 500 + 1 for i in range(2000)]

    def padded_tokens(sampler):
        return sum(len(b) * max(lengths[i] for i in b) for b in sampler)

    grouped = LengthGroupedBatchSampler(lengths, batch_size=8, seed=1)
    plain = LengthGroupedBatchSampler(lengths, batch_size=8, seed=1, group_by_length=False)
    assert sorted(flat(grouped)) == sorted(flat(plain)) == list(range(2000))
    assert padded_tokens(grouped) < 0.6 * padded_tokens(plain)
    budget = LengthGroupedBatchSampler(lengths, max_tokens=1024, seed=1)
    assert all(len(b) * max(lengths[i] for i in b) <= 1024 for b in budget)
    assert sorted(flat(budget)) == list(range(2000))
    with pytest.raises(eagle_io.InvalidArgumentError, match=r"item 1 has 30 tokens > max_tokens=20"):
        LengthGroupedBatchSampler([3, 30], max_tokens=20)
    with pytest.raises(eagle_io.InvalidArgumentError, match="exactly one"):
        LengthGroupedBatchSampler([3], batch_size=2, max_tokens=20)
    with pytest.raises(eagle_io.InvalidArgumentError, match="rank=3, world_size=3"):
        LengthGroupedBatchSampler([3], batch_size=2, rank=3, world_size=3)


def test_resume_yields_exactly_the_remaining_batches():
    s = LengthGroupedBatchSampler(LENGTHS, max_tokens=40, rank=1, world_size=2, seed=3)
    s.set_epoch(2)
    full = list(s)
    state = s.state_dict(step=5)
    fresh = LengthGroupedBatchSampler(LENGTHS, max_tokens=40, rank=1, world_size=2, seed=3)
    fresh.load_state_dict(state)
    assert (fresh.epoch, len(fresh)) == (2, len(full) - 5)
    assert list(fresh) == full[5:]
    other = LengthGroupedBatchSampler(LENGTHS, max_tokens=40, rank=1, world_size=4, seed=3)
    with pytest.raises(eagle_io.InvalidArgumentError, match="world_size=2 but this sampler has world_size=4"):
        other.load_state_dict(state)
    changed = LengthGroupedBatchSampler([*LENGTHS[:-1], 2], max_tokens=40, rank=1, world_size=2, seed=3)
    with pytest.raises(eagle_io.InvalidArgumentError, match="lengths_crc32"):
        changed.load_state_dict(state)


def test_rank_sampler_split_and_resume():
    n, W = 11, 3
    parts = [list(RankSampler(n, rank=r, world_size=W, seed=5)) for r in range(W)]
    assert [len(p) for p in parts] == [4, 4, 4]
    counts = Counter(flat(parts))
    assert set(counts) == set(range(n)) and sum(counts.values()) == 12  # one item repeated by "pad"
    assert RankSampler(n, rank=0, world_size=W, seed=5).epoch_stats()["repeated_items"] == 1
    uneven = [list(RankSampler(n, rank=r, world_size=W, seed=5, uneven="uneven")) for r in range(W)]
    assert sorted(flat(uneven)) == list(range(n)) and [len(p) for p in uneven] == [4, 4, 3]
    s = RankSampler(n, rank=2, world_size=W, seed=5)
    s.set_epoch(4)
    full = list(s)
    resumed = RankSampler(n, rank=2, world_size=W, seed=5)
    resumed.load_state_dict(s.state_dict(3))
    assert len(resumed) == len(full) - 3 and list(resumed) == full[3:]
    assert len(resumed) == len(full) and list(resumed) == full, "the next pass over the epoch runs whole"


def check_batch(batch, samples):
    for r, sid in enumerate(batch["sample_ids"]):
        s = samples[sid]
        n = s["input_ids"].shape[0]
        assert torch.equal(batch["input_ids"][r, :n], s["input_ids"])
        assert torch.equal(batch["loss_mask"][r, :n], s["loss_mask"].to(torch.int64))
        assert torch.equal(batch["aux_hidden_states"][r, :n], s["aux_hidden_states"])
        assert torch.equal(batch["hidden_states"][r, :n], s["hidden_states"])


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_two_epochs(feed_dataset, context):
    root, samples = feed_dataset
    ds = ShardDataset(root)
    ds[0]  # the parent has read (and used its decode pool) before the workers start
    sampler = LengthGroupedBatchSampler(ds.lengths(), batch_size=4, seed=0)
    loader = torch.utils.data.DataLoader(
        ds,
        batch_sampler=sampler,
        collate_fn=PaddingCollator(),
        num_workers=2,
        multiprocessing_context=context,
        persistent_workers=True,
        timeout=120,
    )
    orders = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        batches = list(loader)
        assert [b["sample_ids"] for b in batches] == [[1000 + i for i in b] for b in sampler.batches()]
        for b in batches:
            check_batch(b, samples)
        orders.append(flat(b["sample_ids"] for b in batches))
        assert sorted(orders[-1]) == sorted(samples)
    assert orders[0] != orders[1]


def test_pin_memory(feed_dataset):
    root, samples = feed_dataset
    ds = ShardDataset(root)
    loader = torch.utils.data.DataLoader(
        ds,
        batch_sampler=LengthGroupedBatchSampler(ds.lengths(), max_tokens=64),
        collate_fn=PackingCollator(64),
        num_workers=1,
        pin_memory=True,
        timeout=120,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = list(loader)
    assert sorted(flat(b["sample_ids"] for b in batches)) == sorted(samples)
    if torch.accelerator.is_available():
        assert all(b["hidden_states"].is_pinned() and b["cu_seqlens"].is_pinned() for b in batches)
    else:
        # CPU-only torch: the DataLoader turns pin_memory off with a warning; batches still arrive intact.
        assert any("pin_memory" in str(w.message) for w in caught)
    b = batches[0]
    cu = b["cu_seqlens"].tolist()
    for k, sid in enumerate(b["sample_ids"]):
        assert torch.equal(b["hidden_states"][0, cu[k] : cu[k + 1]], samples[sid]["hidden_states"])


def test_three_ranks_through_dataloaders_are_disjoint_and_complete(feed_dataset):
    root, samples = feed_dataset
    ds = ShardDataset(root)
    seen = []
    for r in range(3):
        sampler = LengthGroupedBatchSampler(ds.lengths(), batch_size=3, rank=r, world_size=3, seed=11, uneven="pad")
        sampler.set_epoch(1)
        loader = torch.utils.data.DataLoader(ds, batch_sampler=sampler, collate_fn=PaddingCollator())
        batches = list(loader)
        assert len(loader) == len(batches) == 5  # 40 items -> 14 batches of <= 3, 1 repeated -> 5 steps per rank
        seen.append(flat(b["sample_ids"] for b in batches))
    stats = sampler.epoch_stats()
    assert (stats["batches"], stats["repeated_batches"]) == (14, 1)
    counts = Counter(flat(seen))
    assert set(counts) == set(samples)
    assert sum(c - 1 for c in counts.values()) == stats["repeated_items"]


def test_resume_through_a_dataloader(feed_dataset):
    root, _ = feed_dataset
    ds = ShardDataset(root)

    def make():
        sampler = LengthGroupedBatchSampler(ds.lengths(), max_tokens=48, rank=0, world_size=2, seed=2)
        loader = torch.utils.data.DataLoader(
            ds, batch_sampler=sampler, collate_fn=PackingCollator(48), num_workers=2, multiprocessing_context="fork"
        )
        return sampler, loader

    sampler, loader = make()
    sampler.set_epoch(3)
    full, state = [], None
    for step, batch in enumerate(loader):
        full.append(batch)
        if step + 1 == 4:
            state = sampler.state_dict(step + 1)  # saved after 4 consumed steps (workers prefetch further)
    sampler2, loader2 = make()
    sampler2.load_state_dict(state)
    rest = list(loader2)
    assert len(rest) == len(full) - 4 > 0
    for a, b in zip(full[4:], rest, strict=True):
        assert a["sample_ids"] == b["sample_ids"]
        assert torch.equal(a["hidden_states"], b["hidden_states"])
        assert torch.equal(shift_targets(a)["loss_mask"], shift_targets(b)["loss_mask"])


def test_any_collate_fn_gets_ordinary_items(feed_dataset):
    root, samples = feed_dataset
    ds = ShardDataset(root)
    loader = torch.utils.data.DataLoader(
        ds, batch_sampler=[[3, 1], [0]], collate_fn=lambda items: [(it["sample_id"], it["input_ids"]) for it in items]
    )
    got = list(loader)
    assert [[sid for sid, _ in b] for b in got] == [[1003, 1001], [1000]]
    assert torch.equal(got[0][0][1], samples[1003]["input_ids"])
