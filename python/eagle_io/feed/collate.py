"""Collators (items of :class:`eagle_io.feed.ShardDataset` -> batches) and the EAGLE-3 target shift.

The shift contract (EAGLE-3, as SpecForge trains it): position ``t`` of a sample is trained to predict the *next*
token's state. The draft at ``t`` sees the aux states of token ``t`` and the id of token ``t + 1``, and its target
is ``hidden_states[t + 1]`` (the target model's distribution is ``lm_head(hidden_states[t + 1])``). The last
position of every sample has no next token, hence no target: its loss mask is 0 after the shift, and in a packed
batch no target is taken across a sample boundary. SpecForge does this in ``OfflineEagle3Dataset.process_data``
(``specforge/data/preprocessing.py``): ``loss_mask[0, -1] = 0``, ``target = padding(hidden_state, left=False)``,
``input_ids = padding(input_ids, left=False)``, where ``specforge.utils.padding(x, left=False)`` is
``torch.cat((x[:, 1:], zeros_like(x[:, -1:])), dim=1)``.

Collators do not shift; :func:`shift_targets` does, for both batch layouts, on any device.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any, Protocol

import numpy as np
import torch

from ..errors import CorruptRecordError, InvalidArgumentError
from .dataset import LazyItems, ShardDataset

_STATES = ("aux_hidden_states", "hidden_states")
_ROWS = ("input_ids", "loss_mask", *_STATES)
#: The [B, T] int64 entries of both layouts.
_INT_ENTRIES = ("input_ids", "attention_mask", "loss_mask", "position_ids")


class Allocator(Protocol):
    """``empty(key, shape, dtype)``: an uninitialised contiguous CPU tensor for the batch entry ``key`` (the
    collators fill every byte of it). The default gives fresh memory (shared memory in a DataLoader worker);
    :class:`eagle_io.feed.Loader` gives views of its reused (pinned) batch buffers."""

    def __call__(self, key: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor: ...


def fresh_tensor(key: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """The default :class:`Allocator`: a new CPU tensor; in a DataLoader worker, in shared memory, so that sending
    the batch to the main process does not copy it (as ``torch.utils.data.default_collate`` does)."""
    if torch.utils.data.get_worker_info() is None:
        return torch.empty(shape, dtype=dtype)
    numel = 1
    for d in shape:
        numel *= d
    base = torch.empty(0, dtype=dtype)
    return base.new(base._typed_storage()._new_shared(numel, device="cpu")).view(shape)


def _zero_rows(t: torch.Tensor) -> None:
    """Zeroes ``t`` (a contiguous block of a batch's rows, any dtype) through numpy. Every fill of a batch goes
    through numpy: a torch fill of a few rows starts torch's intra-op thread pool, whose spinning threads cost ~8
    CPU-ms per call (benches/README.md)."""
    if t.numel():
        t.view(torch.uint8).numpy().fill(0)


def _check_items(items: Sequence[Mapping[str, Any]]) -> list[int]:
    if len(items) == 0:
        raise InvalidArgumentError("cannot collate an empty list of items")
    lengths = []
    first = items[0]
    for it in items:
        n = it["input_ids"].shape[0]
        for name in ("loss_mask", *_STATES):
            t = it[name]
            if t.shape[0] != n:
                raise InvalidArgumentError(
                    f"sample {it.get('sample_id')}: {name} has {t.shape[0]} rows but input_ids has {n}"
                )
        for name in _STATES:
            a, b = it[name], first[name]
            if a.shape[1:] != b.shape[1:] or a.dtype != b.dtype:
                raise InvalidArgumentError(
                    f"sample {it.get('sample_id')}: {name} is {a.dtype} {list(a.shape[1:])} per token but sample "
                    f"{first.get('sample_id')} has {b.dtype} {list(b.shape[1:])}"
                )
        lengths.append(n)
    return lengths


class _Collator(abc.ABC):
    """Allocates the batch (``_allocate``, every tensor from an :class:`Allocator`), then fills each item's rows:
    from item tensors (``__call__``) or by decoding straight into them (``collate_from``, used automatically for
    ``ShardDataset`` batches)."""

    @abc.abstractmethod
    def _allocate(self, lengths: list[int], states: dict[str, tuple[tuple[int, ...], torch.dtype]], empty: Allocator):
        """-> (batch dict, [(row, start)] per item)."""

    def __call__(self, items: Sequence[Mapping[str, Any]], *, empty: Allocator = fresh_tensor) -> dict[str, Any]:
        if isinstance(items, LazyItems):
            return self.collate_from(items.dataset, items.indices, empty=empty)
        lengths = _check_items(items)
        states = {n: (tuple(items[0][n].shape[1:]), items[0][n].dtype) for n in _STATES}
        batch, slots = self._allocate(lengths, states, empty)
        for it, (row, start), n in zip(items, slots, lengths, strict=True):
            for name in _ROWS:
                batch[name][row, start : start + n] = it[name]
        batch["sample_ids"] = [it.get("sample_id") for it in items]
        batch["dataset_index"] = [it.get("dataset_index") for it in items]
        batch["skipped"], batch["unsupervised"] = [], []
        return batch

    def collate_from(
        self, dataset: ShardDataset, indices: Sequence[int], *, empty: Allocator = fresh_tensor
    ) -> dict[str, Any]:
        """The batch of ``dataset``'s items at ``indices``, decoded straight into the batch tensors (what
        ``__call__`` gives for ``[dataset[i] for i in indices]``, without per-item tensors or their copy), each
        tensor from ``empty``.

        A corrupt record raises, or under ``dataset.on_corrupt == "skip"`` is left out: the batch is rebuilt
        from the other items (never padded with another sample) and ``batch["skipped"]`` lists what was left
        out (dicts of :class:`eagle_io.feed.SkippedRecord` fields). An item that ``max_length`` truncation left
        with no supervised token is left out the same way and listed in ``batch["unsupervised"]`` (dicts of
        :class:`eagle_io.feed.UnsupervisedSample` fields)."""
        if len(indices) == 0:
            raise InvalidArgumentError("cannot collate an empty list of items")
        specs = {s.name: s for s in dataset.schema}
        states = {n: ((specs[n].width,), getattr(torch, specs[n].dtype)) for n in _STATES}
        todo, skipped = list(indices), []
        while True:
            lengths = [dataset.length(i) for i in todo]
            batch, slots = self._allocate(lengths, states, empty)
            rows = [
                (i, {name: batch[name][row, start : start + n] for name in _ROWS})
                for i, (row, start), n in zip(todo, slots, lengths, strict=True)
            ]
            try:
                done = dataset.read_many(rows)  # every row of the batch in one GIL-free call
                break
            except CorruptRecordError as e:
                skipped.append(asdict(dataset.record_skip(todo[e.item], e)))  # raises unless on_corrupt="skip"
                del todo[e.item]  # rare: rebuild the batch without it (its shapes change)
        unsupervised = []
        if dataset.max_length is not None:
            for k, (i, (row, start), n) in enumerate(zip(todo, slots, lengths, strict=True)):
                rec = dataset.truncated_unsupervised(i, batch["loss_mask"][row, start : start + n])
                if rec is not None:
                    unsupervised.append((k, asdict(rec)))
        if unsupervised:  # rebuilt from the kept items' decoded rows (copied, not decoded again)
            left = {k for k, _ in unsupervised}
            keep = [k for k in range(len(todo)) if k not in left]
            # Cloned first: ``empty`` may hand the new batch the old one's memory (a Loader slot's arena).
            kept = [
                {name: batch[name][r, s : s + lengths[k]].clone() for name in _ROWS}
                for k in keep
                for r, s in [slots[k]]
            ]
            batch, slots = self._allocate([lengths[k] for k in keep], states, empty)
            for (row, start), k, rows in zip(slots, keep, kept, strict=True):
                for name in _ROWS:
                    batch[name][row, start : start + lengths[k]] = rows[name]
            done = [done[k] for k in keep]
        batch["sample_ids"], batch["dataset_index"] = [sid for sid, _ in done], [d for _, d in done]
        batch["skipped"] = skipped
        batch["unsupervised"] = [rec for _, rec in unsupervised]
        return batch


class PaddingCollator(_Collator):
    """Right-pads ``B`` items to a common length ``T`` = the longest item, rounded up to ``pad_to_multiple_of``.

    Returns (``W = k*H``; states keep their stored dtype; CPU tensors):

    - ``input_ids`` ``[B, T]`` int64, ``pad_token_id`` at padded positions
    - ``attention_mask`` ``[B, T]`` int64: 1 on real tokens, 0 on padding
    - ``loss_mask`` ``[B, T]`` int64: the items' masks, 0 on padding (not shifted)
    - ``position_ids`` ``[B, T]`` int64: ``0 .. T-1`` in every row
    - ``aux_hidden_states`` ``[B, T, W]``, ``hidden_states`` ``[B, T, H]``: 0 on padding
    - ``lengths`` ``[B]`` int64: each item's ``L``
    - ``sample_ids``, ``dataset_index``: lists of ``B`` ints (sample ids are u64, so not a tensor)
    - ``skipped``: records left out under ``ShardDataset(on_corrupt="skip")``, as dicts (empty otherwise); when
      every item was, ``B`` is 0
    - ``unsupervised``: items left out because ``ShardDataset(max_length=...)`` truncation left them no supervised
      token, as dicts (:class:`eagle_io.feed.UnsupervisedSample`)

    Takes a list of items (``ShardDataset`` items or equal dicts); given ``ShardDataset`` items through a
    DataLoader (``ShardDataset.__getitems__``), it decodes them straight into the batch.

    Raises:
        InvalidArgumentError: no items, or items whose tensors disagree (rows, state widths, dtypes).
    """

    def __init__(self, *, pad_to_multiple_of: int | None = None, pad_token_id: int = 0) -> None:
        if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
            raise InvalidArgumentError(f"pad_to_multiple_of must be >= 1, got {pad_to_multiple_of}")
        self.pad_to_multiple_of = pad_to_multiple_of
        self.pad_token_id = pad_token_id

    def _allocate(self, lengths, states, empty):
        B, T = len(lengths), max(lengths, default=0)
        if self.pad_to_multiple_of:
            T = -(-T // self.pad_to_multiple_of) * self.pad_to_multiple_of
        lens = np.asarray(lengths, dtype=np.int64)
        batch = {name: empty(name, (B, T), torch.int64) for name in _INT_ENTRIES}
        batch["input_ids"].numpy().fill(self.pad_token_id)
        batch["attention_mask"].numpy()[:] = np.arange(T)[None, :] < lens[:, None]
        batch["loss_mask"].numpy().fill(0)
        batch["position_ids"].numpy()[:] = np.arange(T)
        for name, (tail, dtype) in states.items():
            out = batch[name] = empty(name, (B, T, *tail), dtype)
            for b, n in enumerate(lengths):
                _zero_rows(out[b, n:])
        batch["lengths"] = empty("lengths", (B,), torch.int64)
        batch["lengths"].numpy()[:] = lens
        return batch, [(b, 0) for b in range(B)]


class PackingCollator(_Collator):
    """Packs items end to end into one row of ``N`` tokens, ``N = max_tokens`` (or the items' total when
    ``pad_to_max_tokens`` is False), for varlen attention.

    Returns (``n`` items, ``S = sum(L)`` real tokens; states keep their stored dtype; CPU tensors):

    - ``input_ids`` ``[1, N]`` int64, ``pad_token_id`` on the tail ``[S, N)``
    - ``attention_mask`` ``[1, N]`` int64: 1 on the ``S`` real tokens, 0 on the tail. It does *not* separate
      samples: attention must be block-diagonal, from ``cu_seqlens`` (or ``position_ids``)
    - ``loss_mask`` ``[1, N]`` int64: the items' masks, 0 on the tail (not shifted)
    - ``position_ids`` ``[1, N]`` int64: ``0 .. L-1`` within each sample (restarting per sample), 0 on the tail
    - ``aux_hidden_states`` ``[1, N, W]``, ``hidden_states`` ``[1, N, H]``: 0 on the tail
    - ``cu_seqlens`` ``[n + 1]`` int32: ``0, L0, L0+L1, ..., S`` (real tokens only; flash-attn's varlen layout)
    - ``max_seqlen`` int: the longest ``L``
    - ``lengths`` ``[n]`` int64, ``sample_ids``, ``dataset_index``: lists of ``n`` ints
    - ``skipped``, ``unsupervised``: as for :class:`PaddingCollator` (``n`` is 0 when every item was left out)

    Raises:
        InvalidArgumentError: the items hold more than ``max_tokens`` tokens (batch them with
            ``LengthGroupedBatchSampler(max_tokens=...)``), no items, or items whose tensors disagree.
    """

    def __init__(self, max_tokens: int, *, pad_to_max_tokens: bool = True, pad_token_id: int = 0) -> None:
        if max_tokens < 1:
            raise InvalidArgumentError(f"max_tokens must be >= 1, got {max_tokens}")
        self.max_tokens = max_tokens
        self.pad_to_max_tokens = pad_to_max_tokens
        self.pad_token_id = pad_token_id

    def _allocate(self, lengths, states, empty):
        total = sum(lengths)
        if total > self.max_tokens:
            raise InvalidArgumentError(
                f"{len(lengths)} items of {lengths} tokens hold {total} tokens > max_tokens={self.max_tokens}; "
                f"batch them with LengthGroupedBatchSampler(max_tokens={self.max_tokens})"
            )
        N = self.max_tokens if self.pad_to_max_tokens else total
        lens = np.asarray(lengths, dtype=np.int64)
        ends = np.cumsum(lens)
        batch = {name: empty(name, (1, N), torch.int64) for name in _INT_ENTRIES}
        batch["input_ids"].numpy().fill(self.pad_token_id)
        am = batch["attention_mask"].numpy()
        am[0, :total], am[0, total:] = 1, 0
        batch["loss_mask"].numpy().fill(0)
        pos = batch["position_ids"].numpy()
        pos[0, :total] = np.arange(total, dtype=np.int64) - np.repeat(ends - lens, lens)
        pos[0, total:] = 0
        for name, (tail, dtype) in states.items():
            out = batch[name] = empty(name, (1, N, *tail), dtype)
            _zero_rows(out[0, total:])
        cu = batch["cu_seqlens"] = empty("cu_seqlens", (len(lengths) + 1,), torch.int32)
        cu.numpy()[0], cu.numpy()[1:] = 0, ends
        batch["max_seqlen"] = max(lengths, default=0)
        batch["lengths"] = empty("lengths", (len(lengths),), torch.int64)
        batch["lengths"].numpy()[:] = lens
        return batch, [(0, int(s)) for s in (ends - lens).tolist()]


LOSS_MASK_ALIGNMENTS = ("target", "specforge")


def has_next_token(attention_mask: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` bool: True where position ``t`` and ``t + 1`` are real tokens of the same sample (``t + 1``
    continues ``t``'s positions). False on the last position of each sample, on padding and on the last column."""
    real = attention_mask.bool()
    out = torch.zeros_like(real)
    out[:, :-1] = real[:, :-1] & real[:, 1:] & (position_ids[:, 1:] == position_ids[:, :-1] + 1)
    return out


def _shift_left(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``out[:, t] = x[:, t + 1]`` where ``keep[:, t]``, else 0 (``keep`` is ``[B, T]``; ``x`` is ``[B, T, ...]``)."""
    out = torch.zeros_like(x)
    out[:, :-1] = x[:, 1:]
    mask = keep.reshape(*keep.shape, *([1] * (x.dim() - 2)))
    return out.masked_fill(~mask, 0)


def shift_targets(batch: Mapping[str, Any], *, loss_mask: str = "target") -> dict[str, Any]:
    """Applies the EAGLE-3 shift to a batch of :class:`PaddingCollator` or :class:`PackingCollator` (on any
    device). Returns a new dict: the batch's entries, plus

    - ``next_input_ids`` ``[B, T]`` int64: ``input_ids[:, t + 1]`` (the token the draft embeds at ``t``;
      SpecForge's shifted ``input_ids``), 0 where there is no next token
    - ``target_hidden_states`` ``[B, T, H]``: ``hidden_states[:, t + 1]`` (SpecForge's ``target``), 0 where there is
      no next token; never taken from another sample or from padding
    - ``has_target`` ``[B, T]`` bool: ``t + 1`` is a real token of the same sample (:func:`has_next_token`)
    - ``loss_mask`` ``[B, T]`` int64, replaced by the shifted mask (``has_target`` is 0 => mask is 0):

      * ``loss_mask="target"`` (default): ``loss_mask[:, t + 1] * has_target`` -- position ``t`` is trained when
        the token whose state it predicts (``t + 1``) is a trained token; the mask moves with the targets.
      * ``loss_mask="specforge"``: ``loss_mask[:, t] * has_target`` -- SpecForge's ``process_data``, which keeps
        the mask unshifted and only zeroes the last position. The two differ at the edges of each masked span.
    - ``token_loss_mask`` ``[B, T]``: the unshifted mask, as collated.

    ``aux_hidden_states`` (the draft's input at ``t``) stay in place. Needs ``input_ids``, ``attention_mask``,
    ``position_ids``, ``loss_mask`` and ``hidden_states``.

    Raises:
        InvalidArgumentError: an unknown ``loss_mask`` alignment, or a missing key.
    """
    if loss_mask not in LOSS_MASK_ALIGNMENTS:
        raise InvalidArgumentError(f"loss_mask must be one of {LOSS_MASK_ALIGNMENTS}, got {loss_mask!r}")
    needed = ("input_ids", "attention_mask", "position_ids", "loss_mask", "hidden_states")
    missing = [k for k in needed if k not in batch]
    if missing:
        raise InvalidArgumentError(f"shift_targets needs batch keys {missing} (as the collators give)")
    has = has_next_token(batch["attention_mask"], batch["position_ids"])
    mask = batch["loss_mask"]
    shifted = _shift_left(mask, has) if loss_mask == "target" else mask.masked_fill(~has, 0)
    return {
        **batch,
        "next_input_ids": _shift_left(batch["input_ids"], has),
        "target_hidden_states": _shift_left(batch["hidden_states"], has),
        "has_target": has,
        "loss_mask": shifted,
        "token_loss_mask": mask,
    }
