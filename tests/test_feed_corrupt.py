"""The training feed's corrupt-record policy (issue 6, item 2): a batch raises on a bad record by default; with
``on_corrupt="skip"`` it leaves the record out, never substitutes another sample, and counts every skip with its
sample id, shard and offset, in the process and in the batch (so DataLoader workers' skips reach the loop)."""

from __future__ import annotations

import pickle

import pytest
import torch
from helpers.checks import damage_record

import eagle_io
from conftest import make_sample
from eagle_io.feed import LengthGroupedBatchSampler, PackingCollator, PaddingCollator, ShardDataset

H = 8
BAD = (1003, 1007)


@pytest.fixture
def damaged(tmp_path):
    """12 samples over several shards; records 1003 and 1007 damaged. -> (root, samples, {sid: (path, off, len)})."""
    root = tmp_path / "ds"
    samples = {1000 + i: make_sample(1000 + i, 3 + i, hidden=H) for i in range(12)}
    with eagle_io.ShardWriter(root, eagle_io.eagle3_schema(H), {"hidden_size": H}, shard_bytes=1500, threads=1) as w:
        for sid, s in samples.items():
            w.write(sid, s)
    assert len(eagle_io.Dataset(root).manifest["shards"]) > 1
    return root, samples, {sid: damage_record(root, sid) for sid in BAD}


def check_rows(batch, samples, packed: bool) -> None:
    """Every sample in the batch is the one its id says, bit for bit, in its own rows."""
    starts = batch["cu_seqlens"].tolist() if packed else None
    for r, sid in enumerate(batch["sample_ids"]):
        s, n = samples[sid], samples[sid]["input_ids"].shape[0]
        row, a = (0, starts[r]) if packed else (r, 0)
        assert int(batch["lengths"][r]) == n
        for name in ("input_ids", "aux_hidden_states", "hidden_states"):
            assert torch.equal(batch[name][row, a : a + n], s[name]), (sid, name)
        assert torch.equal(batch["loss_mask"][row, a : a + n], s["loss_mask"].to(torch.int64))


def check_skipped(skipped: list[dict], where: dict) -> None:
    assert sorted(s["sample_id"] for s in skipped) == sorted(where)
    for s in skipped:
        path, off, length = where[s["sample_id"]]
        assert s["path"] == path and off <= s["offset"] < off + length, s
        assert f"sample id {s['sample_id']}" in s["error"] and path in s["error"]


def test_a_batch_raises_on_a_bad_record_by_default(damaged):
    root, _, where = damaged
    ds = ShardDataset(root)
    items = [ds.entry(i).sample_id for i in range(len(ds))]
    with pytest.raises(eagle_io.CorruptRecordError) as e:
        PaddingCollator()(ds.__getitems__([0, items.index(1003), 5]))
    path, off, length = where[1003]
    assert (e.value.path, e.value.sample_id) == (path, 1003) and off <= e.value.offset < off + length
    assert ds.skipped == []


@pytest.mark.parametrize("collator", ["padding", "packing"])
def test_skip_leaves_bad_records_out_and_counts_them_across_dataloader_workers(damaged, collator):
    root, samples, where = damaged
    ds = ShardDataset(root, on_corrupt="skip")
    packed = collator == "packing"
    collate = PackingCollator(256) if packed else PaddingCollator(pad_to_multiple_of=8)
    sampler = LengthGroupedBatchSampler(ds.lengths(), batch_size=4, seed=1)
    loader = torch.utils.data.DataLoader(
        ds, batch_sampler=sampler, collate_fn=collate, num_workers=2, multiprocessing_context="fork", timeout=120
    )
    planned = [[ds.entry(i).sample_id for i in b] for b in sampler.batches()]
    batches = list(loader)
    assert len(batches) == len(planned)
    for plan, batch in zip(planned, batches, strict=True):
        assert batch["sample_ids"] == [sid for sid in plan if sid not in BAD], "never another sample"
        assert sorted(s["sample_id"] for s in batch["skipped"]) == sorted(set(plan) & set(BAD))
        check_rows(batch, samples, packed)
    check_skipped([s for b in batches for s in b["skipped"]], where)
    assert ds.skipped == [], "the workers skipped, not the parent: their counts came back in the batches"


def test_skip_counts_in_process_and_a_batch_of_only_bad_records_is_empty(damaged):
    root, samples, where = damaged
    ds = ShardDataset(root, on_corrupt="skip")
    pos = {ds.entry(i).sample_id: i for i in range(len(ds))}
    for collate, shape in ((PaddingCollator(), (0, 0)), (PackingCollator(64), (1, 64))):
        batch = collate(ds.__getitems__([pos[1003], pos[1007]]))
        assert batch["sample_ids"] == [] and batch["lengths"].tolist() == []
        assert tuple(batch["input_ids"].shape) == shape
        check_skipped(batch["skipped"], where)
    batch = PaddingCollator()(ds.__getitems__([pos[1002], pos[1003], pos[1004]]))
    assert batch["sample_ids"] == [1002, 1004] and batch["input_ids"].shape == (2, 7)
    check_rows(batch, samples, packed=False)
    assert [s.sample_id for s in ds.skipped] == [1003, 1007, 1003, 1007, 1003]
    assert all(s.dataset_index == 0 and s.item == pos[s.sample_id] for s in ds.skipped)


def test_a_single_item_always_raises_and_the_policy_is_checked_and_pickled(damaged):
    root, _, _ = damaged
    ds = ShardDataset(root, on_corrupt="skip")
    pos = {ds.entry(i).sample_id: i for i in range(len(ds))}
    with pytest.raises(eagle_io.CorruptRecordError):
        ds[pos[1007]]  # one item cannot be skipped without substituting another
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.on_corrupt == "skip" and clone.skipped == []
    with pytest.raises(eagle_io.InvalidArgumentError, match="on_corrupt"):
        ShardDataset(root, on_corrupt="ignore")
