"""Every sample of a dataset decoded and checked with the capture's value checker (:mod:`eagle_io.store.values`):
``eagle-io verify``'s value section, and the run report's."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from .values import FIELDS, KINDS, RowStats, SampleRows, block_names, find_problems, row_stats, sample_absmax

__all__ = ["check_group", "read_stats", "scan_dataset", "value_layout"]


def value_layout(ds: Any) -> tuple[int, list[str]] | None:
    widths = {s.name: s.width for s in ds.schema}
    aux, hidden = widths.get("aux_hidden_states"), widths.get("hidden_states")
    if not aux or not hidden or aux % hidden:
        return None
    k = aux // hidden
    return k, block_names(k, ds.metadata.get("aux_layer_ids"))


def read_stats(
    ds: Any, bad: set[int], positions: Sequence[int] | None = None
) -> Iterator[tuple[int, Any, torch.Tensor, RowStats, int]]:
    """(position, sample id, input_ids, row stats, tokens) of every sample at ``positions`` (default all) that
    decodes; the others' sample ids go to ``bad``."""
    from ..errors import CorruptRecordError

    for pos in range(len(ds)) if positions is None else positions:
        try:
            item = ds.read(pos)
        except CorruptRecordError:
            bad.add(ds.entry(pos).sample_id)
            continue
        st = row_stats(item["aux_hidden_states"], item["hidden_states"])
        yield pos, item["sample_id"], item["input_ids"], st, int(item["input_ids"].shape[0])


def scan_dataset(path: str | os.PathLike[str], *, window: int = 256, threads: int = 0) -> dict[str, Any]:
    """Decodes every sample of the dataset at ``path`` and checks its states (:func:`find_problems`); copies are
    looked for among the ``window`` to ``2 * window`` samples stored before each one and the ones after it in its
    block of ``window`` (a capture writes a forward's samples next to each other). Records that do not decode are
    left to ``Dataset.verify`` (listed in ``unreadable``). Memory: the row stats of ``2 * window`` samples (about
    28 bytes per token); sample tensors are read again only to confirm a candidate copy.

    Returns:
        A plain dict: ``checked`` (bool: False when the dataset has no ``aux_hidden_states`` / ``hidden_states``
        pair of widths ``k*H`` / ``H``), ``samples``, ``tokens``, ``counts`` (``{kind: samples}`` for every kind of
        :data:`KINDS`), ``problems`` (every problem dict, in dataset order), ``absmax`` (``{"blocks": [names],
        "values": [max |x| per block over the finite values]}``), ``unreadable`` (sample ids).

    Raises:
        CorruptRecordError, FormatVersionError, StorageError: the manifest or an index cannot be opened.
    """
    from .reader import Dataset

    ds = Dataset(path, threads=threads)
    result: dict[str, Any] = {"checked": False, "samples": 0, "tokens": 0, "counts": dict.fromkeys(KINDS, 0)}
    result.update(problems=[], absmax=None, unreadable=[])
    lay = value_layout(ds)
    if lay is None:
        return result
    k, names = lay
    result["checked"] = True
    absmax = [0.0] * (k + 1)
    bad: set[int] = set()
    previous: list[tuple[int, Any, torch.Tensor, RowStats, int]] = []
    stream = read_stats(ds, bad)
    while current := [x for _, x in zip(range(window), stream, strict=False)]:
        group = previous + current
        found, stats, samples = check_group(ds, group, names)
        for j in range(len(previous), len(group)):
            s = samples[j]
            result["samples"] += 1
            result["tokens"] += s.length
            for kind in {p["kind"] for p in found[j]}:
                result["counts"][kind] += 1
            result["problems"].extend(found[j])
            absmax = [max(a, b) for a, b in zip(absmax, sample_absmax(stats, s.start, s.length), strict=True)]
        previous = current
    result["absmax"] = {"blocks": names, "values": absmax}
    result["unreadable"] = sorted(bad)
    return result


def check_group(
    ds: Any, group: list[tuple[int, Any, torch.Tensor, RowStats, int]], names: list[str]
) -> tuple[list[list[dict[str, Any]]], RowStats, list[SampleRows]]:
    """:func:`find_problems` over ``group`` (``(position, sample id, input_ids, row stats, tokens)`` per sample, as
    :func:`read_stats` yields them): copies are looked for among these samples, candidates confirmed by reading
    the samples again. Returns the problems per sample, the joined stats and where each sample's rows are."""
    starts = [0]
    for *_, n in group:
        starts.append(starts[-1] + n)
    stats = RowStats(*(torch.cat([getattr(g[3], f) for g in group]) for f in FIELDS))
    samples = [SampleRows(g[1], g[2], starts[j], g[4]) for j, g in enumerate(group)]
    same_rows, same_blocks = _reader_compare(ds, group, starts)
    return find_problems(stats, samples, names=names, same_rows=same_rows, same_blocks=same_blocks), stats, samples


def _reader_compare(
    ds: Any, group: list, starts: list[int]
) -> tuple[Callable[[str, int, int], bool], Callable[[int, int, int], bool]]:
    """``same_rows`` and ``same_blocks`` for :func:`find_problems` over a window: they read the samples again."""

    def row(tensor: str, g: int) -> torch.Tensor:
        j = next(j for j in range(len(group)) if starts[j] <= g < starts[j + 1])
        return ds.read(group[j][0])[tensor][g - starts[j]]

    def same_blocks(g: int, a: int, b: int) -> bool:
        x = row("aux_hidden_states", g)
        h = x.shape[0] // int(group[0][3].block_hash.shape[1])
        return torch.equal(x[a * h : (a + 1) * h], x[b * h : (b + 1) * h])

    return (lambda tensor, a, b: torch.equal(row(tensor, a), row(tensor, b))), same_blocks
