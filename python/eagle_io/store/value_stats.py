"""``value_stats.json``: what a capture records beside its manifest when it closes (docs/FORMAT.md section 2.2):
per-layer max |x| of the samples written and the samples each value policy skipped; and the warning a float16
serving target needs when the data's range exceeds float16's."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from .values import block_names

__all__ = ["STATS_FORMAT", "merge_value_stats", "range_warnings", "read_value_stats", "value_stats_path"]

STATS_FORMAT = "eagle-io/value-stats"


def value_stats_path(manifest_path: str | os.PathLike[str]) -> Path:
    """``value_stats.json`` beside ``manifest.json`` (``value_stats.rNNNNN.json`` beside ``manifest.rNNNNN.json``)."""
    p = Path(manifest_path)
    return p.with_name("value_stats" + p.name.removeprefix("manifest"))


def merge_value_stats(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """``new`` value stats combined with those of an earlier run of the same dataset (resume): max of ``absmax``,
    sums of ``samples`` and ``skipped``. ``old`` None (or of another layout) gives ``new``."""
    if not old or old.get("format") != STATS_FORMAT or old.get("aux_layer_ids") != new.get("aux_layer_ids"):
        return new
    out = {**new, "samples": int(old.get("samples", 0)) + int(new.get("samples", 0))}
    out["skipped"] = {k: int((old.get("skipped") or {}).get(k, 0)) + v for k, v in (new.get("skipped") or {}).items()}
    a, b = old.get("absmax"), new.get("absmax")
    if a and b and len(a["aux_hidden_states"]) == len(b["aux_hidden_states"]):
        aux = [max(x, y) for x, y in zip(a["aux_hidden_states"], b["aux_hidden_states"], strict=True)]
        out["absmax"] = {"aux_hidden_states": aux, "hidden_states": max(a["hidden_states"], b["hidden_states"])}
    else:
        out["absmax"] = b or a
    out["source_dtype"] = new.get("source_dtype") or old.get("source_dtype")
    return out


def read_value_stats(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The value stats files of the dataset at ``path`` (a root or a manifest): one dict per manifest that has one
    (docs/FORMAT.md section 2.2), in rank order; [] when none was written."""
    from .layout import dataset_manifests

    out = []
    for m in dataset_manifests(path):
        f = value_stats_path(m)
        if f.is_file():
            out.append(json.loads(f.read_text()))
    return out


def range_warnings(path: str | os.PathLike[str], target_dtype: str | torch.dtype) -> list[str]:
    """Warnings for serving a target in ``target_dtype`` on the data of ``path``: for float16 (whose range ends at
    65504), every captured layer whose recorded max |x| (``value_stats*.json``) exceeds it. [] for other dtypes or
    when no stats were recorded."""
    dtype = getattr(torch, target_dtype) if isinstance(target_dtype, str) else target_dtype
    if dtype != torch.float16:
        return []
    top = float(torch.finfo(torch.float16).max)
    out = []
    for st in read_value_stats(path):
        absmax = st.get("absmax") or {}
        names = block_names(len(absmax.get("aux_hidden_states", [])), st.get("aux_layer_ids"))
        values = [*absmax.get("aux_hidden_states", []), absmax.get("hidden_states", 0.0)]
        for name, v in zip(names, values, strict=True):
            if v is not None and v > top:
                out.append(
                    f"the captured {name} reach |x| = {v:.4g}, beyond float16's 65504: a float16 target overflows "
                    "where this data did not; serve it in bfloat16"
                )
    return out
