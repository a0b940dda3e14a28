"""The whole ``specforge train`` run on an eagle-io dataset with no export (issue 31, item 3), beside the same run on
``export-specforge`` output of that dataset: SpecForge 0.2.0's own CLI, FSDP trainer, Triton loss and checkpoint.

A tiny random Llama target (tests/helpers/tiny_model.py: hidden 32, 8 layers) captures the real ShareGPT slice of
the tests (21 records, 14 samples; ``eagle-io generate``, aux layers [2, 4, 5]) twice, bf16 and ``--precision fp8``.
For each dataset: ``eagle-io vocab-map`` (draft vocabulary 256), ``eagle-io export-specforge``, then two runs from one
config (3 epochs of 7 batches of 2, sdpa, TTT 3) that differ only in ``data.hidden_states_path``:
``python -m eagle_io.interop.specforge_train`` on the dataset and ``python -m specforge.cli train`` on the export.
Same seed, same sampler, so the same batches: the per-step metrics SpecForge prints (``step N: {...}``) and the
saved training states are compared. On a CPU-only machine both runs stop at the same place, SpecForge's FSDP wrap
(``RuntimeError: FSDP needs a non-CPU accelerator device``), after its config, distributed init (gloo), model
bundle, reader, store and loader.

Writes ``OUT/specforge_train.json`` (per run: exit code, seconds, steps logged, first/last loss; per pair: the
largest metric and checkpoint differences) and one log per run. Exit code 0 when every run trained all its steps.
Usage: python benches/gpu/specforge_train_case.py OUT [--max-steps 16]
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402
from helpers.tiny_model import FIXTURE, build_tiny_model_dir  # noqa: E402

from eagle_io.cli import main as eagle_io  # noqa: E402

DRAFT_VOCAB = 256
STEP = re.compile(r"^step (\d+): (\{.*\})$", re.M)


def draft_config(target: Path, out: Path) -> Path:
    """SpecForge's LlamaForCausalLMEagle3 config for ``target``: one layer, a draft vocabulary of DRAFT_VOCAB."""
    cfg = json.loads((target / "config.json").read_text())
    keep = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size")
    keep += ("max_position_embeddings", "rms_norm_eps", "rope_theta", "hidden_act", "head_dim")
    draft = {k: cfg[k] for k in keep if k in cfg}
    draft.update(
        architectures=["LlamaForCausalLMEagle3"],
        model_type="llama",
        num_hidden_layers=1,
        draft_vocab_size=DRAFT_VOCAB,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    out.write_text(json.dumps(draft, indent=1))
    return out


def run(name: str, argv: list[str], res: Path) -> dict:
    t0 = time.monotonic()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    (res / f"specforge_train.{name}.log").write_text(p.stdout + "\n--- stderr ---\n" + p.stderr)
    steps = {int(m.group(1)): ast.literal_eval(m.group(2)) for m in STEP.finditer(p.stdout)}
    losses = [v.get("loss") for _, v in sorted(steps.items()) if isinstance(v.get("loss"), float)]
    return {
        "rc": p.returncode,
        "seconds": round(time.monotonic() - t0, 1),
        "steps_logged": len(steps),
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "tail": (p.stdout + p.stderr)[-1500:] if p.returncode else "",
        "_steps": steps,
    }


def leaves(obj, prefix=""):
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from leaves(v, f"{prefix}/{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from leaves(v, f"{prefix}/{i}")


def checkpoint_diff(a: Path, b: Path) -> dict:
    """The largest difference between the tensors of the two runs' last saved training states (same key paths)."""
    found = [sorted(d.glob("*-step*/training_state.pt")) for d in (a, b)]
    if not all(found):
        return {"compared": 0, "note": f"no checkpoint in {a if not found[0] else b}"}
    sa, sb = (dict(leaves(torch.load(f[-1], map_location="cpu", weights_only=False))) for f in found)
    common = sorted(set(sa) & set(sb))
    worst, name = 0.0, None
    for k in common:
        x, y = sa[k], sb[k]
        if x.shape != y.shape or x.dtype != y.dtype:
            return {"compared": len(common), "differs": k, "shapes": [list(x.shape), list(y.shape)]}
        d = (
            (x.double() - y.double()).abs().max().item()
            if x.numel() and x.is_floating_point()
            else float(not torch.equal(x, y))
        )
        if d > worst:
            worst, name = d, k
    return {"compared": len(common), "only_one_side": len(set(sa) ^ set(sb)), "max_abs_diff": worst, "at": name}


def metric_diff(a: dict, b: dict) -> dict:
    worst = 0.0
    for step in sorted(set(a) & set(b)):
        for k in set(a[step]) & set(b[step]):
            x, y = a[step][k], b[step][k]
            if isinstance(x, float) and isinstance(y, float):
                worst = max(worst, abs(x - y))
    return {"steps_compared": len(set(a) & set(b)), "max_abs_metric_diff": worst}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--max-steps", type=int, default=16)
    ap.add_argument("--precision", nargs="+", default=["bf16", "fp8"], choices=["bf16", "fp8"])
    args = ap.parse_args()
    res = Path(args.out)
    work = Path(tempfile.mkdtemp(prefix="sf-train-"))
    target = build_tiny_model_dir(work / "target")
    # SpecForge's TargetHead reads the head through a sharded checkpoint's index (model.safetensors.index.json).
    from safetensors import safe_open

    with safe_open(str(target / "model.safetensors"), "pt") as f:
        index = {"metadata": {}, "weight_map": dict.fromkeys(f.keys(), "model.safetensors")}
    (target / "model.safetensors.index.json").write_text(json.dumps(index))
    draft = draft_config(target, work / "draft.json")
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    report: dict = {"max_steps": args.max_steps, "cuda": gpu}
    ok = True
    for precision in args.precision:
        ds, sf, vocab = work / f"ds-{precision}", work / f"sf-{precision}", work / f"vocab-{precision}.pt"
        gen = ["generate", "--model", str(target), "--dataset", str(FIXTURE), "--out", str(ds)]
        gen += ["--max-length", "256", "--aux-layer-ids", "2,4,5", "--precision", precision]
        assert eagle_io(gen) == 0, f"generate {precision}"
        assert eagle_io(["vocab-map", str(ds), "--draft-vocab-size", str(DRAFT_VOCAB), "--out", str(vocab)]) == 0
        assert eagle_io(["export-specforge", str(ds), "--out", str(sf)]) == 0
        runs = {}
        for kind, data, entry in (
            ("eagle-io", ds, [sys.executable, "-m", "eagle_io.interop.specforge_train"]),
            ("export", sf, [sys.executable, "-m", "specforge.cli", "train"]),
        ):
            cfg = {
                "model": {
                    "target_model_path": str(target),
                    "draft_model_config": str(draft),
                    "vocab_mapping_path": str(vocab),
                },
                "data": {"hidden_states_path": str(data), "max_length": 256, "dataloader_num_workers": 2},
                "training": {
                    "batch_size": 2,
                    "num_epochs": 3,
                    "max_steps": args.max_steps,
                    "ttt_length": 3,
                    "attention_backend": "sdpa",
                    "learning_rate": 1e-3,
                    "log_interval": 1,
                    "save_interval": args.max_steps,
                    "seed": 0,
                },
                "output_dir": str(work / f"out-{precision}-{kind}"),
            }
            path = work / f"cfg-{precision}-{kind}.json"
            path.write_text(json.dumps(cfg, indent=1))
            runs[kind] = run(f"{precision}.{kind}", [*entry, "--config", str(path)], res)
            ok &= runs[kind]["rc"] == 0 and runs[kind]["steps_logged"] >= args.max_steps
        pair = {
            **metric_diff(runs["eagle-io"]["_steps"], runs["export"]["_steps"]),
            "checkpoint": checkpoint_diff(work / f"out-{precision}-eagle-io", work / f"out-{precision}-export"),
        }
        report[precision] = {"runs": {k: {x: y for x, y in v.items() if x != "_steps"} for k, v in runs.items()}}
        report[precision]["eagle-io vs export"] = pair
        print(json.dumps({precision: report[precision]}, indent=1), flush=True)
    (res / "specforge_train.json").write_text(json.dumps(report, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
