"""A tiny target and an EAGLE-3 draft trained on its own answers, for speculative decoding in a real SGLang engine
(tests/test_sglang_spec.py on CPU, benches/gpu/check_sglang_spec.sh on a GPU): a float32 Llama (hidden 64, 8 layers,
a 1000-token BPE vocabulary, :func:`helpers.tiny_model.build_tiny_model_dir`), its own greedy answers to the first 48
records of the embedded ShareGPT captured (``generate --regenerate``, 35 conversations kept), and a 256-token-vocabulary
draft trained 400 steps with TTT 3 on 27 of them, 8 held out (about 130 s on one thread: offline accept length 2.56
at 3 steps)."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.tiny_model import build_tiny_model_dir

STEPS, NEW_TOKENS, PROMPTS = 3, 48, 8


def _cli(*argv: str) -> None:
    from eagle_io.cli import main

    if main(list(argv)) != 0:
        raise RuntimeError(f"eagle-io {' '.join(argv)} failed")


def build_spec_fixture(root: Path) -> tuple[Path, Path, Path, list[list[int]], list[int]]:
    """``(target dir, dataset, draft dir, prompts, eos ids)`` under ``root``; the prompts are the held-out ones
    ``eval-draft`` decodes live, in its order (at most :data:`PROMPTS`)."""
    from eagle_io.feed import ShardDataset
    from eagle_io.interop.speculation_profile import read_training_samples
    from eagle_io.interop.vocab import dataset_fingerprint
    from eagle_io.spec.evaluate import held_out_positions, live_prompts

    target = build_tiny_model_dir(root / "target", hidden=64, layers=8, vocab=1000)
    ds, draft = root / "ds", root / "draft"
    common = ("--threads", "1", "--max-length", "160")
    _cli(
        *("generate", "--model", str(target), "--limit", "48", "--out", str(ds), "--no-disk-check"),
        *("--skip-bad-records", "--regenerate", "--max-new-tokens", "64", *common),
    )
    _cli(
        *("train-draft", str(ds), "--out", str(draft), "--target-model", str(target), "--steps", "400"),
        *("--eval-samples", str(PROMPTS), "--draft-vocab-size", "256", "--ttt-length", "3", "--lr", "3e-3"),
        *("--warmup-steps", "5", "--accept-steps", str(STEPS), *common),
    )
    data = ShardDataset(ds)
    positions, _ = held_out_positions(data, read_training_samples(draft), dataset_fingerprint(ds))
    prompts, _ = live_prompts(data, positions, PROMPTS)
    if len(prompts) < 4:
        raise RuntimeError(f"only {len(prompts)} held-out prompts in {ds}")
    eos = [int(json.loads((target / "config.json").read_text())["eos_token_id"])]
    return target, ds, draft, prompts, eos


def shared_spec_fixture(tmp_path_factory) -> tuple[Path, Path, Path, list[list[int]], list[int]]:
    """:func:`build_spec_fixture`, built once per test session and shared by every module and pytest-xdist worker
    that asks (under the session's common base directory, behind a file lock): one ~2-minute build, not one per
    module."""
    import fcntl

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if base.name.startswith("popen-gw") else base) / "spec-fixture"
    root.mkdir(exist_ok=True)
    done = root / "fixture.json"
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            target, ds, draft, prompts, eos = build_spec_fixture(root)
            paths = {"target": str(target), "ds": str(ds), "draft": str(draft), "prompts": prompts, "eos": eos}
            done.write_text(json.dumps(paths))
    f = json.loads(done.read_text())
    return Path(f["target"]), Path(f["ds"]), Path(f["draft"]), f["prompts"], f["eos"]
