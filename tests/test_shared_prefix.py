"""Shared prefixes stored once (issue 44, docs/FORMAT.md 4.7): a dataset whose samples reference a prefix record reads
back bit-identical to the same samples stored whole, through every reader and exporter; verify names every sample of a
corrupt or missing prefix; merge carries every rank's prefixes (ids numbered apart by rank), refusing two of one id."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import eagle_io
from conftest import make_sample, same
from eagle_io.cli import main
from eagle_io.feed import Loader, PackingCollator, PaddingCollator, ShardDataset
from eagle_io.interop.specforge import export_specforge
from eagle_io.interop.speculators import export_speculators
from eagle_io.store import reference
from eagle_io.store.manifest import manifest_bytes
from eagle_io.store.merge import merge_ranks
from eagle_io.store.transcode import transcode

H = 16
#: The last aux block is the final pre-norm state (layer N = 8): what speculators' export reads.
META = {
    "target_model": "tiny",
    "num_layers": 8,
    "hidden_size": H,
    "aux_layer_ids": [2, 4, 8],
    "final_state_is_prenorm": True,
}
PREFIX_ID = 70


def write_pair(
    root: Path, prefix_len: int, suffix_lens: list[int], precision: str | None = None
) -> dict[int, dict[str, torch.Tensor]]:
    """Writes ``root/dd`` (prefix record PREFIX_ID of ``prefix_len`` tokens; even samples reference it and store their
    suffix) and ``root/whole`` (the same samples stored whole), states stored in ``precision``; returns each sample's
    whole tensors by id (as given: FP8 states read back quantised)."""
    prefix = make_sample(999, prefix_len, hidden=H)
    whole = {}
    schema = eagle_io.eagle3_schema(H, precision=precision)
    with (
        eagle_io.ShardWriter(root / "dd", schema, META, shard_bytes=6_000, threads=1) as dd,
        eagle_io.ShardWriter(root / "whole", schema, META, shard_bytes=6_000, threads=1) as w,
    ):
        assert dd.write_prefix(PREFIX_ID, prefix)[:2] == (PREFIX_ID, prefix_len)
        for sid, n in enumerate(suffix_lens):
            suffix, refs = make_sample(sid, n, hidden=H), sid % 2 == 0
            whole[sid] = {k: torch.cat([prefix[k], v]) for k, v in suffix.items()} if refs else suffix
            dd.write(sid, suffix, key=f"k{sid}", prefix=PREFIX_ID if refs else None)
            w.write(sid, whole[sid], key=f"k{sid}")
    return whole


@pytest.fixture
def pair(tmp_path):
    whole = write_pair(tmp_path, 24, [3, 5, 1, 9, 0, 2, 7, 4])
    return tmp_path / "dd", tmp_path / "whole", whole


def test_the_dataset_stores_the_prefix_once_and_is_version_3(pair):
    dd, whole_root, _ = pair
    m = json.loads((dd / "manifest.json").read_text())
    assert m["format_version"] == 3 and [p["tokens"] for p in m["prefixes"]] == [24]
    assert json.loads((whole_root / "manifest.json").read_text())["format_version"] == 2
    stored = sum(s["bytes"] for s in m["shards"] + m["prefixes"])
    plain = sum(s["bytes"] for s in json.loads((whole_root / "manifest.json").read_text())["shards"])
    assert stored < 0.7 * plain, (stored, plain)  # 4 of 8 samples skip 24 of their tokens


def test_every_reader_returns_the_whole_samples(pair):
    dd, whole_root, whole = pair
    a, b = eagle_io.Dataset(dd), eagle_io.Dataset(whole_root)
    assert len(a) == len(b) == len(whole)
    for pos in range(len(a)):
        assert a.entry(pos) == b.entry(pos)
        same(a[pos], b[pos])
        sid = a.entry(pos).sample_id
        same({k: a[pos][k] for k in whole[sid]}, whole[sid])
    assert a.lengths() == b.lengths()
    ref = reference.open_dataset(dd)
    for pos in range(len(a)):
        got = ref.read(pos)
        for k, t in whole[b.entry(pos).sample_id].items():
            want = t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()
            assert np.array_equal(got[k], want), (pos, k)
    same([x for x in ShardDataset(dd)], [x for x in ShardDataset(whole_root)])
    for collator in (PaddingCollator(), PackingCollator(64)):
        got = [dict(x) for x in Loader(ShardDataset(dd), batch_size=3, collate_fn=collator)]
        same(got, [dict(x) for x in Loader(ShardDataset(whole_root), batch_size=3, collate_fn=collator)])


def test_exporters_and_transcode_write_what_the_whole_samples_give(pair, tmp_path):
    dd, whole_root, _ = pair
    for src in (dd, whole_root):
        export_specforge(src, tmp_path / f"sf-{src.name}")
        export_speculators(eagle_io.Dataset(src), tmp_path / f"sp-{src.name}")
        transcode(src, tmp_path / f"fp8-{src.name}", "fp8")
    for kind in ("sf", "sp"):
        files = sorted(p.relative_to(tmp_path / f"{kind}-dd") for p in (tmp_path / f"{kind}-dd").rglob("*.*"))
        assert files
        for f in files:
            a, b = (tmp_path / f"{kind}-dd" / f).read_bytes(), (tmp_path / f"{kind}-whole" / f).read_bytes()
            assert a == b or f.name == "eagle_io_export.json", f
    x, y = eagle_io.Dataset(tmp_path / "fp8-dd"), eagle_io.Dataset(tmp_path / "fp8-whole")
    assert len(x) == len(y)
    for pos in range(len(x)):
        same(x[pos], y[pos])


def test_fp8_states_and_single_tensor_reads_are_joined_as_stored(tmp_path):
    whole = write_pair(tmp_path, 17, [4, 0, 6, 3], precision="fp8")
    a, b = eagle_io.Dataset(tmp_path / "dd"), eagle_io.Dataset(tmp_path / "whole")
    assert a.schema[2].precision == "float8_e4m3fn"
    for pos in range(len(a)):
        same(a[pos], b[pos])
        assert torch.equal(a[pos]["input_ids"], whole[a.entry(pos).sample_id]["input_ids"])
    for name in ("aux_hidden_states", "input_ids"):
        same(a.read_tensor(name, range(len(a))), b.read_tensor(name, range(len(b))))


def test_verify_names_every_sample_of_a_corrupt_prefix(pair):
    dd, _, _ = pair
    m = json.loads((dd / "manifest.json").read_text())
    shard = dd / m["prefixes"][0]["file"]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x10  # inside the prefix record
    shard.write_bytes(data)
    bad = eagle_io.Dataset.verify(dd)
    assert [b[1] for b in bad] == [PREFIX_ID, 0, 2, 4, 6], bad
    assert all(f"its prefix record {PREFIX_ID} is corrupt" in b[3] for b in bad[1:])
    assert main(["verify", str(dd)]) != 0
    ds = eagle_io.Dataset(dd)
    with pytest.raises(eagle_io.CorruptRecordError, match=f"prefix record {PREFIX_ID} is unreadable"):
        ds[ds.position(2)]
    assert ds[ds.position(1)]["input_ids"].shape == (5,)  # samples without a reference still read


def test_a_dangling_reference_is_named(pair):
    dd, _, _ = pair
    with eagle_io.ShardWriter(dd, eagle_io.eagle3_schema(H), META, resume=True) as w:
        w.write_prefix(PREFIX_ID + 1, make_sample(5, 3, hidden=H))  # referenced by none
    m = json.loads((dd / "manifest.json").read_text())
    del m["prefixes"][0], m["checksum"]  # PREFIX_ID's shard is no longer listed
    (dd / "manifest.json").write_bytes(manifest_bytes(m))
    bad = eagle_io.Dataset.verify(dd)
    assert [b[1] for b in bad] == [0, 2, 4, 6]
    assert all(f"references prefix record {PREFIX_ID}, which the dataset does not hold" in b[3] for b in bad)
    with pytest.raises(eagle_io.CorruptRecordError, match="does not hold"):
        eagle_io.Dataset(dd)[0]
    # The reference reader names it too.
    with pytest.raises(reference.ReferenceFormatError, match="does not hold"):
        reference.open_dataset(dd).read(0)


def test_a_reference_must_name_a_prefix_of_this_dataset(tmp_path):
    with eagle_io.ShardWriter(tmp_path / "a", eagle_io.eagle3_schema(H), META) as w:
        w.write_prefix(1, make_sample(1, 4, hidden=H))
        with pytest.raises(eagle_io.SchemaError, match="prefix record 2"):
            w.write(5, make_sample(5, 2, hidden=H), prefix=2)
        with pytest.raises(eagle_io.SchemaError, match="already stored as prefix record 1"):
            w.write_prefix(3, make_sample(1, 4, hidden=H))
        assert w.prefixes() == {next(iter(w.prefixes())): (1, 4)}


def test_merge_carries_every_ranks_prefixes(tmp_path):
    """Two ranks share a system prompt of 20 tokens (and rank 1 a second one): each numbers its prefix records in its
    own range, and the merged dataset reads every sample back as the rank's own manifest does."""
    system, other = make_sample(900, 20, hidden=H), make_sample(901, 12, hidden=H)
    given = {}
    for rank in (0, 1):
        with eagle_io.ShardWriter(
            tmp_path, eagle_io.eagle3_schema(H), META, rank=rank, world_size=2, shard_bytes=3_000, threads=1
        ) as w:
            for sid in range(rank, 12, 2):
                head = other if rank == 1 and sid % 4 == 3 else system
                tail = make_sample(sid, 3 + sid % 5, hidden=H)
                given[sid] = {k: torch.cat([head[k], v]) for k, v in tail.items()}
                w.write(sid, given[sid], shared_prefix=len(head["input_ids"]))
            assert sorted(p for p, _ in w.prefixes().values()) == [rank * 2**40 + i for i in range(1 + rank)]
    report = merge_ranks(tmp_path)
    assert report.ok and report.written and report.prefix_records == 3
    merged = eagle_io.Dataset(tmp_path)
    assert merged.manifest["format_version"] == 3 and len(merged) == 12
    assert [(p, n) for p, n, _, _ in merged.prefix_records()] == [(0, 20), (2**40, 20), (2**40 + 1, 12)]
    for rank in (0, 1):
        own = eagle_io.Dataset(tmp_path / f"manifest.r{rank:05}.json")
        for pos in range(len(own)):
            sid = own.entry(pos).sample_id
            same(merged[merged.position(sid)], own[pos])
            same({k: own[pos][k] for k in given[sid]}, given[sid])  # whole samples, their prefix's rows first
    assert eagle_io.Dataset.verify(tmp_path) == []
    ref = reference.open_dataset(tmp_path)
    for pos in range(len(merged)):
        assert np.array_equal(ref.read(pos)["input_ids"], merged[pos]["input_ids"].numpy())


def test_merge_refuses_two_prefix_records_of_one_id(tmp_path):
    for rank in (0, 1):
        with eagle_io.ShardWriter(tmp_path, eagle_io.eagle3_schema(H), META, rank=rank, world_size=2) as w:
            w.write_prefix(1, make_sample(1 + rank, 4, hidden=H))  # the caller's ids: the same on both ranks
            w.write(rank, make_sample(rank, 3, hidden=H), prefix=1)
    with pytest.raises(eagle_io.IncompatibleDatasetError) as e:
        merge_ranks(tmp_path)
    msg = str(e.value)
    assert "prefix record 1 is held by both shards/r00000-prefix-000000.eio (manifest.r00000.json)" in msg
    assert "and shards/r00001-prefix-000000.eio (manifest.r00001.json), with different token ids" in msg
    assert not (tmp_path / "manifest.json").exists()


def test_a_shared_prefix_is_stored_once_and_must_leave_a_token(tmp_path):
    first = make_sample(1, 4, hidden=H)
    second = {k: torch.cat([v[:3], make_sample(2, 2, hidden=H)[k]]) for k, v in first.items()}
    with eagle_io.ShardWriter(tmp_path, eagle_io.eagle3_schema(H), META, rank=0) as w:
        with pytest.raises(eagle_io.SchemaError, match="a shared prefix of 4 tokens in a sample of 4"):
            w.write(1, first, shared_prefix=4)
        w.write(1, first, shared_prefix=3)
        w.write(2, second, shared_prefix=3)  # the same first 3 token ids: a reference to the record sample 1 made
        assert list(w.prefixes().values()) == [(0, 3)]
    ds = eagle_io.Dataset(tmp_path)
    same({k: ds[0][k] for k in first}, first)
    same({k: ds[1][k] for k in second}, second)
    assert [p[:2] for p in ds.prefix_records()] == [(0, 3)]


def test_version_3_is_the_version_of_manifests_listing_prefixes_only(pair):
    dd, whole_root, _ = pair
    for root, change in ((dd, {"format_version": 2}), (whole_root, {"format_version": 3})):
        m = json.loads((root / "manifest.json").read_text()) | change
        del m["checksum"]
        (root / "manifest.json").write_bytes(manifest_bytes(m))
        with pytest.raises(eagle_io.CorruptRecordError, match="version 3 is the version"):
            eagle_io.Dataset(root)
        with pytest.raises(reference.ReferenceFormatError, match="version of manifests listing prefix"):
            reference.open_dataset(root)


@settings(max_examples=12, deadline=None)
@given(st.integers(1, 40), st.lists(st.integers(0, 30), min_size=1, max_size=6))
def test_any_prefix_and_suffixes_read_back_whole(tmp_path_factory, prefix_len, suffix_lens):
    root = tmp_path_factory.mktemp("prop")
    whole = write_pair(root, prefix_len, suffix_lens)
    ds, ref = eagle_io.Dataset(root / "dd"), reference.open_dataset(root / "dd")
    for pos in range(len(ds)):
        sid = ds.entry(pos).sample_id
        same({k: ds[pos][k] for k in whole[sid]}, whole[sid])
        assert np.array_equal(ref.read(pos)["input_ids"], whole[sid]["input_ids"].numpy())
    assert eagle_io.Dataset.verify(root / "dd") == []


def test_the_capture_ring_carries_the_shared_prefix_count(tmp_path):
    from eagle_io.capturing.ring import RingSink

    first = make_sample(1, 6, hidden=H)
    second = {k: torch.cat([v[:4], make_sample(2, 3, hidden=H)[k]]) for k, v in first.items()}
    sink = RingSink(eagle_io.ShardWriter(tmp_path, eagle_io.eagle3_schema(H), META, threads=1), ring_bytes=1 << 20)
    with pytest.raises(eagle_io.SchemaError, match=r"shared_prefix 6: a shared prefix is an int in \[0, 6\)"):
        sink.put(1, first, shared_prefix=6)
    assert sink.put(1, first, shared_prefix=4) and sink.put(2, second, shared_prefix=4)
    m = sink.close()
    assert m["format_version"] == 3 and [p["tokens"] for p in m["prefixes"]] == [4]
    ds = eagle_io.Dataset(tmp_path)
    same({k: ds[0][k] for k in first}, first)
    same({k: ds[1][k] for k in second}, second)


def test_a_sample_put_after_its_stored_prefix_reads_back_whole_and_an_unknown_digest_stops_the_capture(tmp_path):
    from eagle_io.capturing.prefixes import token_digest
    from eagle_io.capturing.ring import RingSink

    first = make_sample(1, 6, hidden=H)
    second = {k: torch.cat([v[:4], make_sample(2, 3, hidden=H)[k]]) for k, v in first.items()}
    sink = RingSink(eagle_io.ShardWriter(tmp_path, eagle_io.eagle3_schema(H), META, threads=1), ring_bytes=1 << 20)
    digest = token_digest(first["input_ids"][:4])
    with pytest.raises(eagle_io.SchemaError, match="a stored_prefix is given with no shared_prefix"):
        sink.put(2, {k: v[4:] for k, v in second.items()}, shared_prefix=1, stored_prefix=digest)
    assert sink.put(1, first, shared_prefix=4)
    assert sink.put(2, {k: v[4:] for k, v in second.items()}, stored_prefix=digest)  # its 3 tokens after the prefix
    m = sink.close()
    assert [p["tokens"] for p in m["prefixes"]] == [4] and [s["samples"] for s in m["shards"]] == [2]
    ds = eagle_io.Dataset(tmp_path)
    same({k: ds[1][k] for k in second}, second)
    assert eagle_io.Dataset.verify(tmp_path) == []

    other = tmp_path / "other"
    sink = RingSink(eagle_io.ShardWriter(other, eagle_io.eagle3_schema(H), META, threads=1), ring_bytes=1 << 20)
    assert sink.put(3, first)
    with pytest.raises(eagle_io.SchemaError, match=r"sample 2: .*references the prefix record sha256:[0-9a-f]{64}, "
                                                   "which the writer does not hold"):  # fmt: skip
        sink.put(2, {k: v[4:] for k, v in second.items()}, stored_prefix=digest)
        sink.close()  # the sink thread may fail before this close, or during it
