"""Rewrite a dataset with another storage precision (``eagle-io transcode``): every sample, id, key, the metadata
and the schema's dtypes kept; the state tensors' ``precision`` changed (docs/FORMAT.md 3.1)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from ..errors import InvalidArgumentError
from . import layout
from .manifest import data_fingerprint
from .reader import Dataset
from .schema import TensorSpec, precision_name
from .writer import ShardWriter

#: Samples handed to the writer at once.
BATCH = 8

#: The metadata key of a dataset's lossy past: one entry per earlier lossy storage its states went through
#: (``precision``, ``tensors``, ``transcoded_to``, ``source_sha256``), oldest first, kept by every transcode, so a
#: bf16 dataset transcoded from FP8 does not read as a lossless capture.
LOSSY_HISTORY = "lossy_history"


def lossy_history(metadata: dict[str, Any], schema: list[TensorSpec]) -> list[str]:
    """The lossy history of a dataset in words, oldest first: each earlier lossy storage (:data:`LOSSY_HISTORY`),
    then its own when its states are stored lossy now; empty for a dataset that was never stored lossy. What
    ``inspect`` and ``report`` show."""
    out = []
    for e in metadata.get(LOSSY_HISTORY) or []:
        if isinstance(e, dict):
            out.append(
                f"stored as {e.get('precision')} ({', '.join(map(str, e.get('tensors') or []))}), then transcoded to "
                f"{e.get('transcoded_to')}"
            )
    lossy = [t for t in schema if t.precision]
    if lossy:
        out.append(f"stored as {lossy[0].precision} now ({', '.join(t.name for t in lossy)})")
    return out


def transcoded_schema(schema: list[TensorSpec], precision: str | None) -> list[TensorSpec]:
    """``schema`` with every bfloat16/float32 ``[L, width]`` tensor stored in ``precision`` (``"fp8"`` or
    ``"bf16"``/None for lossless); other tensors unchanged."""
    name = precision_name(precision)
    out = []
    for s in schema:
        if s.width is not None and s.dtype in ("bfloat16", "float32"):
            s = dataclasses.replace(s, precision=name, scale_block=None)
        out.append(s)
    return out


def _check_apart(source: Dataset, dst: str | os.PathLike[str]) -> None:
    """Refuses a ``dst`` that is ``source``'s directory or nested with it: shards written inside the source dataset
    (or a source inside the new one) would be found by the other's discovery and merge."""
    if layout.is_url(source.manifest_path) or layout.is_url(dst):
        return
    src_dir = os.path.realpath(os.path.dirname(source.manifest_path))
    out = os.path.realpath(dst)
    if os.path.commonpath([src_dir, out]) in (src_dir, out):
        raise InvalidArgumentError(
            f"the output {os.fspath(dst)!r} ({out}) and the source dataset {src_dir!r} are the same directory or one "
            "lies inside the other; write the new dataset elsewhere"
        )


def transcode(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    precision: str | None,
    *,
    threads: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Writes every sample of the dataset ``src`` (read dequantised, in position order) to a new dataset ``dst``
    whose floating ``[L, width]`` tensors are stored in ``precision``; a lossy source's storage is appended to the
    new dataset's :data:`LOSSY_HISTORY`. Returns the writer's stats (``fp8_clamped``
    counts saturated values); ``progress(done, total)`` is called after each batch. A transcode to FP8 is lossy;
    back to bf16 it keeps the FP8 values exactly.

    Raises:
        InvalidArgumentError: an unknown ``precision`` (checked before ``dst`` is created), ``dst`` already
            holding a dataset, or ``dst`` and ``src``'s directory the same or one inside the other (the message
            names both).
        CorruptRecordError: a sample of ``src`` that does not read.

    A transcode that fails (or is interrupted) removes what it wrote to ``dst`` (it cannot be resumed, and its part
    would refuse the retry): ``dst`` is as it was.
    """
    source = Dataset(src, threads=threads)
    _check_apart(source, dst)
    schema = transcoded_schema(source.schema, precision)
    level = source.manifest["codec"]["zstd_level"]
    metadata = dict(source.metadata)
    lossy = [t for t in source.schema if t.precision]
    if lossy:  # what the source lost stays lost: the new dataset says so, however it is stored
        entry = {
            "precision": lossy[0].precision,
            "tensors": [t.name for t in lossy],
            "transcoded_to": precision_name(precision) or "lossless",
            "source_sha256": data_fingerprint([source.manifest]),
        }
        metadata[LOSSY_HISTORY] = [*(metadata.get(LOSSY_HISTORY) or []), entry]
    footprint = layout.Footprint(dst)
    try:
        with ShardWriter(dst, schema, metadata, threads=threads, zstd_level=level) as writer:
            for start in range(0, len(source), BATCH):
                batch = []
                for pos in range(start, min(start + BATCH, len(source))):
                    item = source.read(pos)
                    info = source.entry(pos)
                    batch.append((info.sample_id, {s.name: item[s.name] for s in schema}, info.key))
                writer.write_batch(batch)
                if progress:
                    progress(start + len(batch), len(source))
    except BaseException:  # a transcode is not resumed: the part written is no result, and would refuse the retry
        footprint.take_back_dataset()
        raise
    return writer.stats()
