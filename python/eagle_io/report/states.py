"""Statistics of stored hidden states, accumulated one sample at a time (memory: one sample plus ``O(H)``).

A *layer* is a column slice of a state tensor: each aux layer's ``H`` columns of ``aux_hidden_states`` and the
final (post-norm) ``hidden_states``. For every layer, over the samples read:

* rows (tokens) holding any NaN or Inf in the layer are counted (``nonfinite_rows``, with ``nan`` / ``inf``
  element counts) and left out of every other figure;
* ``rms_by_position[b]``: ``sqrt(sum x^2 / (rows x H))`` over the finite rows whose token position ``p`` falls in
  bin ``b = p * bins // max_length``, all ``H`` channels (None for a bin without rows);
  ``max_abs_by_position[b]``: the largest ``|x|`` there;
* ``channel_rms[c]``: ``sqrt(sum over finite rows x_c^2 / rows)``; ``channel_max_abs[c]``;
* ``top_channels``: the ``TOP`` channels of largest ``channel_rms``, with ``ratio`` = their rms over the median
  channel rms (an outlier channel stands out as a large ratio).

Values are read as stored (bf16) and summed in float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

TOP = 8
MAX_BINS = 512  # position bins per layer: per-position figures up to max_length 512, binned beyond
ROW_BLOCK = 1024  # rows converted to float64 at a time


@dataclass
class LayerSpec:
    """A layer's columns ``[start, start + width)`` of tensor ``tensor``, shown as ``name``."""

    name: str
    tensor: str
    start: int
    width: int


def layer_specs(schema: list[Any], metadata: dict[str, Any]) -> list[LayerSpec]:
    """The layers of a dataset: EAGLE-3's aux layers (split by ``metadata['aux_layer_ids']`` or ``hidden_size``)
    and its final ``hidden_states``; for another schema, every floating tensor with a width as one layer."""
    widths = {s.name: s.width for s in schema if s.width and s.dtype in ("bfloat16", "float16", "float32")}
    if "aux_hidden_states" in widths and "hidden_states" in widths:
        hidden = widths["hidden_states"]
        ids = metadata.get("aux_layer_ids") if isinstance(metadata, dict) else None
        k = widths["aux_hidden_states"] // hidden
        if not (isinstance(ids, list) and len(ids) == k):
            ids = None
        out = [
            LayerSpec(f"aux layer {ids[i]}" if ids else f"aux slice {i}", "aux_hidden_states", i * hidden, hidden)
            for i in range(k)
        ]
        return [*out, LayerSpec("final hidden (post-norm)", "hidden_states", 0, hidden)]
    return [LayerSpec(name, name, 0, width) for name, width in widths.items()]


class LayerStats:
    """Accumulates one layer's figures (module docstring) over the samples given to :meth:`add`."""

    def __init__(self, spec: LayerSpec, max_length: int) -> None:
        self.spec = spec
        self.max_length = max(int(max_length), 1)
        self.bins = min(self.max_length, MAX_BINS)
        self.sumsq_pos = np.zeros(self.bins)
        self.rows_pos = np.zeros(self.bins, np.int64)
        self.max_pos = np.zeros(self.bins)
        self.ch_sumsq = np.zeros(spec.width)
        self.ch_max = np.zeros(spec.width)
        self.rows = self.nonfinite_rows = self.nan = self.inf = 0

    def add(self, tensor: torch.Tensor) -> None:
        """Adds one sample: ``tensor [L, >= start + width]`` (the whole stored tensor, any float dtype)."""
        s = self.spec
        for r0 in range(0, tensor.shape[0], ROW_BLOCK):
            x = tensor[r0 : r0 + ROW_BLOCK, s.start : s.start + s.width].to(torch.float64)
            finite = torch.isfinite(x)
            self.nan += int(torch.isnan(x).sum())
            self.inf += int(torch.isinf(x).sum())
            good = finite.all(dim=1)
            self.nonfinite_rows += int((~good).sum())
            x = x[good]
            positions = (torch.arange(r0, r0 + good.shape[0])[good]).numpy()
            bins = positions * self.bins // self.max_length
            sq = x.square()
            self.sumsq_pos += np.bincount(bins, weights=sq.sum(dim=1).numpy(), minlength=self.bins)
            self.rows_pos += np.bincount(bins, minlength=self.bins)
            np.maximum.at(self.max_pos, bins, x.abs().amax(dim=1).numpy() if len(x) else np.zeros(0))
            self.ch_sumsq += sq.sum(dim=0).numpy()
            if len(x):
                np.maximum(self.ch_max, x.abs().amax(dim=0).numpy(), out=self.ch_max)
            self.rows += len(x)

    def figures(self) -> dict[str, Any]:
        """The layer's figures as JSON-ready values (None where there is no finite row)."""
        s, rows = self.spec, self.rows
        has = self.rows_pos > 0
        rms_pos = np.sqrt(self.sumsq_pos / np.maximum(self.rows_pos * s.width, 1))
        channel_rms = np.sqrt(self.ch_sumsq / max(rows, 1))
        median = float(np.median(channel_rms)) if rows else 0.0
        top = np.argsort(-channel_rms, kind="stable")[:TOP] if rows else []
        return {
            "name": s.name,
            "tensor": s.tensor,
            "columns": [s.start, s.start + s.width],
            "rows": rows,
            "nonfinite_rows": self.nonfinite_rows,
            "nan": self.nan,
            "inf": self.inf,
            "rms": math.sqrt(float(self.ch_sumsq.sum()) / (rows * s.width)) if rows else None,
            "max_abs": float(self.ch_max.max()) if rows else None,
            "position_bins": {"count": self.bins, "max_length": self.max_length},
            "rms_by_position": [float(v) if h else None for v, h in zip(rms_pos, has, strict=True)],
            "max_abs_by_position": [float(v) if h else None for v, h in zip(self.max_pos, has, strict=True)],
            "channel_rms": [float(v) for v in channel_rms] if rows else [],
            "channel_max_abs": [float(v) for v in self.ch_max] if rows else [],
            "median_channel_rms": median if rows else None,
            "top_channels": [
                {
                    "channel": int(c),
                    "rms": float(channel_rms[c]),
                    "max_abs": float(self.ch_max[c]),
                    "ratio": float(channel_rms[c] / median) if median > 0 else None,
                }
                for c in top
            ],
        }
