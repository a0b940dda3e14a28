"""Progress bars with totals on the long commands (verify, export/import-specforge, vocab-map, merge), written to
stderr so stdout stays parseable, and the cheap record count behind generate's total."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
from helpers.bars import final_bar
from tqdm import tqdm

from eagle_io.cli import main
from eagle_io.cli.progress import process_read_bytes
from eagle_io.data.sources import count_records
from eagle_io.errors import StorageError

FIXTURE = "fixtures/data/sharegpt_real_slice.json"


def test_verify_bar_counts_the_shard_bytes(small_dataset, capsys):
    root, _ = small_dataset
    total = sum(s["bytes"] for s in json.loads((root / "manifest.json").read_text())["shards"])
    assert main(["verify", str(root)]) == 0
    out, err = capsys.readouterr()
    size = tqdm.format_sizeof(total)
    assert final_bar(err, "verify").startswith(f"verify: 100%|██████████| {size}/{size}")
    assert out.startswith("OK 12 samples in 3 shard(s) verified\nvalues    12 samples, ")
    assert process_read_bytes() > total  # this process read the shards (the bar's source)


def test_specforge_vocab_and_merge_bars_show_totals(small_dataset, tmp_path, capsys):
    root, samples = small_dataset
    n = len(samples)
    assert main(["export-specforge", str(root), "--out", str(tmp_path / "sf")]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["files"] == n and f"| {n}/{n} [" in final_bar(err, "export")
    assert main(["import-specforge", str(tmp_path / "sf"), "--out", str(tmp_path / "back")]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["imported"] == n and f"| {n}/{n} [" in final_bar(err, "import")
    vocab = ["vocab-map", str(root), "--draft-vocab-size", "64", "--target-vocab-size", "49152"]
    assert main([*vocab, "--out", str(tmp_path / "v.safetensors")]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["dataset_samples"] == n and f"| {n}/{n} [" in final_bar(err, "count tokens")
    assert main(["merge", str(root), "--expect-records", "40", "--json"]) == 1  # ids 1, 4, ... 34 of 0..39
    out, err = capsys.readouterr()
    assert len(json.loads(out)["missing"]) == 40 - n and f"| {n}/{n} [" in final_bar(err, "audit ranks")


def test_count_records_matches_the_file_and_stops_at_limit(tmp_path):
    records = json.loads(Path(FIXTURE).read_text())
    assert count_records(FIXTURE) == len(records) == 21
    assert count_records(FIXTURE, 5) == 5 and count_records(FIXTURE, 500) == 21
    lines = tmp_path / "r.jsonl"
    lines.write_text("\n".join(json.dumps(r) for r in records[:7]) + "\n\n{not json\n")
    assert count_records(lines) == 8  # the malformed line is a record (generate counts it as skipped)
    with pytest.raises(StorageError, match=r"cannot read the dataset .*missing\.json: No such file") as e:
        count_records(tmp_path / "missing.json")
    assert e.value.errno == errno.ENOENT


def test_off_a_terminal_each_progress_state_is_a_full_line_at_the_interval_from_defaults(monkeypatch, capsys):
    from eagle_io import defaults
    from eagle_io.cli import progress

    assert defaults.PROGRESS_LOG_S == 30.0  # the Rust core's default (src/python/mod.rs)
    monkeypatch.setattr(defaults, "PROGRESS_LOG_S", 0.0)  # every update draws
    b = progress.bar(4, "record", "capture")
    for _ in range(4):
        b.update(1)
    b.close()
    err = capsys.readouterr().err
    assert "\r" not in err, repr(err)
    lines = err.splitlines()
    states = [line.split("|")[0] for line in lines]
    assert states == [f"capture: {p:3d}%" for p in (0, 25, 50, 75, 100, 100)], lines
    assert all(line.endswith("]") and " 4/4 " in lines[-1] for line in lines), lines
