"""Format version 1 stays readable: tests/fixtures/v1_dataset/ was written by the v1 writer (commit 8858a95,
tests/fixtures/make_v1_dataset.py) and is read bit-exactly by the Rust reader, the pure-Python reference reader
and ``verify``, against the values ``make_v1_dataset.samples()`` regenerates."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import eagle_io
from eagle_io.store import reference as R

FIXTURES = Path(__file__).resolve().parent / "fixtures"
ROOT = FIXTURES / "v1_dataset"
_spec = importlib.util.spec_from_file_location("make_v1_dataset", FIXTURES / "make_v1_dataset.py")
make = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make)
BF16 = {name for name, dtype, _ in make.SCHEMA if dtype == "bfloat16"}


def as_bits(name: str, t: torch.Tensor) -> np.ndarray:
    """A read tensor as the numpy array ``samples()`` gives (bf16 as its uint16 bit patterns)."""
    return t.view(torch.int16).numpy().view(np.uint16) if name in BF16 else t.numpy()


@pytest.fixture(scope="module")
def expected() -> list:
    return make.samples()


def test_the_fixture_is_format_1_and_small() -> None:
    manifest = json.loads((ROOT / "manifest.json").read_text())
    assert manifest["format_version"] == 1
    shards = sorted((ROOT / "shards").iterdir())
    assert len(shards) == len(manifest["shards"]) == 3
    assert all(s.read_bytes()[8:12] == (1).to_bytes(4, "little") for s in shards)  # header format_version
    assert sum(p.stat().st_size for p in ROOT.rglob("*") if p.is_file()) < 200_000


def test_rust_reader_reads_v1_bit_exactly(expected: list) -> None:
    ds = eagle_io.Dataset(ROOT, threads=2)
    assert len(ds) == len(expected) == len(make.LENGTHS)
    for pos, (sample_id, arrays, key) in enumerate(expected):
        info = ds.entry(pos)
        assert (info.sample_id, info.n_tokens, info.key) == (sample_id, make.LENGTHS[pos], key)
        got = ds.read(pos)
        for name, want in arrays.items():
            assert as_bits(name, got[name]).tobytes() == want.tobytes(), (pos, name)  # NaN payloads included
    nonfinite = ds.read(make.NONFINITE_SAMPLE)["hidden_states"][3].float()
    assert nonfinite.isnan().sum() == 10 and (nonfinite == float("inf")).sum() == 11


def test_reference_reader_reads_v1_bit_exactly(expected: list) -> None:
    ref = R.open_dataset(ROOT)
    assert len(ref) == len(expected)
    for pos, (sample_id, arrays, key) in enumerate(expected):
        assert ref.entry(pos) == (sample_id, make.LENGTHS[pos], key)
        got = ref.read(pos)
        for name, want in arrays.items():
            assert got[name].tobytes() == want.tobytes(), (pos, name)


def test_verify_passes_on_v1_and_finds_damage(tmp_path: Path) -> None:
    assert eagle_io.Dataset.verify(ROOT) == []
    copy = tmp_path / "v1"
    shutil.copytree(ROOT, copy)
    shard = sorted((copy / "shards").iterdir())[1]
    data = bytearray(shard.read_bytes())
    data[200] ^= 0x40
    shard.write_bytes(data)
    bad = eagle_io.Dataset.verify(copy)
    assert len(bad) == 1 and "checksum" in bad[0][3] and bad[0][0] == str(shard)
