"""The bench scripts' smoke modes (tiny data, CPU) go through every phase: the prepared GPU benches, so that the
script a lent GPU machine runs at once cannot rot between device sessions, and the feed benches' honest baselines
(every peer row of benches/bench_loader.py)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import torch

BENCHES = Path(__file__).resolve().parent.parent / "benches"


def load(path: Path):
    """The bench script as a module (registered, as its dataclasses need)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = sys.modules[path.stem] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_capture_overhead_smoke_runs_every_phase_and_verifies(tmp_path):
    mod = load(BENCHES / "gpu" / "capture_overhead.py")
    assert mod.main(["--smoke", "--out", str(tmp_path), "--threads", "1"]) == 0
    r = json.loads((tmp_path / "capture_overhead.json").read_text())
    assert r["width"] == {"hidden": 64, "aux_row": 192, "bytes_per_token": 512}
    assert r["verify_bad_records"] == 0 and r["samples_written"] >= 2 * 3 * 2  # two phases, >= 3 batches of 2
    assert r["forward_seconds_per_batch"] > 0 and r["capture_seconds_per_batch"] > 0
    assert 0 < r["sustained_ring_high_water_bytes"] <= r["sustained_ring_capacity"]
    assert r["sustained_ratio"] > 1.0, "bf16 states compress"
    # The FP8 phases: on CPU the writer quantises (the GPU quantises before the copy: fp8_quantized_before_copy).
    assert r["fp8_samples_written"] >= 2 * 3 * 2 and r["fp8_quantized_before_copy"] == 0
    assert r["fp8_values"] == r["fp8_samples_written"] * 32 * 4 * 64 and r["fp8_clamped"] == 0
    assert r["fp8_sustained_ratio_vs_bf16"] > 1.9


def test_feed_gpu_smoke_runs_every_path_cold_and_warm(tmp_path):
    mod = load(BENCHES / "gpu" / "feed_gpu.py")
    assert mod.main(["--smoke", "--out", str(tmp_path)]) == 0
    r = json.loads((tmp_path / "feed_gpu.json").read_text())
    paths = {(row["path"], row["phase"]) for row in r["rows"]}
    assert paths == {(p, ph) for p in ("eagle-io Loader", "eagle-io DataLoader", "SpecForge DataLoader")
                     for ph in ("cold", "warm")}  # fmt: skip
    for row in r["rows"]:
        assert row["gb"] > row["state_gb"] > 0 and row["wall_s"] > 0 and row["cpu_s"] > 0, row


def test_bench_loader_smoke_measures_every_baseline_row(tmp_path, monkeypatch):
    """Every row of the honest comparison runs (torch at 1 and 2 threads, persistent workers, the Loader), on the
    same batches: each pass checks it delivered every token."""
    monkeypatch.syspath_prepend(str(BENCHES))
    mod = load(BENCHES / "bench_loader.py")
    mod.main(["--smoke", "--work", str(tmp_path)])
    r = json.loads((tmp_path / "results.json").read_text())
    assert [row["key"] for row in r["rows"]] == [row.key for row in mod.ROWS]
    assert {row.torch_threads for row in mod.ROWS} == {1, 2} and {row.workers for row in mod.ROWS} == {0, 2}
    for row in r["rows"]:
        (figures,) = row["rounds"]
        assert all(figures[k] > 0 for k in ("cold", "cold_cpu", "warm", "warm_cpu")), row
    assert torch.get_num_threads() == 1, "each row restores the 1-thread setting"
