"""eagle_io.feed.ShardDataset: items, several datasets, truncation, filters, incompatibility, no payload scan."""

from __future__ import annotations

import json
import pickle

import pytest
import torch
from helpers.shard_bytes import layout

import eagle_io
from conftest import make_sample
from eagle_io.feed import ShardDataset

H = 16
META = {
    "target_model": {"model_id": "tiny"},
    "num_layers": 8,
    "hidden_size": H,
    "vocab_size": 49152,
    "aux_layer_ids": [2, 4, 5],
    "aux_layer_convention": eagle_io.store.eagle3.AUX_LAYER_CONVENTION,
    "hidden_states_post_norm": True,
    "dtype": "bfloat16",
    "tokenizer": {"name": "tiny-tok"},
    "max_length": 64,
}


def write(root, ids_lengths, meta=META, hidden=H, dtype="bfloat16", **kw):
    """Writes samples ``{sid: make_sample(sid, L, hidden)}`` to ``root``; returns them."""
    samples = {sid: make_sample(sid, n, hidden=hidden) for sid, n in ids_lengths}
    if dtype != "bfloat16":
        for s in samples.values():
            s["aux_hidden_states"] = s["aux_hidden_states"].to(getattr(torch, dtype))
            s["hidden_states"] = s["hidden_states"].to(getattr(torch, dtype))
    with eagle_io.ShardWriter(
        root, eagle_io.eagle3_schema(hidden, dtype=dtype), meta, shard_bytes=6_000, threads=1, **kw
    ) as w:
        for sid, s in samples.items():
            w.write(sid, s, key=f"k{sid}")
    return samples


def assert_item(item, sample, n=None):
    n = sample["input_ids"].shape[0] if n is None else n
    assert item["input_ids"].dtype == torch.int64 and torch.equal(item["input_ids"], sample["input_ids"][:n])
    assert item["loss_mask"].dtype == torch.int64
    assert torch.equal(item["loss_mask"], sample["loss_mask"][:n].to(torch.int64))
    for name in ("aux_hidden_states", "hidden_states"):
        assert item[name].dtype == sample[name].dtype
        assert torch.equal(item[name], sample[name][:n])


def test_single_dataset_items_equal_the_written_samples(tmp_path):
    samples = write(tmp_path / "a", [(i * 7 + 3, [0, 1, 9, 30][i % 4]) for i in range(10)])
    ds = ShardDataset(tmp_path / "a")
    assert len(ds) == 10 and len(ds.datasets[0].manifest["shards"]) > 1
    assert ds.lengths() == [s["input_ids"].shape[0] for s in samples.values()]
    for i, (sid, sample) in enumerate(samples.items()):
        item = ds[i]
        assert item["sample_id"] == sid and item["dataset_index"] == 0
        assert item["aux_hidden_states"].shape == (sample["input_ids"].shape[0], 3 * H)
        assert_item(item, sample)
    assert ds[-1]["sample_id"] == list(samples)[-1]
    with pytest.raises(IndexError, match="item 10 out of range"):
        ds[10]
    assert ds.metadata["aux_layer_ids"] == [2, 4, 5]


def test_several_datasets_and_per_rank_manifests(tmp_path):
    a = write(tmp_path / "a", [(1, 5), (2, 6)])
    b0 = write(tmp_path / "b", [(10, 3), (11, 4)], rank=0, world_size=2)
    b1 = write(tmp_path / "b", [(20, 8)], rank=1, world_size=2)
    ds = ShardDataset([tmp_path / "a", tmp_path / "b"])
    assert [p.rsplit("/", 1)[-1] for p in ds.paths] == ["a", "manifest.r00000.json", "manifest.r00001.json"]
    expected = [(1, 0), (2, 0), (10, 1), (11, 1), (20, 2)]
    assert [(ds[i]["sample_id"], ds[i]["dataset_index"]) for i in range(len(ds))] == expected
    assert ds.lengths() == [5, 6, 3, 4, 8]
    everything = {**a, **b0, **b1}
    for i in range(len(ds)):
        assert_item(ds[i], everything[ds[i]["sample_id"]])
    assert ds.locate(3) == (1, 1)


def test_max_length_truncates_every_tensor_alike(tmp_path):
    samples = write(tmp_path / "a", [(1, 3), (2, 12), (3, 8)])
    ds = ShardDataset(tmp_path / "a", max_length=8)
    assert ds.lengths() == [3, 8, 8]
    for i, sample in enumerate(samples.values()):
        item = ds[i]
        n = min(8, sample["input_ids"].shape[0])
        assert {k: v.shape[0] for k, v in item.items() if torch.is_tensor(v)} == {
            "input_ids": n,
            "loss_mask": n,
            "aux_hidden_states": n,
            "hidden_states": n,
        }
        assert_item(item, sample, n)
    assert ds.entry(1).n_tokens == 12  # the stored length
    with pytest.raises(eagle_io.InvalidArgumentError, match="max_length"):
        ShardDataset(tmp_path / "a", max_length=0)


def test_filters_over_sample_info_and_metadata(tmp_path):
    write(tmp_path / "a", [(1, 2), (2, 9), (3, 10)], meta={**META, "source": "sharegpt"})
    write(tmp_path / "b", [(4, 11), (5, 1)], meta={**META, "source": "ultrachat"})
    paths = [tmp_path / "a", tmp_path / "b"]
    long_only = ShardDataset(paths, filter=lambda info, meta: info.n_tokens >= 9)
    assert [long_only[i]["sample_id"] for i in range(len(long_only))] == [2, 3, 4]
    assert long_only.lengths() == [9, 10, 11]
    by_key = ShardDataset(paths, filter=lambda info, meta: info.key in ("k3", "k5"))
    assert [by_key.entry(i).sample_id for i in range(len(by_key))] == [3, 5]
    by_meta = ShardDataset(paths, filter=lambda info, meta: meta["source"] == "ultrachat")
    assert [by_meta[i]["sample_id"] for i in range(len(by_meta))] == [4, 5]
    assert [by_meta[i]["dataset_index"] for i in range(len(by_meta))] == [1, 1]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("target_model", {"model_id": "other"}),
        ("aux_layer_ids", [1, 4, 5]),
        ("aux_layer_convention", "output of decoder layer i"),
        ("hidden_states_post_norm", False),
        ("tokenizer", None),
    ],
)
def test_mixing_datasets_whose_metadata_differ_fails(tmp_path, key, value):
    write(tmp_path / "a", [(1, 3)])
    write(tmp_path / "b", [(2, 3)], meta={**META, key: value})
    with pytest.raises(eagle_io.IncompatibleDatasetError) as e:
        ShardDataset([tmp_path / "a", tmp_path / "b"])
    msg = str(e.value)
    assert f"metadata {key!r} differs" in msg and repr(META[key]) in msg and repr(value) in msg
    assert str(tmp_path / "a") in msg and str(tmp_path / "b") in msg


def test_mixing_hidden_sizes_or_dtypes_fails(tmp_path):
    write(tmp_path / "a", [(1, 3)])
    write(tmp_path / "h", [(2, 3)], meta={**META, "hidden_size": 8}, hidden=8)
    write(tmp_path / "d", [(3, 3)], meta={**META, "dtype": "float16"}, dtype="float16")
    with pytest.raises(eagle_io.IncompatibleDatasetError, match=r"metadata 'hidden_size' differs: .* has 16, .* has 8"):
        ShardDataset([tmp_path / "a", tmp_path / "h"])
    with pytest.raises(eagle_io.IncompatibleDatasetError, match=r"'dtype' differs: .*'bfloat16'.*'float16'"):
        ShardDataset([tmp_path / "a", tmp_path / "d"])
    # Without metadata to compare, the schemas still are: the tensor and both widths are named.
    write(tmp_path / "x", [(4, 3)], meta={})
    write(tmp_path / "y", [(5, 3)], meta={}, hidden=8)
    with pytest.raises(eagle_io.IncompatibleDatasetError, match=r"'aux_hidden_states' differs: .*width 48.*width 24"):
        ShardDataset([tmp_path / "x", tmp_path / "y"])


def test_metadata_contradicting_the_schema_widths_fails(tmp_path):
    write(tmp_path / "a", [(1, 3)], meta={**META, "aux_layer_ids": [2, 4]})
    with pytest.raises(eagle_io.IncompatibleDatasetError, match=r"aux_layer_ids=.*= 32 but .* width is 48"):
        ShardDataset(tmp_path / "a")


def test_duplicate_sample_ids_across_datasets_fail(tmp_path):
    write(tmp_path / "a", [(1, 3), (7, 2)])
    write(tmp_path / "b", [(2, 3), (7, 4)])
    with pytest.raises(eagle_io.IncompatibleDatasetError, match=r"sample id 7 is in .*a.* \(position 1\) and in .*b"):
        ShardDataset([tmp_path / "a", tmp_path / "b"])
    # Filtering one copy out leaves ids unique.
    ds = ShardDataset([tmp_path / "a", tmp_path / "b"], filter=lambda info, meta: info.n_tokens != 4)
    assert len(ds) == 3
    with pytest.raises(eagle_io.InvalidArgumentError, match="listed twice"):
        ShardDataset([tmp_path / "a", tmp_path / "a" / "manifest.json"])


def test_opening_reads_no_payload(tmp_path):
    """A record whose payload is corrupt is found when read, not at construction (no start-up scan)."""
    samples = write(tmp_path / "a", [(1, 20), (2, 20)])
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    shard = tmp_path / "a" / manifest["shards"][0]["file"]
    lay = layout(shard)
    data = bytearray(lay["data"])
    data[lay["data_start"] + 200] ^= 0xFF  # inside record 0's chunk payloads, not its index entry
    shard.write_bytes(bytes(data))
    ds = ShardDataset(tmp_path / "a")
    assert ds.lengths() == [20, 20]
    with pytest.raises(eagle_io.CorruptRecordError):
        ds[0]
    assert_item(ds[1], samples[2])


def test_pickles_without_its_filter(tmp_path):
    samples = write(tmp_path / "a", [(1, 3), (2, 5), (3, 7)])
    ds = ShardDataset(tmp_path / "a", max_length=4, filter=lambda info, meta: info.sample_id != 2)
    clone = pickle.loads(pickle.dumps(ds))
    assert len(clone) == 2 and clone.lengths() == [3, 4]
    assert_item(clone[1], samples[3], 4)


def test_missing_required_tensor_fails(tmp_path):
    schema = [eagle_io.TensorSpec("input_ids", "int64"), eagle_io.TensorSpec("loss_mask", "uint8")]
    with eagle_io.ShardWriter(tmp_path / "a", schema, {}, threads=1) as w:
        w.write(1, {"input_ids": torch.zeros(2, dtype=torch.int64), "loss_mask": torch.zeros(2, dtype=torch.uint8)})
    with pytest.raises(eagle_io.IncompatibleDatasetError, match="no tensor 'aux_hidden_states'"):
        ShardDataset(tmp_path / "a")


def test_on_off_options_refuse_words_and_other_truthy_objects(tmp_path):
    """`ShardDataset(..., mix_precisions="no")` mixed precisions (any string is truthy); `follow="no"` returned a
    following dataset, `Dataset(dequantize="no")` dequantised."""
    from eagle_io.errors import ArgumentTypeError
    from eagle_io.feed.follow import FollowingShardDataset

    write(tmp_path / "a", [(1, 3)])
    for kwargs, name in (
        ({"mix_precisions": "no"}, "mix_precisions"),
        ({"mix_precisions": 0}, "mix_precisions"),
        ({"follow": "no"}, "follow"),
        ({"follow": True, "mix_precisions": "false"}, "mix_precisions"),
    ):
        with pytest.raises(ArgumentTypeError, match=f"^{name} must be True or False, not "):
            ShardDataset(tmp_path / "a", **kwargs)
    with pytest.raises(ArgumentTypeError, match=r"^dequantize must be True or False, not 'no'$"):
        eagle_io.Dataset(tmp_path / "a", dequantize="no")
    assert len(ShardDataset(tmp_path / "a", mix_precisions=False, follow=False)) == 1
    assert isinstance(ShardDataset(tmp_path / "a", follow=True), FollowingShardDataset)
