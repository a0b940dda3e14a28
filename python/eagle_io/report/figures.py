"""The numbers of ``eagle-io report``: everything the page shows, as one JSON-ready dict (``--json``).

Memory stays bounded on a dataset larger than RAM: lengths come from the shard indexes, loss masks from the
records' ``loss_mask`` tensors alone (:mod:`eagle_io.store.masks`), and hidden-state statistics from at most
``sample`` samples read one at a time (:mod:`eagle_io.report.states`); the figures say how many were read.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError
from ..store.masks import mask_counts
from ..store.reader import Dataset
from ..store.transcode import lossy_history
from ..store.value_scan import check_group, value_layout
from ..store.values import KINDS, row_stats
from .capture_log import read_logs
from .states import LayerStats, layer_specs

PERCENTILES = (1, 10, 25, 50, 75, 90, 99)
LENGTH_BINS = 40
SHARE_BINS = 20
DEFAULT_SAMPLE = 256


def percentiles(values: np.ndarray) -> dict[str, Any]:
    """``min``, ``p1`` ... ``p99`` (the smallest value at or above that share of the values: numpy's
    ``inverted_cdf``), ``max`` and ``mean`` of ``values``; all None when empty."""
    keys = ["min", *(f"p{q}" for q in PERCENTILES), "max", "mean"]
    if not len(values):
        return dict.fromkeys(keys)
    qs = np.percentile(values, PERCENTILES, method="inverted_cdf")
    return {
        "min": int(values.min()),
        **{f"p{q}": int(v) for q, v in zip(PERCENTILES, qs, strict=True)},
        "max": int(values.max()),
        "mean": float(values.mean()),
    }


def _histogram(values: np.ndarray, bins: int, range_: tuple[float, float]) -> dict[str, list]:
    counts, edges = np.histogram(values, bins=bins, range=range_)
    return {"edges": [float(e) for e in edges], "counts": [int(c) for c in counts]}


def length_figures(lengths: np.ndarray) -> dict[str, Any]:
    """Token-length percentiles and a ``LENGTH_BINS``-bin histogram over ``[0, max]``."""
    top = float(lengths.max()) if len(lengths) else 1.0
    return {"percentiles": percentiles(lengths), "histogram": _histogram(lengths, LENGTH_BINS, (0.0, max(top, 1.0)))}


def mask_figures(lengths: np.ndarray, supervised: np.ndarray) -> dict[str, Any]:
    """Loss-mask coverage; ``supervised`` is -1 where a mask was not read. Samples of 0 tokens count as
    ``empty`` and in no share."""
    read = supervised >= 0
    nonempty = read & (lengths > 0)
    share = supervised[nonempty] / lengths[nonempty]
    tokens = int(lengths[read].sum())
    return {
        "samples_read": int(read.sum()),
        "supervised_tokens": int(supervised[read].sum()),
        "tokens": tokens,
        "supervised_share": int(supervised[read].sum()) / tokens if tokens else None,
        "mean_sample_share": float(share.mean()) if len(share) else None,
        "all_zero": int((nonempty & (supervised == 0)).sum()),
        "all_one": int((nonempty & (supervised == lengths)).sum()),
        "empty": int((read & (lengths == 0)).sum()),
        "share_histogram": _histogram(share, SHARE_BINS, (0.0, 1.0)),
    }


def shard_figures(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """Per shard, in manifest order: file, samples, tokens, stored and decoded bytes, ratio."""
    return [
        {
            "file": s["file"],
            "samples": s["samples"],
            "tokens": s["tokens"],
            "bytes": s["bytes"],
            "raw_bytes": s["raw_bytes"],
            "ratio": s["raw_bytes"] / s["bytes"] if s["bytes"] else None,
        }
        for s in manifest["shards"]
    ]


def sample_positions(n: int, sample: int, seed: int) -> list[int]:
    """All positions when ``sample >= n``, else ``sample`` of them drawn without replacement, ascending."""
    return list(range(n)) if sample >= n else sorted(random.Random(seed).sample(range(n), sample))


SHOWN_PROBLEMS = 5
"""Value problems listed per kind in the report (the counts cover every sample read)."""


def state_figures(ds: Dataset, positions: list[int], progress: Callable[[int, int], None] | None) -> dict[str, Any]:
    """Per-layer statistics (:mod:`eagle_io.report.states`) and ``eagle-io verify``'s value checks
    (:func:`value_figures`) over the samples at ``positions``."""
    lengths = ds.lengths()
    longest = max((lengths[p] for p in positions), default=1)
    layers = [LayerStats(spec, longest) for spec in layer_specs(ds.schema, ds.metadata)]
    lay = value_layout(ds)
    group = []
    for i, pos in enumerate(positions):
        item = ds.read(pos)
        for layer in layers:
            layer.add(item[layer.spec.tensor])
        if lay is not None:
            stats = row_stats(item["aux_hidden_states"], item["hidden_states"])
            group.append((pos, item["sample_id"], item["input_ids"], stats, int(item["input_ids"].shape[0])))
        if progress:
            progress(i + 1, len(positions))
    return {
        "samples_read": len(positions),
        "samples": len(ds),
        "all_samples": len(positions) == len(ds),
        "tokens_read": int(sum(lengths[p] for p in positions)),
        "layers": [layer.figures() for layer in layers],
        "values": value_figures(ds, group, lay),
    }


def value_figures(ds: Dataset, group: list, lay: tuple[int, list[str]] | None) -> dict[str, Any]:
    """``eagle-io verify``'s value categories (:data:`eagle_io.store.values.KINDS`) over the samples read:
    ``checked`` (False without an ``aux_hidden_states [L, k*H]`` / ``hidden_states [L, H]`` pair), ``samples``,
    ``counts`` (samples per kind; copies are looked for among the samples read) and ``problems`` (the first
    :data:`SHOWN_PROBLEMS` messages of each kind)."""
    out: dict[str, Any] = {"checked": lay is not None, "samples": len(group), "counts": dict.fromkeys(KINDS, 0)}
    out["problems"] = []
    if lay is None or not group:
        return out
    found, _, _ = check_group(ds, group, lay[1])
    for kind in KINDS:
        of_kind = [p for problems in found for p in problems if p["kind"] == kind]
        out["counts"][kind] = len({p["sample_id"] for p in of_kind})
        out["problems"] += [{"kind": kind, "sample_id": p["sample_id"], "message": p["message"]}
                            for p in of_kind[:SHOWN_PROBLEMS]]  # fmt: skip
    return out


def _counters(line: dict[str, Any]) -> tuple[float, float, float | None]:
    return float(line.get("t") or 0.0), float(line.get("tokens") or 0), line.get("forward_s")


def capture_figures(root: str) -> dict[str, Any]:
    """Throughput over time from the capture logs (:mod:`eagle_io.report.capture_log`) of ``root``.

    ``intervals``: one entry per logged interval: ``run`` (0, 1... in start order), ``start_s`` (seconds since the
    first run began), ``seconds``, ``tokens_per_s`` and ``outside_forward_share`` (1 - forward seconds / interval
    seconds; None when the backend does not time its forward). The totals sum every run's last line.

    ``skipped``: source records that yield no sample, by reason, from each log file's last finished run (every run
    reads the skipped records again, so runs are not added up); ``modified``: changes to the stored samples, by
    reason, summed over finished runs (a run tokenizes only the records not yet committed)."""
    lines, torn = read_logs(root)
    if not lines:
        return {"available": False, "torn_lines": torn}
    first = min(line["run"] for line in lines)
    runs: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for line in lines:
        if line["event"] in ("interval", "end"):
            runs.setdefault((line["log"], line["run"]), []).append(line)
    intervals, seconds, tokens, forward = [], 0.0, 0.0, 0.0
    timed = True
    for number, ((_, run), points) in enumerate(sorted(runs.items(), key=lambda kv: kv[0][1])):
        prev_t, prev_tokens, prev_fwd = 0.0, 0.0, 0.0
        for p in points:
            t, tok, fwd = _counters(p)
            if t <= prev_t:
                continue
            fwd_share = None if fwd is None or prev_fwd is None else 1 - (fwd - prev_fwd) / (t - prev_t)
            intervals.append(
                {
                    "run": number,
                    "start_s": run - first + prev_t,
                    "seconds": t - prev_t,
                    "tokens_per_s": (tok - prev_tokens) / (t - prev_t),
                    "outside_forward_share": fwd_share,
                }
            )
            prev_t, prev_tokens, prev_fwd = t, tok, fwd
        last_t, last_tokens, last_fwd = _counters(points[-1])
        seconds, tokens = seconds + last_t, tokens + last_tokens
        timed = timed and last_fwd is not None
        forward += last_fwd or 0.0
    ends: dict[str, dict[str, Any]] = {}
    modified: Counter[str] = Counter()
    for line in lines:
        if line["event"] == "end":
            ends[line["log"]] = line
            modified.update(line.get("modified") or {})
    skipped: Counter[str] = Counter()
    for end in ends.values():
        skipped.update(end.get("skipped") or {})
    return {
        "available": True,
        "logs": sorted({line["log"] for line in lines}),
        "runs": len({(line["log"], line["run"]) for line in lines}),
        "finished_runs": sum(line["event"] == "end" for line in lines),
        "torn_lines": torn,
        "seconds": seconds,
        "tokens": int(tokens),
        "tokens_per_s": tokens / seconds if seconds else None,
        "outside_forward_share": 1 - forward / seconds if seconds and timed else None,
        "intervals": intervals,
        "skipped": dict(sorted(skipped.items())),
        "modified": dict(sorted(modified.items())),
    }


def build_figures(
    path: str | os.PathLike[str],
    *,
    sample: int = DEFAULT_SAMPLE,
    seed: int = 0,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, Any]:
    """All figures of the report on the dataset at ``path`` (directory or manifest).

    Args:
        sample: read the hidden states of at most this many samples (drawn with ``seed``); lengths, masks, shards
            and the capture log always cover the whole dataset.
        progress: called as ``progress(stage, done, total)``, stage ``"masks"`` (samples) or ``"states"``.

    Raises:
        InvalidArgumentError: ``sample < 1``.
        CorruptRecordError, FormatVersionError, StorageError: as :class:`eagle_io.Dataset` (a sampled record that
            fails its checksum raises; a loss mask that fails is listed in ``loss_mask.unreadable``).
    """
    if sample < 1:
        raise InvalidArgumentError(f"--sample must be at least 1, not {sample}")
    ds = Dataset(path, threads=0)
    masks = mask_counts(ds, progress=(lambda d, t: progress("masks", d, t)) if progress else None)
    lengths = masks.lengths
    shards = shard_figures(ds.manifest)
    raw, stored = sum(s["raw_bytes"] for s in shards), sum(s["bytes"] for s in shards)
    positions = sample_positions(len(ds), sample, seed)
    states = state_figures(ds, positions, (lambda d, t: progress("states", d, t)) if progress else None)
    return {
        "dataset": ds.manifest_path,
        "complete": ds.manifest["complete"],
        "writer": ds.manifest["writer"],
        "metadata": ds.metadata,
        "schema": ds.manifest["schema"]["tensors"],
        "lossy_history": lossy_history(ds.metadata, ds.schema),
        "summary": {
            "samples": len(ds),
            "shards": len(shards),
            "tokens": int(lengths.sum()),
            "raw_bytes": raw,
            "stored_bytes": stored,
            "ratio": raw / stored if stored else None,
        },
        "lengths": length_figures(lengths),
        "loss_mask": {
            **(mask_figures(lengths, masks.supervised) if (masks.supervised >= 0).any() else {"samples_read": 0}),
            "unreadable": [{"shard": s, "sample_id": i, "error": e} for s, i, e in masks.unreadable],
        },
        "states": {**states, "seed": seed, "sample": sample},
        "shards": shards,
        "capture": capture_figures(os.path.dirname(ds.manifest_path)),
    }
