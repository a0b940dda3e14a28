"""Statistics of stored hidden states, accumulated one sample at a time (memory: one sample plus ``O(H)``).

A *layer* is a column slice of a state tensor: each aux layer's ``H`` columns of ``aux_hidden_states`` and the
final (post-norm) ``hidden_states``. For every layer, over the samples read:

* rows (tokens) holding any NaN or Inf in the layer are counted (``nonfinite_rows``, with ``nan`` / ``inf``
  element counts) and left out of every other figure;
* ``rms_by_position[b]``: ``sqrt(sum x^2 / (rows x H))`` over the finite rows whose token position ``p`` falls in
  bin ``b = p * bins // longest`` (``longest``: the longest sample read, in tokens), all ``H`` channels (None for
  a bin without rows);
  ``max_abs_by_position[b]``: the largest ``|x|`` there;
* ``channel_rms[c]``: ``sqrt(sum over finite rows x_c^2 / rows)``; ``channel_max_abs[c]``;
* ``top_channels``: the ``TOP`` channels of largest ``channel_rms``, with ``ratio`` = their rms over the median
  channel rms (an outlier channel stands out as a large ratio).

Values are widened to float32 (exact for bf16 / fp16), squared and summed per block of ``ROW_BLOCK`` rows in
float32 (relative error about 1e-7), then accumulated in float64; max |x| is exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

TOP = 8
MAX_BINS = 512  # position bins per layer: per-position figures up to a longest sample of 512, binned beyond
ROW_BLOCK = 1024  # rows converted at a time (bounds the temporaries: ROW_BLOCK x H x 4 bytes)


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


def float32_block(tensor: torch.Tensor, r0: int, r1: int, c0: int, c1: int) -> np.ndarray:
    """``tensor[r0:r1, c0:c1]`` as a new float32 numpy array (bf16 widened by a bit shift: exact, and much faster
    than torch's conversion on a busy CPU)."""
    if tensor.dtype == torch.bfloat16:
        bits = tensor.view(torch.int16).numpy().view(np.uint16)[r0:r1, c0:c1]
        out = np.empty(bits.shape, np.uint32)
        np.left_shift(bits, 16, out=out, dtype=np.uint32)
        return out.view(np.float32)
    return tensor[r0:r1, c0:c1].numpy().astype(np.float32)


class LayerStats:
    """Accumulates one layer's figures (module docstring) over the samples given to :meth:`add`."""

    def __init__(self, spec: LayerSpec, longest: int) -> None:
        self.spec = spec
        self.longest = max(int(longest), 1)
        self.bins = min(self.longest, MAX_BINS)
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
            x = float32_block(tensor, r0, r0 + ROW_BLOCK, s.start, s.start + s.width)
            positions = np.arange(r0, r0 + x.shape[0])
            good = np.isfinite(x).all(axis=1)
            if not good.all():
                self.nan += int(np.isnan(x).sum())
                self.inf += int(np.isinf(x).sum())
                self.nonfinite_rows += int((~good).sum())
                x, positions = x[good], positions[good]
            if not len(x):
                continue
            bins = positions * self.bins // self.longest
            sq, a = np.square(x), np.abs(x)
            self.sumsq_pos += np.bincount(bins, weights=sq.sum(axis=1), minlength=self.bins)
            self.rows_pos += np.bincount(bins, minlength=self.bins)
            np.maximum.at(self.max_pos, bins, a.max(axis=1))
            self.ch_sumsq += sq.sum(axis=0)
            np.maximum(self.ch_max, a.max(axis=0), out=self.ch_max)
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
            "position_bins": {"count": self.bins, "max_length": self.longest},  # key: the report's JSON
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
