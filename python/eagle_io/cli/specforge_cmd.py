"""SpecForge interop: `import-specforge` (its .ckpt/.ckpt.gz files into verified shards),
`export-specforge` (shards into its rows_*/data_{idx}.ckpt layout) and `specforge-train` (SpecForge's own
`specforge train` reading the shards, no export). This module exposes three subcommands: :data:`import_cmd`,
:data:`export_cmd` and :data:`train_cmd`."""

from __future__ import annotations

import argparse
import json
import sys
from types import SimpleNamespace

from .. import defaults
from .io_paths import check_output
from .layer_ids_arg import layer_ids_arg
from .progress import callback


def _import_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", help="SpecForge offline output directory (rows_*/data_{idx}.ckpt[.gz])")
    p.add_argument("--out", required=True, help="new eagle-io dataset directory")
    p.add_argument("--skip-bad", action="store_true", help="count and list bad files instead of failing on the first")
    p.add_argument("--num-layers", type=int, help="target decoder layers N (records SpecForge's default aux layers)")
    p.add_argument(
        "--specforge-aux-layer-ids",
        type=layer_ids_arg,
        help="comma-separated ids as given to SpecForge (SGLang's set_eagle3_layers_to_capture; default "
        "[1, N//2-1, N-4]); stored as the eagle-io ids the target's setter captures (Llama: +1); needs --num-layers",
    )
    p.add_argument(
        "--target-architecture",
        help="the target's architecture, whose SGLang setter rule maps SpecForge's ids (default: LlamaForCausalLM's "
        "rule, which most models share); recorded in the metadata when given",
    )
    p.add_argument("--target-model", help="target model name, recorded in the metadata")
    p.add_argument("--vocab-size", type=int, help="target vocabulary size, recorded in the metadata")
    p.add_argument("--shard-bytes", type=int, default=defaults.SHARD_BYTES, help="shard size (bytes)")
    p.add_argument("--threads", type=int, default=defaults.THREADS, help="encoding threads (0 = one per CPU)")
    p.add_argument("--summary-json", help="also write the summary here")


def _import_run(args: argparse.Namespace) -> int:
    from ..errors import InvalidArgumentError
    from ..interop.specforge import import_specforge
    from ..sglang.setters import final_boundary_allowed, from_specforge

    check_output("--out", args.out, directory=True, makes_parents=True)
    check_output("--summary-json", args.summary_json, directory=False, makes_parents=False)
    from ..store.eagle3 import validate_aux_layer_ids

    meta: dict = {}
    if args.target_model:
        meta["target_model"] = {"model_id": args.target_model}
    if args.vocab_size:
        meta["vocab_size"] = args.vocab_size
    if args.num_layers:
        meta["num_layers"] = args.num_layers
    n = args.num_layers
    if args.specforge_aux_layer_ids and not n:
        raise InvalidArgumentError("--specforge-aux-layer-ids needs --num-layers (the target's decoder layers)")
    if args.specforge_aux_layer_ids:
        sf_ids, what = args.specforge_aux_layer_ids, "--specforge-aux-layer-ids"
    elif n:
        sf_ids, what = [1, n // 2 - 1, n - 4], f"SpecForge's default [1, N//2-1, N-4] for N = {n}"
    else:
        sf_ids = None
    if sf_ids is not None:
        arch = args.target_architecture or "LlamaForCausalLM"
        ids = from_specforge(sf_ids, arch, n)
        try:  # the layers SGLang's setter captured for SpecForge must be layers of the target
            validate_aux_layer_ids(ids, n, final_boundary=final_boundary_allowed(arch, n))
        except InvalidArgumentError as e:
            raise InvalidArgumentError(
                f"{what} = {sf_ids} are captured by SGLang's {arch} setter as eagle-io ids {ids}, which a {n}-layer "
                f"target cannot provide: {e}"
            ) from e
        meta["aux_layer_ids"] = ids
        meta["specforge_aux_layer_ids"] = sf_ids
        if args.target_architecture:
            meta["target_model"] = {**meta.get("target_model", {}), "architecture": arch}
    with callback("file", "import") as progress:
        summary = import_specforge(
            args.dir,
            args.out,
            metadata=meta,
            skip_bad=args.skip_bad,
            shard_bytes=args.shard_bytes,
            threads=args.threads,
            progress=progress,
        )
    out = summary.to_dict()
    for path, reason in summary.skipped:
        print(f"skipped   {path}: {reason}", file=sys.stderr)
    print(json.dumps({k: v for k, v in out.items() if k != "skipped_files"}, indent=2))
    if args.summary_json:
        with open(args.summary_json, "w") as f:
            json.dump(out, f, indent=2)
    return 1 if summary.skipped else 0


def _export_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="eagle-io dataset (directory or manifest)")
    p.add_argument("--out", required=True, help="output directory (SpecForge's --train-hidden-states-path)")
    p.add_argument("--gzip", action="store_true", help="write .ckpt.gz (gzip level 6, SpecForge's --compress)")
    p.add_argument("--overwrite", action="store_true", help="replace existing data_{idx}.ckpt[.gz] files")
    p.add_argument(
        "--draft-vocab-size",
        type=int,
        help="also write vocab_mapping/vocab_mapping.pt (eagle-io vocab-map's mapping) for SpecForge's "
        "model.vocab_mapping_path",
    )


def _export_run(args: argparse.Namespace) -> int:
    from ..interop.specforge import export_specforge

    check_output("--out", args.out, directory=True, makes_parents=True)
    with callback("file", "export") as progress:
        res = export_specforge(
            args.path,
            args.out,
            gzip=args.gzip,
            overwrite=args.overwrite,
            draft_vocab_size=args.draft_vocab_size,
            progress=progress,
        )
    print(json.dumps(res, indent=2))
    return 0


import_cmd = SimpleNamespace(
    __doc__="Import SpecForge offline EAGLE-3 files (.ckpt/.ckpt.gz) into verified eagle-io shards.",
    add_parser=_import_parser,
    run=_import_run,
)
export_cmd = SimpleNamespace(
    __doc__="Export an eagle-io dataset as SpecForge offline EAGLE-3 files (rows_*/data_{idx}.ckpt[.gz]).",
    add_parser=_export_parser,
    run=_export_run,
)


def _train_parser(p: argparse.ArgumentParser) -> None:
    # `specforge train`'s own options (specforge/cli.py, 0.2.0), passed on unchanged.
    p.add_argument(
        "-c",
        "--config",
        required=True,
        help="SpecForge's YAML/JSON run config; data.hidden_states_path "
        "(and data.eval_hidden_states_path) may name an eagle-io dataset",
    )
    p.add_argument("--role", help="SpecForge's launch role (auto, all, producer, consumer, both)")
    p.add_argument("--node-rank", type=int, help="SpecForge's node-local rank for a multi-node launch")
    p.add_argument("--plan", action="store_true", help="print SpecForge's process plan without starting workers")
    p.add_argument("overrides", nargs="*", help="SpecForge's dotted overrides, e.g. training.learning_rate=1e-4")


def _train_run(args: argparse.Namespace) -> int:
    from ..interop.specforge_train import main

    argv = ["--config", args.config]
    argv += ["--role", args.role] if args.role else []
    argv += ["--node-rank", str(args.node_rank)] if args.node_rank is not None else []
    argv += ["--plan"] if args.plan else []
    return main([*argv, *args.overrides])


train_cmd = SimpleNamespace(
    __doc__="Run SpecForge 0.2.0's `specforge train` with eagle-io datasets read in place (no export).",
    add_parser=_train_parser,
    run=_train_run,
)
