"""``eagle-io generate``'s look at its ``--out`` before the target is loaded: a dataset already there is continued
only with ``--resume`` and the options it was captured with (its manifest metadata and schema), so a run that
cannot continue it stops in a second, saying what differs and what to do, instead of after loading the model
(where the writer refuses it with the same :class:`~eagle_io.errors.IncompatibleDatasetError`)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from .._native import __version__
from ..errors import IncompatibleDatasetError, InvalidArgumentError
from ..store import layout
from ..store.manifest import read_manifest
from ..store.schema import precision_name

RESUME_HINT = (
    "rerun with the options it was captured with to continue it, or write a new dataset elsewhere with --out DIR "
    "(make generate OUT=DIR)"
)
"""The way out of a capture that cannot be resumed, ending each such error of ``eagle-io generate``."""


def _stored_precision(manifest: dict[str, Any]) -> str | None:
    """The storage precision of the manifest's states (None: lossless, or a schema of another shape)."""
    schema = manifest.get("schema")
    tensors = schema.get("tensors") if isinstance(schema, dict) else None
    for t in tensors if isinstance(tensors, list) else []:
        precision = t.get("precision") if isinstance(t, dict) else None
        storage = precision.get("storage") if isinstance(precision, dict) else None
        if storage:
            return storage
    return None


def _layer_ids(ids: Any) -> str:
    """``--aux-layer-ids``' spelling of a layer id list (anything else as it is stored)."""
    return ",".join(map(str, ids)) if isinstance(ids, list) else repr(ids)


def differences(args: argparse.Namespace, dataset: str, manifest: dict[str, Any]) -> list[str]:
    """The options of this run (``args``, ``dataset`` the source file) that differ from those ``manifest``'s capture
    was made with, each as ``"--option THEN (this run: NOW)"``; only what is known before the target is loaded
    (the target by its file or directory name; its tokenizer and layer count are compared by the writer after
    loading)."""
    meta = manifest.get("metadata") or {}
    out = []

    def compare(option: str, then: Any, now: Any) -> None:
        if then != now:
            out.append(f"{option} {then} (this run: {now})")

    target = meta.get("target_model")
    if isinstance(target, dict) and "model_id" in target and args.backend == "server":
        compare("--server serving", target["model_id"], args.server_facts[0].target_info["model_id"])
    elif isinstance(target, dict) and "model_id" in target:
        from ..capturing.models import default_gguf_path

        model = Path(args.model).expanduser().resolve() if args.model else default_gguf_path()
        compare("--model", target["model_id"], model.name)  # the .gguf file's or the HF directory's name
    if "max_length" in meta:
        compare("--max-length", meta["max_length"], args.max_length)
    if "source_dataset" in meta:
        compare("--dataset", meta["source_dataset"], os.path.basename(dataset))
    if args.backend == "hf" and "world_size" in meta:
        compare("--world-size", meta["world_size"], args.world_size)
    if args.aux_layer_ids is not None and "aux_layer_ids" in meta:
        compare("--aux-layer-ids", _layer_ids(meta["aux_layer_ids"]), _layer_ids(list(args.aux_layer_ids)))
    regen = meta.get("regenerated") if isinstance(meta.get("regenerated"), dict) else None
    if bool(regen) != bool(getattr(args, "regenerate", False)):
        then, now = ("--regenerate", "without it") if regen else ("no --regenerate", "--regenerate")
        out.append(f"{then} (this run: {now})")
    elif regen:
        compare("--max-new-tokens", regen.get("max_new_tokens"), args.max_new_tokens)
        compare("--temperature", regen.get("temperature"), args.temperature)
    then_p, now_p = _stored_precision(manifest), precision_name(args.precision)
    if then_p != now_p:
        out.append(f"--precision {'fp8' if then_p else 'bf16'} (this run: {'fp8' if now_p else 'bf16'})")
    writer = meta.get("eagle_io_format_writer")
    if writer is not None and writer != f"eagle-io {__version__}":
        out.append(f"written by {writer} (this is eagle-io {__version__})")
    return out


def check_out_dir(args: argparse.Namespace, dataset: str) -> None:
    """Refuses ``args.out`` when it holds this writer's capture that this run cannot continue; a missing or empty
    directory passes. Reads only the manifest (``args.out`` local: a staging directory for an s3:// run).

    Raises:
        InvalidArgumentError: the directory holds a capture and ``--resume`` is not given.
        IncompatibleDatasetError: ``--resume`` with options that differ from the capture's (each listed, then the
            two ways out: the same options, or another ``--out`` / ``make generate OUT=DIR``).
        CorruptRecordError, FormatVersionError, StorageError: the manifest there does not read.
    """
    if args.backend in ("sglang", "server"):
        names = [p.name for p in layout.dataset_manifests(args.out)]
    else:
        names = [layout.manifest_name(args.rank, args.world_size)]
    paths = [os.path.join(args.out, n) for n in names if os.path.isfile(os.path.join(args.out, n))]
    if not paths:
        return
    if not args.resume:
        raise InvalidArgumentError(
            f"{args.out} already holds a capture ({paths[0]}): pass --resume to continue it, or write the new one "
            "elsewhere with --out DIR (make generate OUT=DIR)"
        )
    diffs = differences(args, dataset, read_manifest(paths[0]))
    if diffs:
        raise IncompatibleDatasetError(
            f"{paths[0]}: cannot resume: that capture was made with " + "; ".join(diffs) + f": {RESUME_HINT}"
        )
