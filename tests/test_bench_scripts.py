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


def test_gpu_live_overhead_refuses_without_sglang(tmp_path):
    """The lent GPU machines have no SGLang: the script says what it needs and runs nothing."""
    import subprocess

    script = BENCHES / "gpu" / "bench_live_overhead.sh"
    r = subprocess.run(["bash", str(script)], env={"PATH": "/usr/bin:/bin", "PY": "false", "OUT": str(tmp_path)},
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 3, r.stderr
    assert "SGLang is not importable" in r.stderr and "SGLang 0.5.23" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_live_overhead_summary_ratios_and_token_check():
    """Medians over rounds, ratios to the capture-off rows of the same run, and the served-token comparison."""
    mod = load(BENCHES / "bench_live_overhead.py")
    rows = []
    for k, (off, r0, r1) in enumerate([(10.0, 9.0, 8.0), (12.0, 12.0, 6.0), (20.0, 10.0, 7.0)]):
        for s, tps in (("off", off), ("rate0", r0), ("rate1", r1)):
            out = [[1, 2]] if (s, k) != ("rate1", 2) else [[1, 3]]
            rows.append({"round": k, "setting": s, "tokens_per_s": tps, "p50_s": 1 / tps, "p99_s": 2 / tps,
                         "server_cpu_s": 2.0, "output_tokens": 4, "cached_tokens": 0, "close_s": 0.1,
                         "close_cpu_s": 0.1, "outputs": out})  # fmt: skip
    s = mod.summarize(rows)
    med = s["medians"]
    assert med["off"]["tokens_per_s"] == 12.0 and med["rate0"]["tokens_per_s"] == 10.0
    assert med["rate1"]["ratio_tokens_per_s"] == 7.0 / 12.0 and med["rate0"]["ratio_p50"] == (1 / 10) / (1 / 12)
    assert med["rate1"]["server_cpu_ms_per_token"] == 500.0 and med["rate1"]["ratio_server_cpu_per_token"] == 1.0
    assert s["same_tokens_as_off"] == {"off": True, "rate0": True, "rate1": False}
    assert "| rate1 | 7.0 | 0.583 |" in mod.table(s, rows)


def test_shared_prefix_smoke_stores_the_prefix_once_and_reads_the_same_samples(tmp_path):
    mod = load(BENCHES / "bench_shared_prefix.py")
    assert mod.main(["--smoke", "--out", str(tmp_path)]) == 0
    r = json.loads((tmp_path / "shared_prefix.json").read_text())
    assert r["dedup"]["bytes"] < r["whole"]["bytes"] and r["bytes_ratio"] > 1.5, r  # 4 x 50 tokens vs 40 + 4 x 10


def test_shared_prefix_generate_measures_both_runs(tmp_path):
    from helpers.tiny_model import build_tiny_model_dir

    mod = load(BENCHES / "bench_shared_prefix.py")
    model = build_tiny_model_dir(tmp_path / "model")
    argv = ["--generate", "--model", str(model), "--records", "6", "--system-words", "100", "--max-length", "512"]
    assert mod.main([*argv, "--out", str(tmp_path / "run")]) == 0
    r = json.loads((tmp_path / "run" / "shared_prefix_generate.json").read_text())
    n = r["on"]["samples"]  # records whose answer truncation leaves out are skipped alike
    assert r["records"] == 6 and n == r["off"]["samples"] >= 3 and r["bit_identical_samples"] == n, r
    assert len(r["on"]["prefix_records"]) == 1 and r["off"]["prefix_records"] == [], r
    assert r["on"]["bytes"] < r["off"]["bytes"], r
