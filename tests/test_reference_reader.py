"""The pure-Python reference reader (eagle_io.store.reference, written from docs/FORMAT.md alone) returns
bit-identical tensors, entries and keys to the Rust reader on data the Rust writer produced, and
rejects corrupted data naming the file, sample and offset."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import eagle_io
from eagle_io.store import reference as R

DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32"]
INT_RANGE = {"uint8": (0, 256), "int8": (-128, 128), "int16": (-(2**15), 2**15), "int32": (-(2**31), 2**31),
             "int64": (-(2**63), 2**63 - 1)}  # fmt: skip


def make(dtype: str, shape: tuple[int, ...], gen: torch.Generator, kind: str = "real") -> torch.Tensor:
    """``real``: small-range ints / hidden-state-like floats; ``noise``: uniformly random bits
    (incompressible); ``zeros``: constant."""
    tdtype = getattr(torch, dtype)
    if kind == "zeros":
        return torch.zeros(shape, dtype=tdtype)
    if dtype == "bool":
        return torch.randint(0, 2, shape, generator=gen).bool()
    if kind == "noise":
        return torch.randint(0, 256, (*shape, tdtype.itemsize), generator=gen, dtype=torch.uint8).view(tdtype)[..., 0]
    if dtype in INT_RANGE:
        lo, hi = INT_RANGE[dtype]
        return torch.randint(max(lo, -1000), min(hi, 1000), shape, generator=gen, dtype=tdtype)
    return (torch.randn(shape, generator=gen) * 2.5).to(tdtype)


def write(root: Path, specs: list, samples: list, **kw) -> dict:
    """Writes ``[(sample_id, {name: tensor}, key)]`` with the Rust writer; returns the manifest."""
    kw = {"shard_bytes": 1 << 20, "chunk_bytes": 1 << 20, "threads": 2} | kw
    writer = eagle_io.ShardWriter(root, specs, {"test": True}, **kw)
    for sample_id, tensors, key in samples:
        writer.write(sample_id, tensors, key=key)
    return writer.close()


def assert_identical(root: Path) -> R.ReferenceDataset:
    rust, ref = eagle_io.Dataset(root, threads=2), R.open_dataset(root)
    assert ref.manifest.pop("checksum").startswith("crc32:")  # checked by both; Dataset.manifest omits it
    assert ref.manifest == rust.manifest
    assert len(ref) == len(rust)
    for pos in range(len(rust)):
        info = rust.entry(pos)
        assert ref.entry(pos) == (info.sample_id, info.n_tokens, info.key)
        assert ref.position(info.sample_id) == rust.position(info.sample_id) == pos
        got, want = ref.read(pos), rust[pos]
        assert want.pop("sample_id") == info.sample_id and list(got) == list(want)
        for name, tensor in want.items():
            array = got[name]
            assert array.shape == tuple(tensor.shape), name
            assert array.dtype == (np.uint16 if tensor.dtype == torch.bfloat16 else tensor.numpy().dtype), name
            assert np.array_equal(array.view(np.uint8), tensor.view(torch.uint8).numpy()), name
    return ref


def chunk_kinds(ref: R.ReferenceDataset) -> set[tuple]:
    """``(dtype itemsize, codec, planes, plane_zstd)`` of every chunk, parsed with the reference's structs."""
    kinds = set()
    for pos in range(len(ref)):
        shard, (_, offset, length, *_) = ref._at(pos)
        rec = Path(shard.path).read_bytes()[offset : offset + length]
        at = R.RECORD.size
        for _, dtype, _, _ in ref.schema:
            n_chunks, _ = R.TENSOR.unpack_from(rec, at)
            for j in range(n_chunks):
                codec, planes, plane_zstd, *_ = R.CHUNK.unpack_from(rec, at + 8 + 24 * j)
                kinds.add((dtype.itemsize, codec, planes, plane_zstd))
            at += 8 + 24 * n_chunks
    return kinds


def test_every_dtype_chunks_shards_and_codecs(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    specs = [eagle_io.TensorSpec(f"{d}_1d", d) for d in DTYPES]
    widths = [3, 1, 7, 16, 5, 4, 33, 96, 40]
    specs += [eagle_io.TensorSpec(f"{d}_2d", d, w) for d, w in zip(DTYPES, widths, strict=True)]
    samples = []
    for i, n in enumerate([0, 1, 2, 13, 60, 150, 0, 1, 37, 90]):
        kind = ["real", "noise", "zeros"][i % 3]
        tensors = {s.name: make(s.dtype, (n,) if s.width is None else (n, s.width), gen, kind) for s in specs}
        samples.append((1000 + 7 * i if i != 4 else 2**64 - 1, tensors, ["", f"conv-{i}", "ключ✓"][i % 3]))
    manifest = write(tmp_path, specs, samples, shard_bytes=24 << 10, chunk_bytes=256)
    assert len(manifest["shards"]) >= 3
    kinds = chunk_kinds(assert_identical(tmp_path))
    assert {codec for _, codec, _, _ in kinds} == {R.RAW, R.ZSTD, R.PLANES}
    assert (2, R.PLANES, 2, 0b10) in kinds  # bf16/f16: raw low plane, zstd high plane
    assert (2, R.PLANES, 2, 0) in kinds and (4, R.PLANES, 4, 0) in kinds  # noise: every plane raw
    assert (4, R.PLANES, 4, 0b1111) in kinds and (8, R.ZSTD, 1, 0) in kinds and (8, R.RAW, 1, 0) in kinds


def test_wide_rows_few_tokens(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(1)
    specs = [*eagle_io.eagle3_schema(7168), eagle_io.TensorSpec("wider", "bfloat16", 24576)]
    assert specs[2].width == 21504
    samples = []
    for i, n in enumerate([0, 1, 3]):
        samples.append((i, {
            "input_ids": torch.randint(0, 150_000, (n,), generator=gen),
            "loss_mask": torch.randint(0, 2, (n,), generator=gen, dtype=torch.uint8),
            "aux_hidden_states": (torch.randn(n, 21504, generator=gen) * 4).bfloat16(),
            "hidden_states": (torch.randn(n, 7168, generator=gen) * 0.8).bfloat16(),
            "wider": make("bfloat16", (n, 24576), gen, "noise" if i == 2 else "real"),
        }, f"wide-{i}"))  # fmt: skip
    write(tmp_path, specs, samples, chunk_bytes=64 << 10)
    kinds = chunk_kinds(assert_identical(tmp_path))
    assert (2, R.PLANES, 2, 0b10) in kinds and (2, R.PLANES, 2, 0) in kinds  # hidden states; noise


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tensors=st.lists(st.tuples(st.sampled_from(DTYPES), st.none() | st.integers(1, 200)), min_size=1, max_size=4),
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=5),
    chunk_bytes=st.sampled_from([1, 100, 4096, 1 << 20]),
    kind=st.sampled_from(["real", "noise", "zeros"]),
    seed=st.integers(0, 2**31),
)
def test_property_random_schemas(tensors: list, lengths: list, chunk_bytes: int, kind: str, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    specs = [eagle_io.TensorSpec(f"t{i}", d, w) for i, (d, w) in enumerate(tensors)]
    samples = [(seed + i, {s.name: make(s.dtype, (n,) if s.width is None else (n, s.width), gen, kind)
                           for s in specs}, str(i) * i) for i, n in enumerate(lengths)]  # fmt: skip
    with tempfile.TemporaryDirectory() as root:
        write(Path(root), specs, samples, chunk_bytes=chunk_bytes, shard_bytes=4096)
        assert_identical(Path(root))


@pytest.fixture
def small(tmp_path: Path) -> Path:
    gen = torch.Generator().manual_seed(2)
    specs = eagle_io.eagle3_schema(32)
    samples = [(10 + i, {s.name: make(s.dtype, (n,) if s.width is None else (n, s.width), gen) for s in specs},
                f"k{i}") for i, n in enumerate([5, 9, 0, 17])]  # fmt: skip
    write(tmp_path, specs, samples, chunk_bytes=512)
    return tmp_path


def shard_path(root: Path) -> Path:
    (shard,) = json.loads((root / "manifest.json").read_text())["shards"]
    return root / shard["file"]


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(data)


def test_corrupt_record_names_sample_and_offset(small: Path) -> None:
    ref = R.open_dataset(small)
    _, (sample_id, offset, length, *_) = ref._at(1)
    flip(shard_path(small), offset + length - 3)  # inside the last chunk's payload
    with pytest.raises(R.ReferenceFormatError) as err:
        ref.read(1)
    assert (err.value.path, err.value.sample_id, err.value.offset) == (str(shard_path(small)), sample_id, offset)
    assert f"sample {sample_id}" in str(err.value) and f"offset {offset}" in str(err.value)
    ref.read(0), ref.read(2)  # the other records are intact
    with pytest.raises(eagle_io.CorruptRecordError):
        eagle_io.Dataset(small)[1]


def test_corrupt_index_names_index_offset(small: Path) -> None:
    path = shard_path(small)
    data = path.read_bytes()
    index_offset = R.FOOTER.unpack_from(data, len(data) - R.FOOTER.size)[0]
    flip(path, index_offset + 40 + 8)  # entry 1's offset field
    with pytest.raises(R.ReferenceFormatError, match="index_crc32") as err:
        R.open_dataset(small)
    assert (err.value.sample_id, err.value.offset) == (None, index_offset)
    assert f"offset {index_offset}" in str(err.value)


def test_truncated_shard(small: Path) -> None:
    path = shard_path(small)
    os.truncate(path, path.stat().st_size - 1)
    with pytest.raises(R.ReferenceFormatError, match="manifest lists"):
        R.open_dataset(small)


def test_newer_versions(small: Path) -> None:
    manifest = json.loads((small / "manifest.json").read_text())
    original = (small / "manifest.json").read_bytes()
    (small / "manifest.json").write_text(json.dumps(manifest | {"format_version": 4}))
    with pytest.raises(R.ReferenceVersionError, match="format_version 4"):
        R.open_dataset(small)  # reported as a newer version, not as a checksum mismatch
    (small / "manifest.json").write_bytes(original)
    flip(shard_path(small), 8 + 1)  # header format_version 2 -> 0x4002
    with pytest.raises(R.ReferenceVersionError) as err:
        R.open_dataset(small)
    assert err.value.offset == 8 and isinstance(err.value, R.ReferenceFormatError)


def test_reserved_header_bytes_rejected(small: Path) -> None:
    flip(shard_path(small), 20)
    with pytest.raises(R.ReferenceFormatError, match="reserved"):
        R.open_dataset(small)


def test_every_byte_flip_and_truncation_is_detected(tmp_path: Path) -> None:
    """Every byte of a shard is covered by a check: flipping any one (or cutting the file anywhere) makes
    opening or reading fail with ReferenceFormatError, never another exception, in both readers."""
    specs = [eagle_io.TensorSpec("ids", "int64"), eagle_io.TensorSpec("h", "bfloat16", 4)]
    samples = [(i, {"ids": torch.arange(n), "h": torch.ones(n, 4).bfloat16()}, "k" * i) for i, n in enumerate([0, 2])]
    write(tmp_path, specs, samples)
    path = shard_path(tmp_path)
    good = path.read_bytes()
    for i in range(len(good) + 1):
        data = bytearray(good)
        if i < len(good):
            data[i] ^= 0x01
        path.write_bytes(data[: len(good) - 1] if i == len(good) else data)
        with pytest.raises(R.ReferenceFormatError):
            ref = R.open_dataset(tmp_path)
            [ref.read(pos) for pos in range(len(ref))]
        with pytest.raises(eagle_io.EagleIOError):
            rust = eagle_io.Dataset(tmp_path)
            [rust[pos] for pos in range(len(rust))]


def test_standalone_without_native(small: Path) -> None:
    """The module loads from its file alone and never imports eagle_io (so not its native code)."""
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('ref', {R.__file__!r})\n"
        "ref = importlib.util.module_from_spec(spec); spec.loader.exec_module(ref)\n"
        f"ds = ref.open_dataset({str(small)!r}); ds.read(len(ds) - 1)\n"
        "assert not [m for m in sys.modules if m.startswith(('eagle_io', 'torch'))]\n"
    )
    subprocess.run([sys.executable, "-I", "-c", code], check=True, cwd=small)


def _sealed(text: str) -> bytes:
    """``text`` (JSON with a ``"crc32:00000000"`` checksum) sealed as FORMAT.md section 2 says."""
    data = text.encode()
    return data.replace(b"crc32:00000000", f"crc32:{zlib.crc32(data):08x}".encode())


@pytest.mark.parametrize(
    "case",
    ["NaN", "Infinity", "lone surrogate", "128 levels", "parent dir", "absolute", "leading dot", "missing shard"],
)
def test_both_readers_refuse_what_section_2_forbids_even_when_sealed(small: Path, case: str) -> None:
    """Crafted manifests with a valid checksum: the Rust reader and the reference reader agree (both refuse)."""
    m = json.loads((small / "manifest.json").read_text()) | {"checksum": "crc32:00000000"}
    shard = m["shards"][0]["file"]
    deep: object = 0
    for _ in range(126):  # + the manifest object and the metadata object: 128 levels
        deep = [deep]
    edits = {
        "NaN": lambda: json.dumps(m).replace('"metadata": {', '"metadata": {"x": NaN, ', 1),
        "Infinity": lambda: json.dumps(m).replace('"metadata": {', '"metadata": {"x": -Infinity, ', 1),
        "lone surrogate": lambda: json.dumps(m).replace('"metadata": {', '"metadata": {"x": "\\ud800", ', 1),
        "128 levels": lambda: json.dumps(m | {"metadata": {"x": deep}}),
        "parent dir": lambda: json.dumps(m).replace(shard, f"../{small.name}/{shard}"),
        "absolute": lambda: json.dumps(m).replace(shard, str(small / shard)),
        "leading dot": lambda: json.dumps(m).replace(shard, f"./{shard}"),
        "missing shard": lambda: json.dumps(m).replace(shard, "shards/gone.eio"),
    }
    (small / "manifest.json").write_bytes(_sealed(edits[case]()))
    with pytest.raises(eagle_io.EagleIOError):
        eagle_io.Dataset(small)
    with pytest.raises(R.ReferenceFormatError):
        R.open_dataset(small)
