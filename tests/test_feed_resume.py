"""Exactly-once epochs over ranks (``uneven="split"``) and mid-epoch resume of the samplers through torchdata's
StatefulDataLoader (in process and with worker processes), including a state saved at the end of an epoch."""

from __future__ import annotations

import io
import json
from collections import Counter

import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

import eagle_io
from conftest import FEED_LENGTHS as LENGTHS
from conftest import flat, write_samples
from eagle_io.feed import LengthGroupedBatchSampler, PaddingCollator, RankSampler, ShardDataset

H = 8


@pytest.fixture(scope="module")
def feed_dataset(tmp_path_factory):
    """37 samples (ids 500+i) in several shards; returns (root, {sample_id: sample})."""
    root = tmp_path_factory.mktemp("resume")
    return root, write_samples(root, 500, LENGTHS[:37], H)


@pytest.mark.parametrize(("n", "world", "mode"), [(37, 2, {"batch_size": 4}), (58, 3, {"max_tokens": 48}),
                                                  (10, 4, {"batch_size": 3}), (5, 5, {"batch_size": 8})])  # fmt: skip
def test_split_gives_every_item_once_and_the_same_steps_on_every_rank(n, world, mode):
    lengths = LENGTHS[:n]
    for epoch in (0, 1):
        samplers = [
            LengthGroupedBatchSampler(lengths, rank=r, world_size=world, seed=3, uneven="split", **mode)
            for r in range(world)
        ]
        per_rank = []
        for s in samplers:
            s.set_epoch(epoch)
            per_rank.append(list(s))
        assert sorted(flat(flat(per_rank))) == list(range(n)), "every item exactly once over the ranks"
        assert len({len(p) for p in per_rank}) == 1, "the same number of steps on every rank"
        assert all(len(b) > 0 for p in per_rank for b in p)
        stats = samplers[0].epoch_stats()
        base = LengthGroupedBatchSampler(lengths, world_size=world, seed=3, uneven="uneven", **mode)
        uncut = base.epoch_stats(epoch)["batches"]
        assert stats["split_batches"] == (-uncut) % world, "one cut per missing batch"
        assert stats["batches"] == uncut + stats["split_batches"] == world * len(per_rank[0])
        assert stats["repeated_items"] == stats["dropped_items"] == 0
        if "max_tokens" in mode:
            assert all(len(b) * max(lengths[i] for i in b) <= mode["max_tokens"] for b in flat(per_rank))


def test_split_names_too_few_items_and_is_refused_by_rank_sampler():
    s = LengthGroupedBatchSampler([4, 4, 4], batch_size=2, rank=0, world_size=4, uneven="split")
    with pytest.raises(eagle_io.InvalidArgumentError, match=r"same step count: the epoch has 3 batches of one item"):
        list(s)
    with pytest.raises(eagle_io.InvalidArgumentError, match="LengthGroupedBatchSampler"):
        RankSampler(10, world_size=2, uneven="split")


def test_state_dict_without_a_step_is_what_iteration_handed_out():
    s = LengthGroupedBatchSampler(LENGTHS, batch_size=4, rank=1, world_size=2, seed=9, uneven="split")
    s.set_epoch(2)
    full = s.batches()
    it = iter(s)
    got = [next(it) for _ in range(3)]
    state = s.state_dict()
    assert (state["epoch"], state["step"]) == (2, 3) and got == full[:3]
    json.dumps(state)  # plain values: any checkpoint format holds it
    resumed = LengthGroupedBatchSampler(LENGTHS, batch_size=4, rank=1, world_size=2, seed=9, uneven="split")
    resumed.load_state_dict(state)
    assert list(resumed) == full[3:]
    end = resumed.state_dict()
    assert (end["epoch"], end["step"]) == (2, len(full))
    same_epoch = LengthGroupedBatchSampler(LENGTHS, batch_size=4, rank=1, world_size=2, seed=9, uneven="split")
    same_epoch.set_epoch(2)
    same_epoch.load_state_dict(end)
    assert list(same_epoch) == [], "the loop is still in epoch 2: nothing of it is left"
    nxt = LengthGroupedBatchSampler(LENGTHS, batch_size=4, rank=1, world_size=2, seed=9, uneven="split")
    nxt.set_epoch(3)
    nxt.load_state_dict(end)
    assert list(nxt) == nxt.batches(3) != full, "the loop moved on to epoch 3: it starts at step 0"
    mid = s.state_dict()
    later = LengthGroupedBatchSampler(LENGTHS, batch_size=4, rank=1, world_size=2, seed=9, uneven="split")
    later.set_epoch(3)
    later.load_state_dict(mid)
    assert (later.epoch, list(later)) == (2, full[3:]), "a mid-epoch state wins over set_epoch"
    with pytest.raises(eagle_io.InvalidArgumentError, match="step must be >= 0"):
        s.state_dict(-1)


def _run(loader, n_steps=None):
    out = []
    for batch in loader:
        out.append(batch["sample_ids"])
        if n_steps is not None and len(out) == n_steps:
            return out, loader.state_dict()
    return out, loader.state_dict()


def _roundtrip(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", ["batch_sampler", "sampler"])
def test_stateful_dataloader_resumes_mid_epoch_exactly(feed_dataset, workers, kind):
    root, samples = feed_dataset
    ds = ShardDataset(root)

    def make():
        if kind == "batch_sampler":
            sampler = LengthGroupedBatchSampler(ds.lengths(), max_tokens=40, rank=0, world_size=2, seed=5,
                                                uneven="split")  # fmt: skip
            args = {"batch_sampler": sampler}
        else:
            sampler = RankSampler(ds, rank=1, world_size=2, seed=5, uneven="uneven")
            args = {"sampler": sampler, "batch_size": 3}
        extra = {"multiprocessing_context": "fork", "timeout": 120} if workers else {}
        loader = StatefulDataLoader(ds, collate_fn=PaddingCollator(), num_workers=workers, **args, **extra)
        return sampler, loader

    sampler, loader = make()
    sampler.set_epoch(4)
    full, _ = _run(loader)
    assert len(full) >= 6
    for k in (1, 4):
        sampler, loader = make()
        sampler.set_epoch(4)
        head, state = _run(loader, k)
        assert head == full[:k]
        if workers == 0 and kind == "batch_sampler":  # the sampler's own state, not torchdata's fast-forward
            assert (state["_index_sampler_state"]["epoch"], state["_index_sampler_state"]["step"]) == (4, k)
        elif workers == 0:
            assert state["_sampler_iter_state"]["sampler_state"]["step"] == 3 * k
        sampler2, loader2 = make()
        loader2.load_state_dict(_roundtrip(state))
        sampler2.set_epoch(4)  # what a training loop does before iterating: the loaded state wins
        tail, end_state = _run(loader2)
        assert head + tail == full, f"resumed after {k} steps: nothing repeated or lost, same order"
        # A state saved after the epoch ended resumes at the start of the next one the loop selects.
        sampler3, loader3 = make()
        loader3.load_state_dict(_roundtrip(end_state))
        sampler3.set_epoch(5)
        nxt, _ = _run(loader3)
        reference, ref_loader = make()
        reference.set_epoch(5)
        assert nxt == _run(ref_loader)[0] != full
    ids = flat(full)
    assert len(ids) == len(set(ids)) and set(ids) <= set(samples)


def test_two_ranks_resumed_at_different_steps_cover_the_dataset_once(feed_dataset):
    root, samples = feed_dataset
    ds = ShardDataset(root)
    seen = Counter()
    for rank, k in ((0, 2), (1, 5)):

        def make(rank=rank):
            s = LengthGroupedBatchSampler(ds.lengths(), batch_size=3, rank=rank, world_size=2, seed=1, uneven="split")
            return s, StatefulDataLoader(ds, batch_sampler=s, collate_fn=PaddingCollator())

        _, loader = make()
        head, state = _run(loader, k)
        _, loader2 = make()
        loader2.load_state_dict(state)
        tail, _ = _run(loader2)
        seen.update(flat(head + tail))
    assert set(seen) == set(samples) and set(seen.values()) == {1}
