"""ShardWriter -> Dataset round trips through the native core, and input validation."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers.shard_bytes import layout

import eagle_io
from conftest import make_sample
from eagle_io import TensorSpec


def assert_same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a.view(torch.uint8) if a.numel() else a, b.view(torch.uint8) if b.numel() else b)


def test_roundtrip_bit_exact_with_keys_and_ids(small_dataset):
    root, samples = small_dataset
    ds = eagle_io.Dataset(root)
    assert len(ds) == 12 and len(ds.manifest["shards"]) > 1
    for pos in range(len(ds)):
        item = ds[pos]
        sid = item["sample_id"]
        assert ds.entry(pos) == eagle_io.SampleInfo(sid, samples[sid]["input_ids"].shape[0], f"conv-{sid}")
        assert ds.position(sid) == pos
        for name, t in samples[sid].items():
            assert_same(item[name], t)
    assert ds.position(999) is None
    assert ds.lengths() == [ds.entry(p).n_tokens for p in range(len(ds))]
    with pytest.raises(IndexError):
        ds[12]


def test_manifest_and_schema_are_typed_values_equal_to_the_file(tmp_path):
    """The native reader hands the manifest as a dict and the schema as tuples (no JSON text): they equal the
    manifest file read by ``json``, FP8 precision and scale block included."""
    specs = [TensorSpec("ids", "int64"), TensorSpec("x", "bfloat16", 64, "float8_e4m3fn", 32)]
    meta = {"hidden_size": 64, "eps": 1e-05, "big": 2**63 + 1, "neg": -3, "ids": [2, 16], "none": None, "ok": True}
    with eagle_io.ShardWriter(tmp_path, specs, meta, threads=1) as w:
        w.write(7, {"ids": torch.arange(3), "x": torch.ones(3, 64, dtype=torch.bfloat16)})
    ds = eagle_io.Dataset(tmp_path)
    on_disk = json.loads((tmp_path / "manifest.json").read_text())
    assert ds.manifest == {k: v for k, v in on_disk.items() if k != "checksum"}
    assert ds.metadata == meta and type(ds.metadata["eps"]) is float and type(ds.metadata["big"]) is int
    assert ds.schema == specs
    assert ds._native.schema() == [("ids", "int64", None, None, None), ("x", "bfloat16", 64, "float8_e4m3fn", 32)]


def test_every_dtype_from_torch_numpy_and_memoryview(tmp_path):
    dtypes = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32"]
    schema = [TensorSpec(d, d, None if i % 2 else 7) for i, d in enumerate(dtypes)]
    g = torch.Generator().manual_seed(0)

    def tensor(spec: TensorSpec, n: int) -> torch.Tensor:
        shape = (n,) if spec.width is None else (n, spec.width)
        return (torch.randn(shape, generator=g) * 50).to(getattr(torch, spec.dtype))

    want = {s.name: tensor(s, 9) for s in schema}
    given = {n: (t.numpy() if i % 3 == 0 and n != "bfloat16" else t) for i, (n, t) in enumerate(want.items())}
    given["int16"] = memoryview(want["int16"].numpy())
    with eagle_io.ShardWriter(tmp_path, schema, {}, threads=1) as w:
        w.write(5, given)
    got = eagle_io.Dataset(tmp_path)[0]
    for name, t in want.items():
        assert_same(got[name], t)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s.update(aux_hidden_states=s["aux_hidden_states"].float()), "dtype float32"),
        (lambda s: s.update(hidden_states=s["hidden_states"][:, :16].contiguous()), "shape [5, 16]"),
        (lambda s: s.update(loss_mask=s["loss_mask"][:4]), "shape [4]"),
        (lambda s: s.update(hidden_states=s["hidden_states"].t().contiguous().t()), "not contiguous"),
        (lambda s: s.pop("loss_mask"), "missing ['loss_mask']"),
        (lambda s: s.update(extra=s["loss_mask"]), "unexpected ['extra']"),
        (lambda s: s.update(input_ids=s["input_ids"].tolist()), "got list"),
    ],
)
def test_invalid_samples_raise_schema_error_and_write_nothing(tmp_path, change, message):
    w = eagle_io.ShardWriter(tmp_path, eagle_io.eagle3_schema(32), {}, threads=1)
    good, bad = make_sample(1, 5), make_sample(2, 5)
    change(bad)
    with pytest.raises(eagle_io.SchemaError, match=message.replace("[", r"\[")) as e:
        w.write_batch([(1, good, ""), (2, bad, "")])
    assert e.value.sample_id == 2
    assert 1 not in w
    w.write(1, good)
    with pytest.raises(eagle_io.SchemaError, match="already in the dataset"):
        w.write(1, good)
    manifest = w.close()
    assert [s["samples"] for s in manifest["shards"]] == [1]


def test_corruption_raises_with_path_sample_and_offset(small_dataset):
    root, _ = small_dataset
    ds = eagle_io.Dataset(root)
    shard = root / ds.manifest["shards"][0]["file"]
    last_of_shard0 = ds.entry(ds.manifest["shards"][0]["samples"] - 1)
    # The last record of shard 0 ends where its index starts (footer field 0): flip a byte 10 before.
    lay = layout(shard)
    data = bytearray(lay["data"])
    data[lay["index_offset"] - 10] ^= 0x01
    shard.write_bytes(bytes(data))
    bad = eagle_io.Dataset.verify(root)
    assert len(bad) == 1
    path, sample_id, offset, message = bad[0]
    assert (path, sample_id) == (str(shard), last_of_shard0.sample_id) and "checksum" in message
    ds = eagle_io.Dataset(root)
    with pytest.raises(eagle_io.CorruptRecordError) as e:
        ds[ds.position(sample_id)]
    assert (e.value.path, e.value.sample_id, e.value.offset) == (str(shard), sample_id, offset)
    assert f"sample id {sample_id}" in str(e.value) and f"offset {offset}" in str(e.value)


def test_newer_format_version_and_storage_errors(small_dataset, tmp_path):
    root, _ = small_dataset
    manifest = root / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"format_version": 2', '"format_version": 9'))
    with pytest.raises(eagle_io.FormatVersionError) as e:
        eagle_io.Dataset(root)
    assert (e.value.found, e.value.supported) == (9, 3)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(eagle_io.StorageError) as e:
        eagle_io.ShardWriter(blocker / "ds", eagle_io.eagle3_schema(8), {})
    assert isinstance(e.value, OSError) and str(blocker) in str(e.value)


def test_resume_rules(tmp_path):
    schema = eagle_io.eagle3_schema(32)
    with eagle_io.ShardWriter(tmp_path, schema, {"a": 1}, threads=1) as w:
        w.write(1, make_sample(1, 4))
    with pytest.raises(eagle_io.InvalidArgumentError, match="resume"):
        eagle_io.ShardWriter(tmp_path, schema, {"a": 1})
    with pytest.raises(eagle_io.IncompatibleDatasetError, match='"a"'):
        eagle_io.ShardWriter(tmp_path, schema, {"a": 2}, resume=True)
    with pytest.raises(eagle_io.IncompatibleDatasetError, match="schema"):
        eagle_io.ShardWriter(tmp_path, eagle_io.eagle3_schema(16), {"a": 1}, resume=True)
    with eagle_io.ShardWriter(tmp_path, schema, {"a": 1}, resume=True, threads=1) as w:
        assert 1 in w and 2 not in w
        w.write(2, make_sample(2, 4))
    assert sorted(eagle_io.Dataset(tmp_path)[p]["sample_id"] for p in range(2)) == [1, 2]


def test_ranks_share_a_root_without_colliding(tmp_path):
    schema = eagle_io.eagle3_schema(32)
    writers = [eagle_io.ShardWriter(tmp_path, schema, {}, rank=r, world_size=2, threads=1) for r in range(2)]
    for r, w in enumerate(writers):
        w.write(r, make_sample(r, 3))
        w.close()
    for r in range(2):
        ds = eagle_io.Dataset(tmp_path / f"manifest.r{r:05d}.json")
        assert len(ds) == 1 and ds[0]["sample_id"] == r


def test_read_into_caller_buffers(small_dataset):
    root, samples = small_dataset
    ds = eagle_io.Dataset(root, threads=1)
    pos = next(p for p in range(len(ds)) if ds.entry(p).n_tokens == 40)
    sid = ds.entry(pos).sample_id
    out = {
        s.name: torch.full((40,) if s.width is None else (40, s.width), 7).to(getattr(torch, s.dtype))
        for s in ds.schema
    }
    ds.read_into(pos, out)
    for name, t in samples[sid].items():
        assert_same(out[name], t)
    out["hidden_states"] = out["hidden_states"][:39]
    with pytest.raises(eagle_io.InvalidArgumentError, match="hidden_states"):
        ds.read_into(pos, out)
    with pytest.raises(ValueError, match="contiguous"):
        ds.read_into(pos, {**out, "aux_hidden_states": torch.zeros(96, 40, dtype=torch.bfloat16).t()})


def test_numpy_bool_and_empty_sample(tmp_path):
    schema = [TensorSpec("m", "bool"), TensorSpec("x", "float32", 3)]
    with eagle_io.ShardWriter(tmp_path, schema, {}, threads=1) as w:
        w.write(0, {"m": np.array([], dtype=bool), "x": np.zeros((0, 3), np.float32)})
        w.write(1, {"m": np.array([True, False]), "x": np.arange(6, dtype=np.float32).reshape(2, 3)})
    ds = eagle_io.Dataset(tmp_path)
    assert ds[0]["m"].shape == (0,) and ds[0]["x"].shape == (0, 3)
    assert ds[1]["m"].tolist() == [True, False] and ds[1]["x"].flatten().tolist() == list(range(6))


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"rank": 2, "world_size": 2}, r"rank 2 is outside \[0, world_size = 2\)"),  # wrote manifest.r00002.json
        ({"rank": -1, "world_size": 2}, "rank must be an integer >= 0"),  # OverflowError
        ({"world_size": 0}, "world_size must be an integer >= 1"),
        ({"threads": -1}, "threads must be an integer >= 0"),  # OverflowError
    ],
)
def test_writer_options_are_checked_before_anything_is_created(tmp_path, options, match):
    with pytest.raises(eagle_io.InvalidArgumentError, match=match):
        eagle_io.ShardWriter(tmp_path / "d", eagle_io.eagle3_schema(8), {}, **options)
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("metadata", [{"a": object()}, {"a": float("nan")}, {"a": {1, 2}}])
def test_metadata_that_is_not_json_is_an_invalid_argument(tmp_path, metadata):
    """A non-serialisable value raised json's TypeError; NaN reached the core as "expected value at column 7"."""
    with pytest.raises(eagle_io.InvalidArgumentError, match="metadata is not JSON"):
        eagle_io.ShardWriter(tmp_path, eagle_io.eagle3_schema(8), metadata)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((8, 3, "int8"), "states are stored as one of bfloat16, float16, float32, not 'int8'"),
        ((8, 3, "bool"), "not 'bool'"),
        ((0,), "hidden_size must be an integer >= 1"),
        ((8, 0), "num_aux_layers must be an integer >= 1"),
    ],
)
def test_eagle3_schema_refuses_states_that_cannot_hold_states(args, match):
    """int8/bool states (and width-0 tensors) were accepted: a capture with state_dtype=torch.int8 stored garbage."""
    with pytest.raises(eagle_io.InvalidArgumentError, match=match):
        eagle_io.eagle3_schema(*args)


def test_negative_reader_threads_are_an_invalid_argument(small_dataset, capsys):
    """`eagle-io verify --threads -1` ended in an OverflowError traceback."""
    from eagle_io.cli import main

    root, _ = small_dataset
    with pytest.raises(eagle_io.InvalidArgumentError, match="threads must be an integer >= 0"):
        eagle_io.Dataset(root, threads=-1)
    with pytest.raises(eagle_io.InvalidArgumentError, match="threads must be an integer >= 0"):
        eagle_io.Dataset.verify(root, threads=-1)
    assert main(["verify", str(root), "--threads", "-1"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("eagle-io verify: InvalidArgumentError: threads")


def test_read_into_checks_shapes_positions_and_overlaps(tmp_path):
    from conftest import make_sample

    with eagle_io.ShardWriter(tmp_path, eagle_io.eagle3_schema(32), {}, threads=1) as w:
        w.write(7, make_sample(7, 5))
    ds = eagle_io.Dataset(tmp_path)
    out = {s.name: torch.empty((5,) if s.width is None else (5, s.width), dtype=getattr(torch, s.dtype))
           for s in ds.schema}  # fmt: skip
    ds.read_into(0, out)
    assert torch.equal(out["aux_hidden_states"], make_sample(7, 5)["aux_hidden_states"])
    same_bytes = torch.empty(96, 5, dtype=torch.bfloat16)  # as many bytes as [5, 96], another shape
    match = r"^position 0: output 'aux_hidden_states' has shape \[96, 5\], expected \[5, 96\]$"
    with pytest.raises(eagle_io.InvalidArgumentError, match=match):
        ds.read_into(0, {**out, "aux_hidden_states": same_bytes})
    with pytest.raises(eagle_io.InvalidArgumentError, match="no output tensor for 'hidden_states'"):
        ds.read_into(0, {k: v for k, v in out.items() if k != "hidden_states"})
    with pytest.raises(eagle_io.SampleNotFoundError, match="position -1 out of range"):
        ds.read_into(-1, out)
    with pytest.raises(eagle_io.errors.ArgumentTypeError, match="position must be an int, got bool"):
        ds.read_into(True, out)
    backing = torch.zeros(5, 96, dtype=torch.bfloat16)
    aliased = {**out, "aux_hidden_states": backing, "input_ids": backing.view(torch.int64).reshape(-1)[:5]}
    with pytest.raises(eagle_io.InvalidArgumentError, match="output buffers overlap"):
        ds.read_into(0, aliased)


def test_reader_bindings_refuse_out_of_range_ints_naming_the_argument(small_dataset):
    """`Dataset.entry(-1)`, `Dataset.position(-1)` and the native reader's and writer's counts and positions given a
    negative or too large int raised a builtin OverflowError naming nothing."""
    from eagle_io import _native

    root, _ = small_dataset
    ds = eagle_io.Dataset(root)
    calls = [
        (lambda: ds.entry(-1), "pos", -1),
        (lambda: ds.entry(1 << 64), "pos", 1 << 64),
        (lambda: ds.position(-1), "sample_id", -1),
        (lambda: ds._native.read_into(-2, []), "pos", -2),
        (lambda: ds._native.read_stored_into(-2, []), "pos", -2),
        (lambda: ds._native.read_batch([(-3, [])]), "pos", -3),
        (lambda: _native.Reader(str(root), -1), "threads", -1),
        (lambda: _native.Reader(str(root), 0, -1), "in_flight", -1),
        (lambda: _native.Reader(str(root), 0, None, -1), "coalesce_gap", -1),
        (lambda: _native.Reader(str(root), 0, None, None, 1 << 64), "part_bytes", 1 << 64),
        (lambda: _native.Reader(str(root), cache_dir=str(root), cache_bytes=-1), "cache_bytes", -1),
        (lambda: _native.Reader.verify(str(root), -1), "threads", -1),
        (
            lambda: _native.Writer(
                str(root.parent / "x"),
                [("input_ids", "int64", None, None, None)],
                {},
                shard_bytes=-1,
                chunk_bytes=1,
                threads=1,
                zstd_level=1,
                queue_depth=1,
                shard_prefix="r",
                manifest_name="m.json",
                resume=False,
            ),
            "shard_bytes",
            -1,
        ),
    ]
    for call, name, value in calls:
        match = rf"^{name} must be an integer in \[0, 2\*\*64\), not {value}$"
        with pytest.raises(eagle_io.InvalidArgumentError, match=match):
            call()
    for call, name in ((lambda: _native.manifest_name(-1, 2), "rank"), (lambda: _native.shard_prefix(1 << 32), "rank")):
        with pytest.raises(eagle_io.InvalidArgumentError, match=rf"^{name} must be an integer in \[0, 2\*\*32\)"):
            call()
    assert _native.Reader(str(root), None).entry(0) == tuple(vars(ds.entry(0)).values())  # None: the default
    assert ds.entry(np.int64(1)) == ds.entry(1)  # integers with __index__ (numpy's) are ints
    with pytest.raises(eagle_io.InvalidArgumentError, match=r"^pos must be an integer in \[0, 2\*\*64\), not -1$"):
        ds.entry(np.int64(-1))
    with pytest.raises(eagle_io.errors.ArgumentTypeError, match=r"^pos must be an int, not float$"):
        ds.entry(1.0)
    with eagle_io.ShardWriter(root.parent / "w", eagle_io.eagle3_schema(8), {}, threads=1) as w:
        assert (-1 in w, 1 << 64 in w) == (False, False)  # no id: not contained (was OverflowError)
        with pytest.raises(eagle_io.errors.ArgumentTypeError, match="sample_id must be an int, not str"):
            "1" in w._native  # noqa: B015


def test_read_into_refuses_read_only_memory_naming_the_output(small_dataset, tmp_path):
    """A tensor made by `torch.from_numpy` over a read-only memory map exports a writable buffer (torch has no
    read-only tensors): `Dataset.read_into` decoded into it and the process died of SIGSEGV. Read-only exports
    (a numpy array with `writeable=False`, bytes) are refused by the native reader too. Nothing is written."""
    import warnings

    root, _ = small_dataset
    ds = eagle_io.Dataset(root)
    pos = next(p for p in range(len(ds)) if ds.entry(p).n_tokens == 5)
    want = ds[pos]
    out = {s.name: torch.full_like(want[s.name], 7) for s in ds.schema}
    nbytes = want["hidden_states"].numel() * 2
    np.save(tmp_path / "ro.npy", np.zeros(nbytes, np.uint8))
    mapped = np.load(tmp_path / "ro.npy", mmap_mode="r")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: "The given NumPy array is not writable"
        ro = torch.from_numpy(mapped).view(torch.bfloat16).view(want["hidden_states"].shape)
    match = "^hidden_states: the memory is read-only though its buffer says writable"
    with pytest.raises(eagle_io.InvalidArgumentError, match=match):
        ds.read_into(pos, {**out, "hidden_states": ro})
    with pytest.raises(eagle_io.InvalidArgumentError, match=match):
        ds.read_batch([(pos, out), (pos, {**{k: v.clone() for k, v in out.items()}, "hidden_states": ro})])
    for name, t in out.items():  # the writable outputs were probed, not changed
        assert torch.equal(t.view(torch.uint8), torch.full_like(t, 7).view(torch.uint8)), name
    flagged = [np.zeros(want[s.name].numel() * want[s.name].element_size(), np.uint8) for s in ds.schema]
    flagged[1].flags.writeable = False
    with pytest.raises(eagle_io.InvalidArgumentError, match=r"^loss_mask: buffer is read-only$"):
        ds._native.read_into(pos, flagged)
    ds.read_into(pos, out)
    assert all(torch.equal(out[s.name].view(torch.uint8), want[s.name].view(torch.uint8)) for s in ds.schema)
