"""vLLM speculators interop: `import-speculators` (its hs_{i}.safetensors files into verified shards) and
`export-speculators` (shards into that layout). This module exposes two subcommands: :data:`import_cmd` and
:data:`export_cmd`."""

from __future__ import annotations

import argparse
import json
import os
from types import SimpleNamespace

from .. import defaults
from .io_paths import check_output
from .layer_ids_arg import layer_ids_arg
from .progress import callback


def _import_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", help="speculators hidden-states directory (hs_{i}.safetensors)")
    p.add_argument("--out", required=True, help="new eagle-io dataset directory")
    masks = p.add_mutually_exclusive_group(required=True)
    masks.add_argument(
        "--preprocessed",
        help="speculators' preprocessed dataset (datasets.save_to_disk, columns input_ids and loss_mask): the "
        "loss masks, row i for hs_i (needs the `datasets` package)",
    )
    masks.add_argument("--all-ones-loss-mask", action="store_true", help="store a loss mask of ones (recorded)")
    p.add_argument(
        "--target",
        help="target HF checkpoint directory: its final RMSNorm (model.norm.weight, rms_norm_eps) computes the "
        "post-norm hidden_states eagle-io's trainer reads",
    )
    p.add_argument(
        "--aux-layer-ids",
        type=layer_ids_arg,
        help="comma-separated layers of the files' aux planes (speculators' --target-layer-ids, same convention); "
        "default with --num-layers or --target: [2, N//2, N-3]. Recorded: train-draft needs them",
    )
    p.add_argument("--num-layers", type=int, help="target decoder layers N (default: --target's num_hidden_layers)")
    p.add_argument(
        "--precision",
        choices=["bf16", "fp8"],
        help="state storage; default: the files' (hs-connectors FP8 files stay FP8, bit-exact; bf16 files stay bf16)",
    )
    p.add_argument("--shard-bytes", type=int, default=defaults.SHARD_BYTES, help="shard size (bytes)")
    p.add_argument("--threads", type=int, default=defaults.THREADS, help="encoding threads (0 = one per CPU)")


def _preprocessed_masks(path: str):
    """``loss_masks(idx, token_ids)`` from speculators' preprocessed dataset, checking its input_ids."""
    import torch

    from ..errors import InvalidArgumentError, MissingDataPackageError

    try:
        from datasets import load_from_disk
    except ImportError as e:
        raise MissingDataPackageError("datasets", f"--preprocessed reads {path} with it") from e
    data = load_from_disk(path)

    def masks(idx: int, token_ids: torch.Tensor) -> torch.Tensor:
        if idx >= len(data):
            raise InvalidArgumentError(f"{path}: no row {idx} (it has {len(data)}) for hs_{idx}.safetensors")
        row = data[idx]
        if list(row["input_ids"]) != token_ids.tolist():
            raise InvalidArgumentError(f"{path}: row {idx}'s input_ids differ from hs_{idx}.safetensors' token_ids")
        return torch.as_tensor(row["loss_mask"])

    return masks


def _target_config(path: str) -> dict:
    """The target checkpoint's ``config.json`` (already read by TargetNorm.from_checkpoint, so it parses)."""
    with open(os.path.join(path, "config.json")) as f:
        return json.load(f)


def _import_run(args: argparse.Namespace) -> int:
    from ..interop.speculators import TargetNorm, import_speculators

    check_output("--out", args.out, directory=True, makes_parents=True)
    norm = TargetNorm.from_checkpoint(args.target) if args.target else None
    masks = _preprocessed_masks(args.preprocessed) if args.preprocessed else None
    meta, n = {}, args.num_layers
    if args.target:
        cfg = _target_config(args.target)
        n = n or cfg.get("num_hidden_layers")
        meta = {k: cfg[k] for k in ("vocab_size",) if isinstance(cfg.get(k), int)}
        meta["target_model"] = {"model_id": os.path.basename(os.path.normpath(args.target))}
        if cfg.get("architectures"):
            meta["target_model"]["architecture"] = cfg["architectures"][0]
    with callback("file", "import") as progress:
        summary = import_speculators(
            args.dir,
            args.out,
            loss_masks=masks,
            all_ones_loss_mask=args.all_ones_loss_mask,
            target_norm=norm,
            aux_layer_ids=args.aux_layer_ids,
            num_layers=n,
            metadata=meta,
            precision=args.precision,
            shard_bytes=args.shard_bytes,
            threads=args.threads,
            progress=progress,
        )
    print(json.dumps(summary.to_dict(), indent=2))
    return 0


def _export_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "path",
        help="eagle-io dataset holding the final pre-norm state: captured with --aux-layer-ids 2,N//2,N-3,N, or from "
        "import-speculators",
    )
    p.add_argument("--out", required=True, help="speculators' training directory (speculators train --data-path)")
    p.add_argument(
        "--precision",
        default="bf16",
        choices=["bf16", "fp8"],
        help="fp8: hs-connectors' FP8 files (train with --hidden-states-backend fp8)",
    )
    p.add_argument("--draft-vocab-size", type=int, help="also write d2t-V.npy / t2d-V.npy (speculators' ranking)")
    p.add_argument("--overwrite", action="store_true", help="replace the files of a non-empty --out")


def _export_run(args: argparse.Namespace) -> int:
    from ..interop.speculators import export_speculators

    check_output("--out", args.out, directory=True, makes_parents=True)
    with callback("file", "export") as progress:
        res = export_speculators(
            args.path,
            args.out,
            precision=args.precision,
            draft_vocab_size=args.draft_vocab_size,
            overwrite=args.overwrite,
            progress=progress,
        )
    print(json.dumps(res, indent=2))
    return 0


import_cmd = SimpleNamespace(
    __doc__="Import vLLM speculators hidden-state files (hs_{i}.safetensors) into verified eagle-io shards.",
    add_parser=_import_parser,
    run=_import_run,
)
export_cmd = SimpleNamespace(
    __doc__="Export an eagle-io dataset as vLLM speculators' training directory (hidden states, dataset, vocab).",
    add_parser=_export_parser,
    run=_export_run,
)
