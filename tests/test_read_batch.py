"""Batch decode (issue 10, item 2): ``Dataset.read_batch`` / ``ShardDataset.read_many`` decode every row of a batch
in one GIL-free call, bit-identical to one ``read_into`` per sample; a bad record names itself and leaves the
other rows decoded; outputs that overlap are refused before anything is written."""

from __future__ import annotations

import pytest
import torch
from helpers.checks import damage_record

import eagle_io
from conftest import make_sample
from eagle_io.feed import ShardDataset

H = 16


@pytest.fixture
def dataset(tmp_path):
    root = tmp_path / "ds"
    samples = {500 + i: make_sample(500 + i, 2 + 3 * i, hidden=H) for i in range(9)}
    with eagle_io.ShardWriter(root, eagle_io.eagle3_schema(H), {"hidden_size": H}, shard_bytes=2000, threads=1) as w:
        for sid, s in samples.items():
            w.write(sid, s)
    return root, samples


def rows_for(ds: eagle_io.Dataset, positions: list[int]) -> list[tuple[int, dict]]:
    """Outputs for ``positions`` that are rows of one padded batch per tensor (disjoint views)."""
    lens = [ds.entry(p).n_tokens for p in positions]
    T = max(lens)
    big = {
        s.name: torch.full((len(positions), T, *((s.width,) if s.width else ())), 7, dtype=getattr(torch, s.dtype))
        for s in ds.schema
    }
    return [(p, {k: v[r, :n] for k, v in big.items()}) for r, (p, n) in enumerate(zip(positions, lens, strict=True))]


def test_read_batch_equals_read_into_per_sample(dataset):
    root, samples = dataset
    ds = eagle_io.Dataset(root, threads=2)
    items = rows_for(ds, [8, 0, 3, 5, 1])
    ds.read_batch(items)
    for pos, out in items:
        want = samples[ds.entry(pos).sample_id]
        for name in ("input_ids", "loss_mask", "aux_hidden_states", "hidden_states"):
            assert torch.equal(out[name], want[name].to(out[name].dtype)), (pos, name)


def test_a_bad_record_names_itself_and_the_others_still_decode(dataset):
    root, samples = dataset
    path, off, length = damage_record(root, 503)
    ds = eagle_io.Dataset(root, threads=2)
    positions = [ds.position(sid) for sid in (501, 503, 506)]
    items = rows_for(ds, positions)
    with pytest.raises(eagle_io.CorruptRecordError) as e:
        ds.read_batch(items)
    assert (e.value.sample_id, e.value.path) == (503, path) and off <= e.value.offset < off + length
    for pos, out in (items[0], items[2]):
        assert torch.equal(out["aux_hidden_states"], samples[ds.entry(pos).sample_id]["aux_hidden_states"])
    sds = ShardDataset(root)
    with pytest.raises(eagle_io.CorruptRecordError) as e:
        sds.read_many([(i, {}) for i in range(len(sds))])
    assert e.value.item == [sds.entry(i).sample_id for i in range(len(sds))].index(503)


def test_overlapping_outputs_are_refused(dataset):
    root, _ = dataset
    ds = eagle_io.Dataset(root)
    (p0, a), (p1, b) = rows_for(ds, [1, 0])  # 5 and 2 tokens: b can be a slice of a
    b = dict(b, hidden_states=a["hidden_states"][: b["hidden_states"].shape[0]])
    before = a["hidden_states"].clone()
    with pytest.raises(eagle_io.InvalidArgumentError, match="overlap"):
        ds.read_batch([(p0, a), (p1, b)])
    assert torch.equal(a["hidden_states"], before)
