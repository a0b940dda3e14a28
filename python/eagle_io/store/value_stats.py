"""``value_stats.json``: what a capture records beside its manifest when it closes (docs/FORMAT.md section 2.2):
per-layer max |x| of the samples written and the samples each value policy skipped; and the warning a float16
serving target needs when the data's range exceeds float16's."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import torch

from ..errors import CorruptRecordError
from .values import block_names

__all__ = [
    "STATS_FORMAT",
    "merge_value_stats",
    "range_warnings",
    "read_value_stats",
    "stats_problems",
    "value_stats_path",
]

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
    (docs/FORMAT.md section 2.2), in rank order; [] when none was written.

    Raises:
        CorruptRecordError: a file that is not JSON or cannot be true (:func:`stats_problems`), naming it and every
            problem (a damaged file was a JSONDecodeError traceback out of check-serving; a negative max |x|, or one
            per layer for another number of layers, was taken as it was).
    """
    from .layout import dataset_manifests

    out = []
    for m in dataset_manifests(path):
        f = value_stats_path(m)
        if not f.is_file():
            continue
        try:
            st = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            problems = [f"not JSON ({e})"]
        else:
            problems = stats_problems(st)
        if problems:
            err = CorruptRecordError(
                f"{f}: " + "; ".join(problems) + ": not what a capture writes (docs/FORMAT.md 2.2); delete it (it "
                "only records the captured range, for check-serving's float16 check)"
            )
            err.path, err.sample_id, err.offset = str(f), None, 0
            raise err
        out.append(st)
    return out


def _magnitude(x: Any) -> bool:
    """A max |x|: a finite JSON number >= 0 (not ``true``, NaN or Infinity)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def stats_problems(st: Any) -> list[str]:
    """Every way a value stats object cannot be what a capture wrote, one sentence each naming the field; empty when
    it holds together: ``format``, ``samples`` an integer >= 0, ``absmax`` null or per-layer max |x| (finite, >= 0)
    with one value per ``aux_layer_ids`` entry."""
    if not isinstance(st, dict) or st.get("format") != STATS_FORMAT:
        return [f"format {st.get('format') if isinstance(st, dict) else st!r} is not {STATS_FORMAT!r}"]
    out = []
    samples = st.get("samples", 0)
    if type(samples) is not int or samples < 0:
        out.append(f"samples {samples!r} is not a count (an integer >= 0)")
    absmax, ids = st.get("absmax"), st.get("aux_layer_ids")
    if absmax is None:
        return out
    aux = absmax.get("aux_hidden_states") if isinstance(absmax, dict) else None
    if not isinstance(aux, list) or not all(_magnitude(v) for v in aux):
        out.append(f"absmax.aux_hidden_states {aux!r} is not a max |x| (a finite number >= 0) per captured layer")
    elif ids is not None and (not isinstance(ids, list) or len(ids) != len(aux)):
        out.append(f"absmax.aux_hidden_states has {len(aux)} values for aux_layer_ids {ids!r}: one per layer")
    final = absmax.get("hidden_states") if isinstance(absmax, dict) else None
    if not _magnitude(final):
        out.append(f"absmax.hidden_states {final!r} is not a max |x| (a finite number >= 0)")
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
        absmax = st.get("absmax")
        if absmax is None:  # no sample written
            continue
        names = block_names(len(absmax["aux_hidden_states"]), st.get("aux_layer_ids"))
        values = [*absmax["aux_hidden_states"], absmax["hidden_states"]]
        for name, v in zip(names, values, strict=True):
            if v > top:
                out.append(
                    f"the captured {name} reach |x| = {v:.4g}, beyond float16's 65504: a float16 target overflows "
                    "where this data did not; serve it in bfloat16"
                )
    return out
