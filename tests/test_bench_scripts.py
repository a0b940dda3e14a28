"""The prepared GPU bench runs: its --smoke mode (tiny widths, CPU) goes through every phase, so the script a lent
GPU machine runs at once cannot rot between device sessions."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benches" / "gpu" / "capture_overhead.py"


def test_capture_overhead_smoke_runs_every_phase_and_verifies(tmp_path):
    spec = importlib.util.spec_from_file_location("capture_overhead", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
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
