"""The bench scripts' smoke modes (tiny data, CPU) go through every phase: the prepared GPU benches, so that the
script a lent GPU machine runs at once cannot rot between device sessions, and the feed benches' honest baselines
(every peer row of benches/bench_loader.py)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
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


def _pairs_dataset(root, samples: list[tuple[list[int], int]], h: int = 8) -> None:
    """Samples of ``prompt + answer`` token ids, the loss mask over the answer (``(ids, prompt length)`` each)."""
    import eagle_io

    meta = {"hidden_size": h, "vocab_size": 100, "aux_layer_ids": [1, 2, 3], "num_layers": 4}
    with eagle_io.ShardWriter(root, eagle_io.eagle3_schema(h, 3), meta, threads=1) as w:
        for i, (ids, n_prompt) in enumerate(samples):
            mask = torch.zeros(len(ids), dtype=torch.uint8)
            mask[n_prompt:] = 1
            hid = torch.arange(len(ids) * h, dtype=torch.float32).reshape(len(ids), h).bfloat16()
            w.write(i, {"input_ids": torch.tensor(ids), "loss_mask": mask,
                        "aux_hidden_states": torch.cat([hid] * 3, 1), "hidden_states": hid})  # fmt: skip


def test_flywheel_cuts_a_prime_to_the_served_samples_tokens_in_their_order(tmp_path):
    """A' (bench_flywheel): for each served sample, the original answer to its prompt cut after as many supervised
    tokens as the served one holds (all of it when shorter), rows cut with the ids; written in the served order."""
    import eagle_io

    mod = load(BENCHES / "bench_flywheel.py")
    prompts = [{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}, {"input_ids": [6, 7, 8, 9]}]
    _pairs_dataset(tmp_path / "full", [([1, 2, 3, 10, 11, 12, 13, 14], 3), ([4, 5, 20, 21], 2),
                                       ([6, 7, 8, 9, 30, 31, 32], 4)])  # fmt: skip
    # Served in another order: prompt 3 (3 answer tokens), prompt 1 (2), prompt 2 (5: its original answer has 2).
    _pairs_dataset(tmp_path / "B", [([6, 7, 8, 9, 40, 41, 42], 4), ([1, 2, 3, 50, 51], 3),
                                    ([4, 5, 60, 61, 62, 63, 64], 2)])  # fmt: skip
    counts = mod._cut_a_prime(tmp_path / "full", tmp_path / "B", tmp_path / "A_prime", prompts)
    assert counts == {"B_samples": 3, "matched": 3, "B_supervised": 10, "A_prime_supervised": 7, "unmatched": 0}
    cut = eagle_io.Dataset(tmp_path / "A_prime")
    got = [[int(t) for t in cut.read(p)["input_ids"]] for p in range(len(cut))]
    assert got == [[6, 7, 8, 9, 30, 31, 32], [1, 2, 3, 10, 11], [4, 5, 20, 21]]
    first = cut.read(1)
    assert first["hidden_states"].shape == (5, 8) and first["aux_hidden_states"].shape == (5, 24)
    assert float(first["hidden_states"][4, 0]) == 32.0  # row 4 of the original sample, not another
    assert cut.metadata["cut_to_supervised_of"] == str(tmp_path / "B")


def test_flywheel_bootstrap_pools_like_sglang_and_pairs_prompts():
    """SGLang's pooled accept length (sum completion / sum verify) and bootstrap intervals over prompts; the paired
    difference of two drafts with identical counts is exactly 0."""
    from types import SimpleNamespace

    mod = load(BENCHES / "bench_flywheel.py")
    a = SimpleNamespace(completion_tokens=[10, 20, 30, 40], verify_ct=[10, 10, 20, 20], seconds=1.0)
    r = mod._bootstrap(a, 400)
    assert r["pooled"] == 1.6667 and r["verify_ct"] == 60 and r["completion_tokens"] == 100
    assert 1.0 <= r["ci95"][0] <= r["pooled"] <= r["ci95"][1] <= 2.0 and r["ci95"][0] < r["ci95"][1]
    assert mod._paired({"x": a, "y": a}, "x", "y", 200) == [0.0, 0.0]
    b = SimpleNamespace(completion_tokens=[10, 20, 30, 40], verify_ct=[4, 8, 12, 16])  # 2.5 on every prompt
    lo, hi = mod._paired({"x": a, "y": b}, "x", "y", 400)
    assert 0.5 <= lo <= hi <= 1.5  # y: 2.5 on every prompt, x: between 1 and 2


@pytest.mark.slow
def test_flywheel_offline_runs_every_stage_at_tiny_size(tmp_path):
    """benches/gpu/flywheel_offline.py (the loop without SGLang, for a lent device) on this CPU, tiny: A, A', B_offline,
    v0, v1 and v1' (--init-from v0), and the reference decoder's figures of the three (about 4 minutes on 2 cores)."""
    mod = load(BENCHES / "gpu" / "flywheel_offline.py")
    argv = ["--out", str(tmp_path), "--a-records", "6", "--b-records", "8", "--eval-prompts", "2", "--steps", "3"]
    argv += ["--continue-steps", "2", "--answer-tokens", "12", "--eval-tokens", "8", "--max-length", "192"]
    assert mod.main([*argv, "--max-prompt-tokens", "160", "--eval-samples", "1", "--threads", "1"]) == 0
    r = json.loads((tmp_path / "flywheel_offline.json").read_text())
    cut = r["A_prime_cut"]
    assert cut["matched"] == cut["B_samples"] > 0 and 0 < cut["A_prime_supervised"] <= cut["B_supervised"]
    assert r["train"]["v1"]["steps"] == r["train"]["v1_prime"]["steps"] == 2
    for name in ("v0", "v1_prime", "v1"):
        live = r["eval"][name]["live"]
        assert live["lossless"] is True and live["accept_length"] >= 1.0 and live["verify_steps"] > 0
    v0 = json.loads((tmp_path / "v0" / "config.json").read_text())["eagle_io"]
    v1 = json.loads((tmp_path / "v1" / "config.json").read_text())["eagle_io"]
    assert v1["init_from"] == str(tmp_path / "v0") and v1["vocab_map"]["kept_from"] == str(tmp_path / "v0")
    assert "init_from" not in v0


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
