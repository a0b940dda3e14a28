"""The training side of the serving preflight: what the draft was trained on, from ``--trained-layer-ids``, an
eagle-io dataset manifest, and the ``eagle_io`` record an eagle-io export writes into the draft config; each is
checked against the target and the draft's ``fc``, and the trained layer ids are returned for
:func:`eagle_io.serving.check_layers.check_layer_ids`."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import EagleIOError
from ..sglang.checkpoint import CheckpointError, CheckpointInfo, DraftInfo
from ..store import layout
from ..store.eagle3 import AUX_LAYER_CONVENTION, aux_id_problems, validate_aux_layer_ids
from ..store.manifest import read_manifest
from ..store.target_identity import dataset_target, target_differences
from .findings import ERROR, WARNING, Findings

__all__ = ["trained_layer_ids"]


def _read_manifest(path: str | os.PathLike[str]) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    p = Path(path)
    if p.is_dir():
        found = layout.dataset_manifests(p)
        if not found:
            raise CheckpointError(f"{p}: no manifest.json (or manifest.rNNNNN.json): not an eagle-io dataset", p)
        p = found[0]
    try:
        manifest = read_manifest(p)
    except EagleIOError as e:
        raise CheckpointError(f"{p}: cannot read the dataset manifest: {e}", p) from e
    meta = manifest.get("metadata")
    if not isinstance(meta, dict):
        raise CheckpointError(f"{p}: manifest has no metadata object", p)
    return p, meta, manifest.get("schema") or {}


def _aux_width(schema: dict[str, Any]) -> int | None:
    for t in schema.get("tensors") or ():
        if isinstance(t, dict) and t.get("name") == "aux_hidden_states" and isinstance(t.get("width"), int):
            return int(t["width"])
    return None


def trained_layer_ids(
    out: Findings,
    target: CheckpointInfo,
    draft: DraftInfo,
    *,
    layer_ids: Sequence[int] | None,
    dataset_manifest: str | os.PathLike[str] | None,
) -> list[tuple[str, list[int]]]:
    """Adds the findings about the training data and the draft's eagle-io record; returns ``[(what, ids)]``,
    the eagle-io ids the draft was trained on according to each source.

    Raises:
        InvalidArgumentError / ArgumentTypeError: ``layer_ids`` (the user's ``--trained-layer-ids``) break
            :func:`eagle_io.store.eagle3.validate_aux_layer_ids` for the target (``1 <= id <= N``: id ``N`` is
            a trained layer SGLang may be unable to capture, which is a finding, not an input error).
        CheckpointError: an unreadable dataset manifest.
    """
    n, h_t = target.num_layers, target.hidden_size
    width = draft.fc_in_width
    trained: list[tuple[str, list[int]]] = []
    if layer_ids is not None:
        ids = validate_aux_layer_ids(list(layer_ids), n, final_boundary=True)
        trained.append(("the given training layer ids", ids))
    if dataset_manifest is not None:
        mpath, meta, schema = _read_manifest(dataset_manifest)
        conv, ids = meta.get("aux_layer_convention"), meta.get("aux_layer_ids")
        if conv != AUX_LAYER_CONVENTION:
            out.add(
                WARNING,
                "dataset-convention-unknown",
                f"{mpath}: aux_layer_convention {conv!r} is not eagle-io's ({AUX_LAYER_CONVENTION!r}); its ids are not "
                "compared",
                "compare the layer ids by hand, or regenerate the data with eagle-io",
            )
        elif isinstance(ids, list):
            trained.append((f"the training data {mpath}", [int(i) for i in ids]))
        mh, mn = meta.get("hidden_size"), meta.get("num_layers")
        if isinstance(mh, int) and h_t is not None and mh != h_t:
            out.add(
                ERROR,
                "dataset-hidden-size",
                f"the training data {mpath} has hidden_size {mh} but the target's is {h_t}",
                "serve the draft with the target its training data came from",
            )
        if isinstance(mn, int) and n is not None and mn != n:
            out.add(
                ERROR,
                "dataset-num-layers",
                f"the training data {mpath} came from a {mn}-layer target, this target has {n} layers: the draft "
                "learned the states of other layers than the ones served",
                "serve the draft with the target its training data came from",
            )
        # The rest of the dataset's target record, compared as train-draft and eval-draft compare it
        # (store.target_identity; the width and depth have their own findings above; no file is hashed here).
        served = {"architecture": target.architectures[0] if target.architectures else None,
                  "vocab_size": target.vocab_size}  # fmt: skip
        recorded = {k: v for k, v in dataset_target(meta).items() if k in served}
        for diff in target_differences(recorded, served, allow_other_target=True):
            out.add(
                ERROR,
                "dataset-target",
                f"the training data {mpath} came from another target than this one: {diff}",
                "serve the draft with the target its training data came from",
            )
        aux_w = _aux_width(schema)
        if aux_w is not None and width is not None and aux_w != width:
            out.add(
                ERROR,
                "dataset-aux-width",
                f"the training data {mpath} stores aux states {aux_w} wide but the draft's fc takes {width}: the draft "
                "was not trained on this data",
                "check --dataset (or retrain the draft on it)",
            )
    rec = draft.eagle_io_record
    if rec is not None:
        rec_ids, rec_target = rec.get("aux_layer_ids"), rec.get("target")
        if isinstance(rec_ids, list) and all(isinstance(i, int) for i in rec_ids) and n is not None:
            if aux_id_problems(rec_ids, n, final_boundary=True):
                out.add(
                    ERROR,
                    "draft-trained-target",
                    f"the draft's eagle_io record says it was trained on eagle-io ids {rec_ids}, which a {n}-layer "
                    "target does not have: it was trained for another target",
                    "serve the draft with the target it was trained for",
                )
            else:
                trained.append(("the draft's eagle_io record (eagle-io train-draft)", [int(i) for i in rec_ids]))
        rn = rec_target.get("num_layers") if isinstance(rec_target, dict) else None
        if isinstance(rn, int) and n is not None and rn != n:
            out.add(
                ERROR,
                "draft-trained-target",
                f"the draft was trained for a {rn}-layer target ({rec_target.get('model_id') or 'eagle_io record'}), "
                f"this target has {n} layers: its aux states come from other layers than the ones it learned",
                "serve the draft with the target it was trained for",
            )
    return trained
