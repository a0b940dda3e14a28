"""Collators' shapes and values, and the EAGLE-3 shift contract (shift_targets) on padded and packed batches."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import eagle_io
from conftest import make_sample
from eagle_io.feed import PackingCollator, PaddingCollator, ShardDataset, shift_targets

H = 8


def item(sid: int, n: int, first_mask: int | None = None) -> dict:
    """An item as ShardDataset gives it (loss_mask int64), seeded by ``sid``; optionally forces loss_mask[0]."""
    s = make_sample(sid, n, hidden=H)
    s["loss_mask"] = s["loss_mask"].to(torch.int64)
    if first_mask is not None and n:
        s["loss_mask"][0] = first_mask
    return {**s, "sample_id": sid, "dataset_index": 0}


def specforge_reference(it: dict) -> dict:
    """SpecForge's offline shift, restated: ``OfflineEagle3Dataset.process_data`` (specforge/data/preprocessing.py)
    sets ``loss_mask[0, -1] = 0`` and applies ``specforge.utils.padding(x, left=False)`` =
    ``cat((x[:, 1:], zeros_like(x[:, -1:])), 1)`` to ``hidden_state`` (-> ``target``) and ``input_ids``."""
    lm = it["loss_mask"][None].clone()
    lm[0, -1] = 0

    def padding(x):
        return torch.cat((x[:, 1:], torch.zeros_like(x[:, -1:])), dim=1)

    return {
        "loss_mask": lm[0],
        "target": padding(it["hidden_states"][None])[0],
        "input_ids": padding(it["input_ids"][None])[0],
    }


def test_padding_collator_shapes_and_values():
    items = [item(1, 5), item(2, 2), item(3, 7)]
    b = PaddingCollator(pad_to_multiple_of=4, pad_token_id=-1)(items)
    assert b["input_ids"].shape == (3, 8) and b["input_ids"].dtype == torch.int64
    assert b["aux_hidden_states"].shape == (3, 8, 3 * H) and b["aux_hidden_states"].dtype == torch.bfloat16
    assert b["hidden_states"].shape == (3, 8, H)
    for name in ("attention_mask", "loss_mask", "position_ids"):
        assert b[name].shape == (3, 8) and b[name].dtype == torch.int64
    assert b["lengths"].tolist() == [5, 2, 7]
    assert b["sample_ids"] == [1, 2, 3] and b["dataset_index"] == [0, 0, 0]
    assert b["attention_mask"].tolist()[1] == [1, 1, 0, 0, 0, 0, 0, 0]
    assert b["position_ids"].tolist()[0] == list(range(8))
    for r, it in enumerate(items):
        n = it["input_ids"].shape[0]
        assert torch.equal(b["input_ids"][r, :n], it["input_ids"])
        assert (b["input_ids"][r, n:] == -1).all()
        assert torch.equal(b["loss_mask"][r, :n], it["loss_mask"])
        assert (b["loss_mask"][r, n:] == 0).all()
        for name in ("aux_hidden_states", "hidden_states"):
            assert torch.equal(b[name][r, :n], it[name])
            assert (b[name][r, n:] == 0).all()


def test_packing_collator_shapes_and_values():
    items = [item(1, 5), item(2, 0), item(3, 3), item(4, 1)]
    b = PackingCollator(12)(items)
    assert b["input_ids"].shape == (1, 12) and b["hidden_states"].shape == (1, 12, H)
    assert b["aux_hidden_states"].shape == (1, 12, 3 * H)
    assert b["cu_seqlens"].dtype == torch.int32 and b["cu_seqlens"].tolist() == [0, 5, 5, 8, 9]
    assert b["max_seqlen"] == 5
    assert b["position_ids"].tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 0, 0, 0, 0]]
    assert b["attention_mask"].tolist() == [[1] * 9 + [0] * 3]
    assert b["sample_ids"] == [1, 2, 3, 4]
    cu = b["cu_seqlens"].tolist()
    for k, it in enumerate(items):
        s, e = cu[k], cu[k + 1]
        for name in ("input_ids", "loss_mask", "aux_hidden_states", "hidden_states"):
            assert torch.equal(b[name][0, s:e], it[name])
    assert (b["loss_mask"][0, 9:] == 0).all() and (b["hidden_states"][0, 9:] == 0).all()
    tight = PackingCollator(12, pad_to_max_tokens=False)(items)
    assert tight["input_ids"].shape == (1, 9)
    with pytest.raises(eagle_io.InvalidArgumentError, match=r"hold 9 tokens > max_tokens=8"):
        PackingCollator(8)(items)


def test_collators_reject_inconsistent_items():
    a, b = item(1, 3), item(2, 3)
    b["hidden_states"] = b["hidden_states"][:, :4]
    with pytest.raises(eagle_io.InvalidArgumentError, match=r"sample 2: hidden_states is torch.bfloat16 \[4\]"):
        PaddingCollator()([a, b])
    c = item(3, 3)
    c["loss_mask"] = c["loss_mask"][:2]
    with pytest.raises(eagle_io.InvalidArgumentError, match="sample 3: loss_mask has 2 rows but input_ids has 3"):
        PackingCollator(16)([c])
    with pytest.raises(eagle_io.InvalidArgumentError, match="empty"):
        PaddingCollator()([])


def test_shift_contract_on_a_padded_batch():
    items = [item(1, 6), item(2, 3), item(3, 1)]
    items[0]["loss_mask"][:] = torch.tensor([0, 1, 1, 0, 1, 1])
    out = shift_targets(PaddingCollator()(items))
    # Sample 0, by hand: mask moves with the target (t predicts t+1); the last position has no target.
    assert out["loss_mask"][0].tolist() == [1, 1, 0, 1, 1, 0]
    assert out["token_loss_mask"][0].tolist() == [0, 1, 1, 0, 1, 1]
    assert out["has_target"].tolist() == [[True] * 5 + [False], [True, True] + [False] * 4, [False] * 6]
    for r, it in enumerate(items):
        n = it["input_ids"].shape[0]
        assert torch.equal(out["target_hidden_states"][r, : n - 1], it["hidden_states"][1:])
        assert torch.equal(out["next_input_ids"][r, : n - 1], it["input_ids"][1:])
        assert torch.equal(out["loss_mask"][r, : n - 1], it["loss_mask"][1:])
        assert out["loss_mask"][r, n - 1 :].eq(0).all() and out["target_hidden_states"][r, n - 1 :].eq(0).all()
        assert out["next_input_ids"][r, n - 1 :].eq(0).all()
        # The draft's inputs stay in place.
        assert torch.equal(out["aux_hidden_states"][r, :n], it["aux_hidden_states"])


def test_shift_contract_on_a_packed_batch_never_crosses_samples():
    # Every sample starts with a trained token, so a shift across a boundary would put a 1 on a last position.
    items = [item(1, 4, first_mask=1), item(2, 1, first_mask=1), item(3, 5, first_mask=1), item(4, 3, first_mask=1)]
    batch = PackingCollator(16)(items)
    out = shift_targets(batch)
    cu = batch["cu_seqlens"].tolist()
    last = [e - 1 for e in cu[1:]]
    assert out["has_target"][0].nonzero().flatten().tolist() == [t for t in range(cu[-1]) if t not in last]
    for t in [*last, *range(cu[-1], 16)]:
        assert out["loss_mask"][0, t] == 0 and out["next_input_ids"][0, t] == 0
        assert out["target_hidden_states"][0, t].eq(0).all()
    # Per sample, the packed shift equals the padded one.
    padded = shift_targets(PaddingCollator()(items))
    for k, it in enumerate(items):
        n = it["input_ids"].shape[0]
        for name in ("loss_mask", "next_input_ids", "target_hidden_states", "has_target"):
            assert torch.equal(out[name][0, cu[k] : cu[k + 1]], padded[name][k, :n]), name


def test_specforge_alignment_matches_its_process_data():
    items = [item(1, 7), item(2, 4), item(3, 1)]
    for batch in (PaddingCollator()(items), PackingCollator(16)(items)):
        out = shift_targets(batch, loss_mask="specforge")
        cu = [0, *torch.cumsum(batch["lengths"], 0).tolist()]
        for k, it in enumerate(items):
            ref = specforge_reference(it)
            n = it["input_ids"].shape[0]
            row, s = (k, 0) if batch["input_ids"].shape[0] == len(items) else (0, cu[k])
            assert torch.equal(out["loss_mask"][row, s : s + n], ref["loss_mask"])
            assert torch.equal(out["target_hidden_states"][row, s : s + n], ref["target"])
            assert torch.equal(out["next_input_ids"][row, s : s + n], ref["input_ids"])
    with pytest.raises(eagle_io.InvalidArgumentError, match="loss_mask must be one of"):
        shift_targets(PaddingCollator()(items), loss_mask="shifted")


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 9), min_size=1, max_size=6),
    masks=st.lists(st.integers(0, 1), min_size=60, max_size=60),
    alignment=st.sampled_from(["target", "specforge"]),
)
def test_shift_invariants(lengths, masks, alignment):
    items, used = [], 0
    for k, n in enumerate(lengths):
        it = item(100 + k, n)
        it["loss_mask"] = torch.tensor(masks[used : used + n], dtype=torch.int64)
        used += n
        items.append(it)
    total = sum(lengths)
    for batch in (PaddingCollator()(items), PackingCollator(max(total, 1) + 2)(items)):
        out = shift_targets(batch, loss_mask=alignment)
        assert not (out["loss_mask"].bool() & ~out["has_target"]).any()
        assert int(out["has_target"].sum()) == sum(max(n - 1, 0) for n in lengths)
        assert out["target_hidden_states"][~out["has_target"]].eq(0).all()
        src = batch["loss_mask"][:, 1:] if alignment == "target" else batch["loss_mask"][:, :-1]
        assert torch.equal(out["loss_mask"][:, :-1], src * out["has_target"][:, :-1])


def test_shift_of_batches_read_from_shards(tmp_path):
    samples = {sid: make_sample(sid, n, hidden=H) for sid, n in [(5, 6), (6, 2), (7, 9)]}
    with eagle_io.ShardWriter(tmp_path, eagle_io.eagle3_schema(H), {}, threads=1) as w:
        for sid, s in samples.items():
            w.write(sid, s)
    ds = ShardDataset(tmp_path, max_length=8)
    out = shift_targets(PackingCollator(32)([ds[i] for i in range(len(ds))]))
    cu = out["cu_seqlens"].tolist()
    for k, s in enumerate(samples.values()):
        n = min(8, s["input_ids"].shape[0])
        got = out["target_hidden_states"][0, cu[k] : cu[k + 1]]
        assert torch.equal(got[: n - 1], s["hidden_states"][1:n]) and got[n - 1].eq(0).all()
        assert out["loss_mask"][0, cu[k] : cu[k + 1]].tolist() == [*s["loss_mask"][1:n].tolist(), 0]


@pytest.mark.parametrize("collator", [PaddingCollator(pad_to_multiple_of=8), PackingCollator(64)], ids=["pad", "pack"])
def test_decoding_straight_into_the_batch_equals_collating_items(tmp_path, collator):
    samples = {sid: make_sample(sid, n, hidden=H) for sid, n in [(5, 6), (6, 0), (7, 19), (8, 1), (9, 12)]}
    with eagle_io.ShardWriter(tmp_path, eagle_io.eagle3_schema(H), {}, shard_bytes=3_000, threads=1) as w:
        for sid, s in samples.items():
            w.write(sid, s)
    ds = ShardDataset(tmp_path, max_length=12)  # item 2 is truncated: decoded through a temporary
    indices = [4, 2, 0, 1, 3]
    lazy = ds.__getitems__(indices)
    direct = collator(lazy)
    assert lazy._items == {}, "the collator decoded into the batch without building items"
    via_items = collator([ds[i] for i in indices])
    assert direct.keys() == via_items.keys()
    for k, v in via_items.items():
        assert torch.equal(direct[k], v) if torch.is_tensor(v) else direct[k] == v, k
    assert direct["sample_ids"] == [9, 7, 5, 6, 8]
    # Any other collate_fn gets ordinary items from the same lazy sequence.
    assert [it["sample_id"] for it in lazy] == [9, 7, 5, 6, 8] and lazy[-1]["input_ids"].shape == (1,)
    with pytest.raises(eagle_io.InvalidArgumentError, match=r"'hidden_states' has shape \[3, 8\], expected \[12, 8\]"):
        ds.read_into(2, {"hidden_states": torch.empty(3, H, dtype=torch.bfloat16)})
