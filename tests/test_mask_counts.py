"""eagle_io.store.masks (loss masks read alone) and what `eagle-io inspect` shows from it: length percentiles and
the supervised-token share, checked against whole-record reads."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import eagle_io
from conftest import make_sample
from eagle_io.cli import main
from eagle_io.store.masks import mask_counts


def write(root, samples, **options):
    with eagle_io.ShardWriter(root, eagle_io.eagle3_schema(32), {"target_model": "tiny"}, threads=1, **options) as w:
        for sid, s in samples.items():
            w.write(sid, s)
    return root


def by_reading(root):
    ds = eagle_io.Dataset(root)
    items = [ds[p] for p in range(len(ds))]
    return (
        [int(i["sample_id"]) for i in items],
        [len(i["input_ids"]) for i in items],
        [int(i["loss_mask"].sum()) for i in items],
    )


def test_counts_equal_whole_record_reads_with_many_chunks(tmp_path):
    # 64-byte chunks: 1 state row per chunk, so a 300-token record's chunk tables (~14 KB) overrun the first read.
    lengths = [300, 0, 1, 17, 64, 5]
    samples = {10 + i: make_sample(10 + i, n) for i, n in enumerate(lengths)}
    samples[13]["loss_mask"][:] = 0
    root = write(tmp_path / "ds", samples, chunk_bytes=64, shard_bytes=20_000)
    assert len(json.loads((root / "manifest.json").read_text())["shards"]) > 1
    calls = []
    counts = mask_counts(root, progress=lambda done, total: calls.append((done, total)))
    ids, lens, supervised = by_reading(root)
    assert counts.sample_ids.tolist() == ids and counts.lengths.tolist() == lens == lengths
    assert counts.supervised.tolist() == supervised and supervised[3] == 0
    assert counts.unreadable == [] and calls[-1] == (6, 6)


def test_a_damaged_mask_is_listed_not_raised(tmp_path):
    samples = {i: make_sample(i, 400) for i in range(3)}
    for s in samples.values():
        s["loss_mask"] = (torch.arange(400) % 7 == 0).to(torch.uint8)  # 58 ones  # compressible: stored as a zstd frame
    root = write(tmp_path / "ds", samples)
    counts = mask_counts(root)
    assert counts.supervised.tolist() == [58, 58, 58]
    shard = next((root / "shards").glob("*.eio"))
    data = bytearray(shard.read_bytes())
    # Record 1's loss_mask frame: after its header, 4 chunk tables and the input_ids payload.
    from eagle_io.store import reference as ref

    entry = ref.open_dataset(str(root)).shards[0].entries[1]
    rec = bytes(data[entry[1] : entry[1] + entry[2]])
    at, tables = ref.RECORD.size, []
    for _ in range(4):
        n, _ = ref.TENSOR.unpack_from(rec, at)
        tables.append([ref.CHUNK.unpack_from(rec, at + 8 + 24 * j) for j in range(n)])
        at += 8 + 24 * n
    mask_at = at + sum(sum(d[5:]) for d in tables[0])
    assert tables[1][0][0] == ref.ZSTD
    data[entry[1] + mask_at] ^= 0xFF  # the zstd magic
    shard.write_bytes(bytes(data))
    counts = mask_counts(root)
    assert counts.supervised.tolist() == [58, -1, 58]
    assert [(u[1]) for u in counts.unreadable] == [1] and str(shard) in counts.unreadable[0][0]


def test_a_mask_is_read_through_its_records_checksum(tmp_path):
    """A flipped bit in a record's hidden states, not in its mask: the record fails its CRC-32, so its mask is not
    counted (it was: the masks were read around the checksum) and the error names the shard, sample and offset."""
    samples = {i: make_sample(i, 64) for i in (3, 4, 5)}
    root = write(tmp_path / "ds", samples)
    shard = next((root / "shards").glob("*.eio"))
    entry = eagle_io.Dataset(root)._native.entry(1)  # (sample id, tokens, key) of position 1
    from eagle_io.store import reference as ref

    _, offset, length, *_ = ref.open_dataset(str(root)).shards[0].entries[1]
    data = bytearray(shard.read_bytes())
    data[offset + length - 3] ^= 0x10  # the last payload: hidden_states
    shard.write_bytes(bytes(data))
    counts = mask_counts(root)
    supervised = [int(s["loss_mask"].sum()) for s in samples.values()]
    assert counts.supervised.tolist() == [supervised[0], -1, supervised[2]]
    ((path, sample_id, message),) = counts.unreadable
    assert (path, sample_id) == (str(shard), entry[0]) and "checksum mismatch" in message
    assert f"byte offset {offset}" in message
    ds = eagle_io.Dataset(root)
    got = ds.read_tensor("loss_mask", [0, 2])
    assert [int(m.sum()) for m in got] == [supervised[0], supervised[2]] and got[0].dtype == torch.uint8
    with pytest.raises(eagle_io.CorruptRecordError, match="checksum mismatch") as e:
        ds.read_tensor("loss_mask", [0, 1, 2])
    assert e.value.sample_id == 4
    states = ds.read_tensor("hidden_states", [2])[0]
    assert torch.equal(states.view(torch.int16), samples[5]["hidden_states"].view(torch.int16))
    with pytest.raises(eagle_io.InvalidArgumentError, match="no tensor 'mask'"):
        ds.read_tensor("mask", [0])
    # A tensor stored as FP8 comes back dequantised, as a whole-sample read gives it.
    fp8 = tmp_path / "fp8"
    schema = eagle_io.eagle3_schema(32, precision="fp8")
    with eagle_io.ShardWriter(fp8, schema, {"target_model": "tiny"}, threads=1) as w:
        w.write(7, make_sample(7, 9))
    ds8 = eagle_io.Dataset(fp8)
    (aux,) = ds8.read_tensor("aux_hidden_states", [0])
    assert aux.dtype == torch.bfloat16 and torch.equal(
        aux.view(torch.int16), ds8[0]["aux_hidden_states"].view(torch.int16)
    )


def test_inspect_shows_percentiles_and_supervised_share(small_dataset, capsys):
    root, samples = small_dataset
    assert main(["inspect", str(root), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    lengths = sorted(len(t["input_ids"]) for t in samples.values())  # 0, 1, 5, 40 three times each
    for q in (1, 10, 25, 50, 75, 90, 99):  # the smallest length with at least q% of samples at or below it
        assert s["length_percentiles"][f"p{q}"] == lengths[math.ceil(q / 100 * len(lengths)) - 1]
    assert s["length_percentiles"]["p50"] == 1 and s["length_percentiles"]["max"] == 40
    assert s["length_percentiles"]["mean"] == pytest.approx(np.mean(lengths))
    m = s["loss_mask"]
    supervised = {sid: int(t["loss_mask"].sum()) for sid, t in samples.items()}
    assert m["supervised_tokens"] == sum(supervised.values()) and m["tokens"] == sum(lengths)
    assert m["supervised_share"] == pytest.approx(sum(supervised.values()) / sum(lengths))
    nonempty = [(supervised[sid], len(t["input_ids"])) for sid, t in samples.items() if len(t["input_ids"])]
    assert m["mean_sample_share"] == pytest.approx(np.mean([a / n for a, n in nonempty]))
    assert m["all_zero"] == sum(a == 0 for a, _ in nonempty) and m["all_one"] == sum(a == n for a, n in nonempty)
    assert m["empty"] == 3 and m["unreadable"] == 0
    assert main(["inspect", str(root)]) == 0
    out = capsys.readouterr().out
    assert "lengths   min 0, p10 0, p50 1, p90 40, p99 40, max 40 tokens" in out
    assert f"{100 * m['supervised_share']:.1f}% of tokens supervised" in out
    assert main(["inspect", str(root), "--json", "--no-masks"]) == 0
    assert json.loads(capsys.readouterr().out)["loss_mask"] is None
