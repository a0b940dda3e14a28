"""What a feed item is and where items come from, shared by :class:`eagle_io.feed.ShardDataset` (map-style) and
:class:`eagle_io.feed.FollowingShardDataset` (a capture still running): the manifests behind the given paths, the
check that datasets may be mixed, one sample read as an item, and the records a batch leaves out."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import IncompatibleDatasetError, InvalidArgumentError
from ..store import layout
from ..store.reader import Dataset

#: Metadata keys (docs/FORMAT.md, section 2.1) that must be equal in every dataset a ``ShardDataset`` mixes.
#: A key absent from one dataset and present in another counts as a difference.
COMPATIBILITY_KEYS = (
    "target_model",
    "num_layers",
    "hidden_size",
    "vocab_size",
    "aux_layer_ids",
    "aux_layer_convention",
    "hidden_states_post_norm",
    "dtype",
    "tokenizer",
)

_ABSENT = "<absent>"

#: What a batch does with a record that fails its checks: ``"raise"`` (default) or ``"skip"`` and count it.
ON_CORRUPT = ("raise", "skip")


def check_feed_options(max_length: int | None, on_corrupt: str) -> None:
    """The options both feeds take (``ShardDataset``, ``FollowingShardDataset``), checked once where they enter:
    ``max_length`` (the feed's cut: tokens of each sample kept, None = all) and ``on_corrupt``.

    Raises:
        InvalidArgumentError: ``max_length < 1``, or ``on_corrupt`` not in :data:`ON_CORRUPT`.
    """
    if max_length is not None and max_length < 1:
        raise InvalidArgumentError(f"max_length must be >= 1 or None, got {max_length}")
    if on_corrupt not in ON_CORRUPT:
        raise InvalidArgumentError(f"on_corrupt must be one of {ON_CORRUPT}, got {on_corrupt!r}")


#: The reason an item is left out of a batch when ``max_length`` truncation leaves it no supervised token.
TRUNCATED_UNSUPERVISED = "no_supervised_token_within_max_length"


@dataclass(frozen=True)
class SkippedRecord:
    """A record left out of a batch under ``on_corrupt="skip"``: ``item`` (the ShardDataset index), the
    ``sample_id`` its shard index lists, ``dataset_index``, and where the error is: ``path`` (the shard file),
    ``offset`` (byte offset in it) and ``error`` (the :class:`eagle_io.CorruptRecordError` message)."""

    item: int
    sample_id: int
    dataset_index: int
    path: str
    offset: int
    error: str


@dataclass(frozen=True)
class UnsupervisedSample:
    """An item the eagle-io collators leave out of its batch because ``max_length`` truncation left it no supervised
    token (its ``loss_mask`` is 0 on its first ``max_length`` tokens, so it would train on nothing): ``item`` (the
    ShardDataset index), ``sample_id``, ``dataset_index``, ``stored_tokens`` (before truncation), ``max_length``
    and ``reason`` (:data:`TRUNCATED_UNSUPERVISED`)."""

    item: int
    sample_id: int
    dataset_index: int
    stored_tokens: int
    max_length: int
    reason: str = TRUNCATED_UNSUPERVISED


def expand_paths(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[str]:
    """The manifest paths behind ``paths``: a manifest file stays as is; a directory holding ``manifest.json`` stays
    as is (the reader opens its ``manifest.json``); a directory without ``manifest.json`` but with per-rank manifests
    (``manifest.r00000.json``, ...) becomes those manifests in rank order.

    Raises:
        InvalidArgumentError: no path given, or the same manifest listed twice.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out: list[str] = []
    for p in map(os.fspath, paths):
        found = layout.dataset_manifests(p)
        if os.path.isdir(p) and found and found[0].name != layout.MANIFEST:
            out.extend(map(os.fspath, found))  # an unmerged multi-writer root: its rank manifests
        else:
            out.append(p)
    if not out:
        raise InvalidArgumentError("ShardDataset needs at least one dataset path")
    seen: dict[str, str] = {}
    for p in out:
        if layout.is_url(p):
            real = layout.manifest_file(p)
        else:
            real = os.path.realpath(os.path.join(p, layout.MANIFEST) if os.path.isdir(p) else p)
        if real in seen:
            raise InvalidArgumentError(f"manifest {real} is listed twice (as {seen[real]!r} and {p!r})")
        seen[real] = p
    return out


def _lossless(schema: list) -> list:
    """``schema`` without storage precisions: what the readers return (FP8 tensors are dequantised)."""
    return [dataclasses.replace(s, precision=None, scale_block=None) for s in schema]


def _check_compatible(first: Dataset, other: Dataset, mix_precisions: bool = False) -> None:
    for key in COMPATIBILITY_KEYS:
        a, b = first.metadata.get(key, _ABSENT), other.metadata.get(key, _ABSENT)
        if a != b:
            raise IncompatibleDatasetError(
                f"metadata {key!r} differs: {first.manifest_path} has {a!r}, {other.manifest_path} has {b!r}"
            )
    schema_a, schema_b = (
        (_lossless(first.schema), _lossless(other.schema))
        if mix_precisions
        else (
            first.schema,
            other.schema,
        )
    )
    if schema_a != schema_b:
        specs_a, specs_b = {s.name: s for s in schema_a}, {s.name: s for s in schema_b}
        for name in sorted(set(specs_a) | set(specs_b)):
            a, b = specs_a.get(name), specs_b.get(name)
            if a != b:
                desc = lambda s: (  # noqa: E731
                    _ABSENT
                    if s is None
                    else f"{s.dtype} width {s.width}" + (f" stored as {s.precision}" * bool(s.precision))
                )
                hint = ""
                if a is not None and b is not None and a.precision != b.precision:
                    hint = " (pass mix_precisions=True to read both dequantised)"
                raise IncompatibleDatasetError(
                    f"schema tensor {name!r} differs: {first.manifest_path} has {desc(a)}, "
                    f"{other.manifest_path} has {desc(b)}{hint}"
                )
        raise IncompatibleDatasetError(
            f"schema tensor order differs: {first.manifest_path} has {[s.name for s in first.schema]}, "
            f"{other.manifest_path} has {[s.name for s in other.schema]}"
        )


def read_item(ds: Dataset, pos: int, dataset_index: int, cut: int | None) -> dict[str, Any]:
    """Sample ``pos`` of ``ds`` as a feed item (see :class:`ShardDataset`): tensors truncated to ``cut`` tokens (the
    feed's ``max_length``), ``loss_mask`` as int64, ``sample_id`` and ``dataset_index`` added. Raises
    CorruptRecordError on a bad record."""
    sample = ds.read(pos)
    sample_id = sample.pop("sample_id")
    if cut is not None and sample["input_ids"].shape[0] > cut:
        sample = {k: v[:cut] for k, v in sample.items()}
    sample["loss_mask"] = sample["loss_mask"].to(torch.int64)
    sample["sample_id"] = sample_id
    sample["dataset_index"] = dataset_index
    return sample
