"""Per-sample token and supervised-token counts, decoding only each record's ``loss_mask`` tensor.

``eagle-io inspect`` and ``eagle-io report`` need the supervised share of every sample without decoding its
hidden states (gigabytes per thousand samples). The native reader's :meth:`eagle_io.Dataset.read_tensor` reads each
record whole and checks its CRC-32 (the checksum covers the record, docs/FORMAT.md section 4.4), then decodes the
``loss_mask`` chunks alone: local shards and object storage (``s3://``, a batch's records fetched together) alike.
A record that fails its checksum or does not decode is listed in ``unreadable``, not raised.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from . import layout
from .reader import Dataset

MASK = "loss_mask"
BATCH = 256
"""Samples per native call (one GIL release; from object storage, their records fetched together)."""


@dataclass
class MaskCounts:
    """Counts per sample, in dataset position order.

    Attributes:
        sample_ids: ``[N]`` int64.
        lengths: ``[N]`` int64, tokens ``L`` per sample (from the index).
        supervised: ``[N]`` int64, tokens with ``loss_mask != 0``; -1 where the mask could not be read.
        unreadable: ``(shard path, sample_id, message)`` of every record whose mask could not be read.
    """

    sample_ids: np.ndarray
    lengths: np.ndarray
    supervised: np.ndarray
    unreadable: list[tuple[str, int, str]] = field(default_factory=list)


manifest_file = layout.manifest_file  # ``path`` or ``path/manifest.json``; refuses an unmerged multi-writer root


def mask_counts(
    path: str | os.PathLike[str] | Dataset, *, progress: Callable[[int, int], None] | None = None
) -> MaskCounts:
    """Token and supervised-token counts of every sample of the dataset at ``path``.

    Args:
        path: a dataset directory, manifest file or ``s3://`` URL, or an open :class:`eagle_io.Dataset`.
        progress: called as ``progress(samples_done, samples_total)`` after each batch of :data:`BATCH` samples.

    Returns:
        A :class:`MaskCounts`. ``supervised`` is all -1 when the schema has no ``loss_mask [L]`` tensor of 1-byte
        elements.

    Raises:
        CorruptRecordError, FormatVersionError, StorageError, ObjectStorageError: the manifest or a shard index
            cannot be opened (as :class:`eagle_io.Dataset`).
    """
    ds = path if isinstance(path, Dataset) else Dataset(path, threads=0)
    n = len(ds)
    entries = [ds.entry(p) for p in range(n)]
    ids = np.fromiter((e.sample_id for e in entries), np.int64, n)
    lengths = np.fromiter((e.n_tokens for e in entries), np.int64, n)
    out = MaskCounts(ids, lengths, np.full(n, -1, np.int64))
    spec = next((s for s in ds.schema if s.name == MASK), None)
    if spec is None or spec.width is not None or spec.dtype not in ("uint8", "int8", "bool"):
        return out
    for start in range(0, n, BATCH):
        positions = range(start, min(start + BATCH, n))
        masks = ds.read_tensor(MASK, positions, on_error="return")
        for p, m in zip(positions, masks, strict=True):
            if isinstance(m, torch.Tensor):
                out.supervised[p] = int(torch.count_nonzero(m))
            else:
                out.unreadable.append((str(getattr(m, "path", ds.manifest_path)), int(ids[p]), str(m)))
        if progress:
            progress(positions.stop, n)
    return out
