"""SpecForge interop: the per-sample dict its offline EAGLE-3 trainer consumes, import of its .ckpt/.ckpt.gz
files (verified, errors naming the file), export of its layout, bit-exact round trips.

Where the SpecForge wheel is installed (``pip install --no-deps specforge==0.2.0``), the adapter is compared with
SpecForge's own ``normalize_offline_sample`` (``specforge/algorithms/eagle3/data.py``, loaded from the installed
file without importing its heavy package)."""

from __future__ import annotations

import gzip
import importlib.metadata
import importlib.util
import io
import os
import types
from pathlib import Path

import pytest
import torch

import eagle_io
from conftest import make_sample
from eagle_io import defaults
from eagle_io.cli import main, specforge_cmd
from eagle_io.interop.specforge import (
    SPECFORGE_KEYS,
    SpecForgeDataset,
    SpecForgeFileError,
    export_specforge,
    import_specforge,
    list_specforge_files,
    normalize_offline_sample,
    specforge_path,
    to_specforge_record,
)


def specforge_normalize():
    """SpecForge's real ``normalize_offline_sample``, or skip."""
    try:
        dist = importlib.metadata.distribution("specforge")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("SpecForge not installed (pip install --no-deps specforge==0.2.0)")
    path = Path(str(dist.locate_file("specforge/algorithms/eagle3/data.py")))
    spec = importlib.util.spec_from_file_location("_specforge_eagle3_data", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.normalize_offline_sample


def specforge_load(path: str) -> dict:
    """How SpecForge opens a feature file (``load_feature_file`` / ``OfflineEagle3Dataset._open_file``)."""
    if path.endswith(".gz"):
        with gzip.open(path, "rb") as f:
            return torch.load(io.BytesIO(f.read()), weights_only=False)
    return torch.load(path, weights_only=False, mmap=True)


def write_like_specforge(root: Path, idx: int, sample: dict, *, compress: bool = False, batch_dim: bool = True):
    """A file as ``prepare_hidden_states.py`` writes it (``_save_tensor_sync`` / ``_get_file_path``)."""
    aux, fin = sample["aux_hidden_states"], sample["hidden_states"]
    rec = {
        "input_ids": sample["input_ids"].clone(),
        "loss_mask": sample["loss_mask"].to(torch.int64),
        "aux_hidden_state": aux.unsqueeze(0) if batch_dim else aux,
        "hidden_state": fin.unsqueeze(0) if batch_dim else fin,
    }
    path = Path(specforge_path(root, idx, gzip=compress))
    path.parent.mkdir(parents=True, exist_ok=True)
    if compress:
        with gzip.open(path, "wb", compresslevel=6) as f:
            torch.save(rec, f)
    else:
        torch.save(rec, path)
    return path


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def assert_same(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert a[k].shape == b[k].shape, k
        assert torch.equal(bits(a[k]), bits(b[k])), k


def stored(root) -> dict[int, dict]:
    ds = eagle_io.Dataset(root)
    return {ds.entry(p).sample_id: ds[p] for p in range(len(ds))}


# --- the per-sample dict ---------------------------------------------------------------------------------


def test_adapter_yields_specforge_training_dict(small_dataset):
    root, samples = small_dataset
    sfd = SpecForgeDataset(root, max_len=2048)
    assert len(sfd) == len(samples)
    for i in range(len(sfd)):
        sid = sfd.dataset.entry(i).sample_id
        s, out = samples[sid], sfd[i]
        n = s["input_ids"].shape[0]
        assert set(out) == {"attention_mask", "loss_mask", "target", "hidden_state", "input_ids"}
        assert out["input_ids"].dtype == torch.int64 and out["input_ids"].shape == (1, n)
        assert out["attention_mask"].dtype == torch.int64 and bool((out["attention_mask"] == 1).all())
        assert out["loss_mask"].dtype == torch.int64 and out["loss_mask"].shape == (1, n)
        # SpecForge's naming swap: hidden_state = aux states, target = final post-norm state.
        assert torch.equal(bits(out["hidden_state"][0]), bits(s["aux_hidden_states"]))
        assert torch.equal(bits(out["target"][0]), bits(s["hidden_states"]))
        expected_mask = s["loss_mask"].to(torch.int64).clone()
        if n:
            expected_mask[-1] = 0
        assert torch.equal(out["loss_mask"][0], expected_mask)


def test_adapter_truncates_like_specforge(small_dataset):
    root, _ = small_dataset
    sfd = SpecForgeDataset(root, max_len=3)
    for i in range(len(sfd)):
        out = sfd[i]
        n = min(3, sfd.dataset.entry(i).n_tokens)
        assert out["input_ids"].shape == (1, n) and out["hidden_state"].shape == (1, n, 96)
        if n:
            assert int(out["loss_mask"][0, -1]) == 0


@pytest.mark.parametrize("max_len", [2048, 7])
def test_adapter_equals_specforge_own_function_on_its_files(small_dataset, tmp_path, max_len):
    """Same samples, two routes: eagle-io shards -> adapter, and SpecForge files -> SpecForge's function."""
    sf_normalize = specforge_normalize()
    root, _ = small_dataset
    export_specforge(root, tmp_path / "sf")
    sfd = SpecForgeDataset(root, max_len=max_len)
    for i in range(len(sfd)):
        sid = sfd.dataset.entry(i).sample_id
        raw = specforge_load(specforge_path(tmp_path / "sf", sid))
        theirs = sf_normalize(raw, max_len)
        assert_same(sfd[i], theirs)
        assert_same(normalize_offline_sample(raw, max_len), theirs)


def test_record_matches_the_files_specforge_writes(small_dataset, tmp_path):
    root, samples = small_dataset
    ds = eagle_io.Dataset(root)
    for p in range(len(ds)):
        sid = ds.entry(p).sample_id
        path = write_like_specforge(tmp_path, sid, samples[sid])
        assert_same(to_specforge_record(ds[p]), specforge_load(str(path)))
        assert tuple(specforge_load(str(path))) == SPECFORGE_KEYS


# --- export / import ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("compress", [False, True])
def test_export_import_round_trip_is_bit_exact(small_dataset, tmp_path, compress):
    root, samples = small_dataset
    res = export_specforge(root, tmp_path / "sf", gzip=compress)
    assert res["files"] == len(samples)
    suffix = ".ckpt.gz" if compress else ".ckpt"
    for sid in samples:
        assert (tmp_path / "sf" / "rows_0-2000" / f"data_{sid}{suffix}").is_file()
        raw = specforge_load(str(tmp_path / "sf" / "rows_0-2000" / f"data_{sid}{suffix}"))
        assert raw["loss_mask"].dtype == torch.int64 and raw["aux_hidden_state"].shape[0] == 1
    summary = import_specforge(tmp_path / "sf", tmp_path / "back", threads=1)
    assert summary.imported == len(samples) and summary.skipped == []
    assert summary.gzip_files == (len(samples) if compress else 0)
    assert (summary.hidden_size, summary.num_aux_layers, summary.dtype) == (32, 3, "bfloat16")
    back = stored(tmp_path / "back")
    assert set(back) == set(samples)
    for sid, s in samples.items():
        assert_same({k: back[sid][k] for k in s}, s)
    ds = eagle_io.Dataset(tmp_path / "back")
    assert ds.entry(0).key == os.path.join("rows_0-2000", f"data_{ds.entry(0).sample_id}{suffix}")
    assert eagle_io.Dataset.verify(tmp_path / "back") == []
    # ... and out again: the same files' contents.
    export_specforge(tmp_path / "back", tmp_path / "sf2", gzip=compress)
    for sid in samples:
        a = specforge_load(specforge_path(tmp_path / "sf", sid, gzip=compress))
        b = specforge_load(specforge_path(tmp_path / "sf2", sid, gzip=compress))
        assert_same(a, b)


def test_import_of_files_written_like_specforge(tmp_path):
    """Ids past one 2000-file group, gzip and plain mixed, with and without the batch dimension."""
    ids = [0, 7, 1999, 2000, 4711]
    samples = {i: make_sample(i, 3 + i % 9) for i in ids}
    for n, i in enumerate(ids):
        write_like_specforge(tmp_path / "sf", i, samples[i], compress=n % 2 == 1, batch_dim=n != 2)
    assert (tmp_path / "sf" / "rows_4000-6000" / "data_4711.ckpt").is_file()
    files, unnamed = list_specforge_files(tmp_path / "sf")
    assert [i for i, _ in files] == ids and unnamed == []
    meta = {"target_model": {"model_id": "x"}, "aux_layer_ids": [2, 15, 27]}
    s = import_specforge(tmp_path / "sf", tmp_path / "ds", metadata=meta, threads=1)
    assert s.imported == 5 and s.gzip_files == 2
    ds = eagle_io.Dataset(tmp_path / "ds")
    assert [ds.entry(p).sample_id for p in range(len(ds))] == ids
    assert ds.metadata["aux_layer_ids"] == [2, 15, 27] and ds.metadata["hidden_states_post_norm"] is True
    assert ds.metadata["aux_layer_convention"].startswith("input of 0-based decoder layer i")
    for p, i in enumerate(ids):
        assert_same({k: ds[p][k] for k in samples[i]}, samples[i])


def test_export_refuses_to_overwrite(small_dataset, tmp_path):
    root, _ = small_dataset
    export_specforge(root, tmp_path / "sf")
    with pytest.raises(eagle_io.InvalidArgumentError, match=r"data_\d+\.ckpt exists"):
        export_specforge(root, tmp_path / "sf", gzip=True)  # the .ckpt twin exists
    export_specforge(root, tmp_path / "sf", gzip=True, overwrite=True)
    files, _ = list_specforge_files(tmp_path / "sf")
    assert all(p.endswith(".ckpt.gz") for _, p in files)


# --- verification: bad files are errors naming the file, or skipped and counted --------------------------


def _good_dir(tmp_path: Path, n: int = 4) -> Path:
    for i in range(n):
        write_like_specforge(tmp_path / "sf", i, make_sample(100 + i, 6))
    return tmp_path / "sf"


def _corruptions(sf: Path) -> dict[str, Path]:
    """One bad file per kind; returns {kind: path}."""
    out = {}
    p = Path(specforge_path(sf, 10))
    p.write_bytes(Path(specforge_path(sf, 0)).read_bytes()[:300])  # truncated zip
    out["truncated"] = p
    s = make_sample(11, 6)
    p = write_like_specforge(sf, 11, s, compress=True)
    blob = bytearray(p.read_bytes())
    blob[len(blob) // 2] ^= 0xFF  # deflate data or CRC now wrong
    p.write_bytes(bytes(blob))
    out["gzip"] = p
    s = make_sample(12, 6)
    s["aux_hidden_states"] = s["aux_hidden_states"][:5]
    out["length"] = write_like_specforge(sf, 12, s)
    s = make_sample(13, 6)
    s["loss_mask"] = torch.full((6,), 2, dtype=torch.uint8)
    out["mask"] = write_like_specforge(sf, 13, s)
    s = make_sample(14, 6)
    s["hidden_states"][2, 3] = float("nan")
    out["nan"] = write_like_specforge(sf, 14, s)
    s = make_sample(15, 6, hidden=16)
    out["layout"] = write_like_specforge(sf, 15, s)
    p = Path(specforge_path(sf, 16))
    torch.save({"input_ids": torch.zeros(3, dtype=torch.int64)}, p)
    out["keys"] = p
    s = make_sample(17, 6)
    s["hidden_states"] = s["hidden_states"][:, :0]  # a zero-wide final state: was a ZeroDivisionError, unnamed
    out["width0"] = write_like_specforge(sf, 17, s)
    return out


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("truncated", "unreadable"),
        ("gzip", "unreadable"),
        ("length", "does not match"),
        ("mask", "0/1"),
        ("nan", "NaN/Inf values"),
        ("layout", "differs from the dataset"),
        ("keys", "missing keys"),
        ("width0", "not a multiple of hidden_state width 0"),
    ],
)
def test_import_rejects_a_bad_file_naming_it(tmp_path, kind, message):
    sf = _good_dir(tmp_path)
    bad = _corruptions(sf)
    for other, p in bad.items():
        if other != kind:
            p.unlink()
    with pytest.raises(SpecForgeFileError, match=message) as e:
        import_specforge(sf, tmp_path / f"out-{kind}", threads=1)
    assert e.value.path == str(bad[kind]) and str(bad[kind]) in str(e.value)
    # the part written before the bad file is taken back (issue 47): it was left, incomplete, refusing the retry
    assert not (tmp_path / f"out-{kind}").exists()
    bad[kind].unlink()
    assert import_specforge(sf, tmp_path / f"out-{kind}", threads=1).imported == 4


def test_import_skips_and_counts_bad_files_when_asked(tmp_path):
    sf = _good_dir(tmp_path)
    bad = _corruptions(sf)
    (sf / "rows_0-2000" / "notes.ckpt").write_bytes(b"x")
    s = import_specforge(sf, tmp_path / "out", skip_bad=True, threads=1)
    assert s.imported == 4
    assert sorted(p for p, _ in s.skipped) == sorted([*map(str, bad.values()), str(sf / "rows_0-2000" / "notes.ckpt")])
    assert s.to_dict()["skipped"] == len(bad) + 1
    assert len(eagle_io.Dataset(tmp_path / "out")) == 4


def test_import_refuses_duplicate_indexes_and_unnamed_files(tmp_path):
    sf = _good_dir(tmp_path)
    write_like_specforge(sf, 2, make_sample(2, 6), compress=True)
    with pytest.raises(SpecForgeFileError, match=r"sample index 2 also stored in .*data_2\.ckpt"):
        import_specforge(sf, tmp_path / "o1")
    Path(specforge_path(sf, 2, gzip=True)).unlink()
    (sf / "x.ckpt").write_bytes(b"")
    with pytest.raises(SpecForgeFileError, match=r"x\.ckpt: file name is not data_\{idx\}"):
        import_specforge(sf, tmp_path / "o2")


def test_import_of_an_empty_directory_fails(tmp_path):
    (tmp_path / "sf").mkdir()
    with pytest.raises(eagle_io.InvalidArgumentError, match="no importable SpecForge file"):
        import_specforge(tmp_path / "sf", tmp_path / "out")


# --- CLI -------------------------------------------------------------------------------------------------


@pytest.fixture
def cli(monkeypatch):
    from eagle_io import cli as cli_mod

    monkeypatch.setitem(cli_mod.COMMANDS, "import-specforge", specforge_cmd.import_cmd)
    monkeypatch.setitem(cli_mod.COMMANDS, "export-specforge", specforge_cmd.export_cmd)
    return main


def test_cli_export_then_import(small_dataset, tmp_path, cli, capsys):
    root, samples = small_dataset
    assert cli(["export-specforge", str(root), "--out", str(tmp_path / "sf"), "--gzip"]) == 0
    args = ["import-specforge", str(tmp_path / "sf"), "--out", str(tmp_path / "imp"), "--num-layers", "30"]
    assert cli([*args, "--threads", "1"]) == 0
    assert '"imported": 12' in capsys.readouterr().out
    meta = eagle_io.Dataset(tmp_path / "imp").metadata
    assert meta["specforge_aux_layer_ids"] == [1, 14, 26] and meta["aux_layer_ids"] == [2, 15, 27]
    assert set(stored(tmp_path / "imp")) == set(samples)


def test_cli_import_reports_bad_files(tmp_path, cli, capsys):
    sf = _good_dir(tmp_path)
    bad = _corruptions(sf)
    assert cli(["import-specforge", str(sf), "--out", str(tmp_path / "a")]) == 2
    assert "data_10.ckpt" in capsys.readouterr().err
    assert cli(["import-specforge", str(sf), "--out", str(tmp_path / "b"), "--skip-bad"]) == 1
    err = capsys.readouterr().err
    assert all(str(p) in err for p in bad.values())


def test_import_and_the_writer_share_their_defaults_byte_for_byte(tmp_path):
    """One definition of the codec and shard defaults (eagle_io.defaults): the same samples written by
    import-specforge and by a ShardWriter left at its defaults give byte-identical shards."""
    sf = _good_dir(tmp_path, n=4)
    import_specforge(sf, tmp_path / "imported")
    ds = eagle_io.Dataset(tmp_path / "imported")
    with eagle_io.ShardWriter(tmp_path / "written", ds.schema, ds.metadata) as w:
        for p in range(len(ds)):
            e = ds.entry(p)
            item = ds[p]
            w.write(e.sample_id, {s.name: item[s.name] for s in ds.schema}, key=e.key)
    shards = sorted((tmp_path / "imported" / "shards").iterdir())
    assert [s.name for s in shards] == [s.name for s in sorted((tmp_path / "written" / "shards").iterdir())]
    for s in shards:
        assert s.read_bytes() == (tmp_path / "written" / "shards" / s.name).read_bytes(), s.name
    assert ds.manifest["codec"]["zstd_level"] == defaults.ZSTD_LEVEL == -1000


def test_export_writes_the_vocab_mapping_specforge_loads(tmp_path, cli):
    """``export-specforge --draft-vocab-size`` writes ``vocab_mapping/vocab_mapping.pt``: `eagle-io vocab-map`'s
    mapping, loaded by SpecForge's own ``Eagle3DraftModel.load_vocab_mapping`` (``model.vocab_mapping_path``)."""
    pytest.importorskip("specforge", reason="SpecForge not installed (pip install --no-deps specforge==0.2.0)")
    from specforge.modeling.draft.base import Eagle3DraftModel

    samples = {i: make_sample(i, 30) for i in range(6)}
    with eagle_io.ShardWriter(tmp_path / "ds", eagle_io.eagle3_schema(32), {"vocab_size": 49152}, threads=1) as w:
        for sid, s in samples.items():
            w.write(sid, s)
    args = ["export-specforge", str(tmp_path / "ds"), "--out", str(tmp_path / "sf"), "--draft-vocab-size", "100"]
    assert cli(args) == 0
    assert cli(["vocab-map", str(tmp_path / "ds"), "--draft-vocab-size", "100", "--out", str(tmp_path / "v.pt")]) == 0
    draft = types.SimpleNamespace(d2t=torch.zeros(100, dtype=torch.int64), t2d=torch.zeros(49152, dtype=torch.bool))
    Eagle3DraftModel.load_vocab_mapping(draft, str(tmp_path / "sf" / "vocab_mapping" / "vocab_mapping.pt"))
    theirs = torch.load(tmp_path / "v.pt", weights_only=True)
    assert torch.equal(draft.d2t, theirs["d2t"]) and torch.equal(draft.t2d, theirs["t2d"])
    masked = torch.cat([s["input_ids"][s["loss_mask"] == 1] for s in samples.values()])
    top = int(torch.bincount(masked).argmax())
    assert int(draft.t2d.sum()) == 100 and bool(draft.t2d[top]) and masked.unique().numel() > 100
    files, _ = list_specforge_files(tmp_path / "sf")
    assert len(files) == 6  # the mapping is not taken for a feature file
