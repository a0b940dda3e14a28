"""Rank-aware, seeded, resumable samplers for :class:`eagle_io.feed.ShardDataset`.

Orders depend only on ``(seed, epoch, n)`` and the lengths: permutations come from a splitmix64 hash of
``(seed, epoch, salt, index)`` sorted with numpy (no RNG whose stream a library upgrade could change), so a run
resumes to the same batches on another machine or after an upgrade.

Uneven splits (``uneven=``), when the epoch's batches (or samples, for :class:`RankSampler`) do not divide by
``world_size``:

- ``"pad"`` (default): the first ones of the epoch's order are repeated (cyclically) until they divide, so every
  rank runs the same number of steps (what DDP needs) and no sample is left out; the repeated count is reported
  by ``epoch_stats``. Those samples are seen twice in that epoch.
- ``"drop"``: the last ones of the epoch's order are left out for that epoch (a different set every epoch when
  shuffled); the count is reported by ``epoch_stats``. Ranks run the same number of steps.
- ``"uneven"``: nothing repeated or dropped; ranks differ by at most one step (DDP collectives would hang).
- ``"split"`` (:class:`LengthGroupedBatchSampler` only): exactly once *and* the same number of steps on every
  rank: the batches with the most items are cut in two (first half, then second half, in place) until their
  count divides by ``world_size``, so a few batches are smaller than the rest; nothing repeated or dropped. The
  cut batches are reported by ``epoch_stats`` (``split_batches``). Impossible when every batch holds one item and
  their count does not divide (an InvalidArgumentError says so).

Resume (both samplers): ``state_dict()`` / ``load_state_dict(state)`` follow torchdata's ``Stateful`` protocol, so
``torchdata.stateful_dataloader.StatefulDataLoader`` saves and restores them with its own ``state_dict()`` (it
snapshots the sampler when a batch index is handed to a worker, so prefetching is accounted for). Without it, pass
the consumed step count yourself: ``state_dict(step)``. A state taken after the last step of an epoch resumes at
step 0 of the next epoch when ``set_epoch`` selected it before the state is loaded (``load_state_dict``).
"""

from __future__ import annotations

import abc
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from ..errors import InvalidArgumentError

UNEVEN = ("pad", "drop", "uneven", "split")
_M64 = (1 << 64) - 1


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on a uint64 array (wrapping arithmetic)."""
    x = x.astype(np.uint64, copy=True)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def permutation(n: int, seed: int, epoch: int, salt: int = 0) -> np.ndarray:
    """A permutation of ``range(n)`` (int64) that depends only on ``(n, seed, epoch, salt)``."""
    key = np.array([seed & _M64], dtype=np.uint64)
    for part in (epoch, salt):
        key = _mix64(key ^ np.uint64(part & _M64))
    keys = _mix64(np.arange(n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + key)
    return np.argsort(keys, kind="stable").astype(np.int64)


def _lengths_of(lengths_or_dataset: Any) -> np.ndarray:
    src = lengths_or_dataset.lengths() if hasattr(lengths_or_dataset, "lengths") else lengths_or_dataset
    lens = np.asarray(src, dtype=np.int64).reshape(-1)
    if len(lens) and lens.min() < 0:
        raise InvalidArgumentError(f"lengths must be >= 0; position {int(np.argmin(lens))} has {int(lens.min())}")
    return lens


def _check_rank(rank: int, world_size: int, uneven: str) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise InvalidArgumentError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    if uneven not in UNEVEN:
        raise InvalidArgumentError(f"uneven must be one of {UNEVEN}, got {uneven!r}")


def _cut_until_divisible(batches: list, world_size: int) -> tuple[list, int]:
    """``"split"``: cuts the batches with the most items (the earliest of equals) in two, in place, until their
    count divides by ``world_size``; returns (batches, number of batches cut)."""
    batches, cut = list(batches), 0
    while len(batches) % world_size:
        j = max(range(len(batches)), key=lambda k: (len(batches[k]), -k))
        b = batches[j]
        if len(b) < 2:
            raise InvalidArgumentError(
                f'uneven="split" cannot give world_size={world_size} ranks the same step count: the epoch has '
                f"{len(batches)} batches of one item ({sum(map(len, batches))} items); use a larger batch_size or "
                f'max_tokens, or uneven="pad"/"drop"'
            )
        half = (len(b) + 1) // 2
        batches[j : j + 1] = [b[:half], b[half:]]
        cut += 1
    return batches, cut


def _split(units: list, world_size: int, uneven: str) -> tuple[list, int, int]:
    """Makes ``len(units)`` divide by ``world_size`` per ``uneven`` (not ``"split"``); returns (units, repeated,
    dropped)."""
    extra = len(units) % world_size
    if extra == 0 or uneven == "uneven" or not units:
        return units, 0, 0
    if uneven == "drop":
        return units[: len(units) - extra], 0, extra
    need = world_size - extra
    return units + [units[i % len(units)] for i in range(need)], need, 0


class _Resumable(abc.ABC):
    """``set_epoch(epoch, start)`` / ``state_dict(consumed)`` / ``load_state_dict`` shared by the samplers.

    ``position`` counts the steps of the current epoch that iteration has handed out (from ``start``); it is
    what ``state_dict()`` saves when no step count is given (torchdata's ``StatefulDataLoader`` protocol)."""

    epoch: int
    start: int
    position: int

    @abc.abstractmethod
    def _identity(self) -> dict[str, Any]:
        """What must match for a saved state to load: the sampler's kind and settings."""

    @abc.abstractmethod
    def _steps(self, epoch: int) -> list:
        """This rank's steps (batches or items) of ``epoch``, from step 0."""

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        """Selects the epoch (its order) and the step to start at; the epoch holds until the next ``set_epoch``,
        the start step until a pass runs to the epoch's end (later passes start at step 0)."""
        if epoch < 0 or start_step < 0:
            raise InvalidArgumentError(f"epoch and start_step must be >= 0, got {epoch}, {start_step}")
        self.epoch, self.start, self.position = epoch, start_step, start_step

    def __iter__(self) -> Iterator:
        steps = self._steps(self.epoch)
        for i in range(self.start, len(steps)):
            self.position = i + 1  # counted before the hand-out: a state taken right after it includes it
            yield steps[i]
        self.start = 0  # a resumed pass ran to its end: the next pass over this epoch runs whole, as it would have

    def __len__(self) -> int:
        return max(0, len(self._steps(self.epoch)) - self.start)

    def state_dict(self, step: int | None = None) -> dict[str, Any]:
        """The resume point after ``step`` steps of the current epoch were *consumed* by training; by default
        (``step=None``) the steps iteration has handed out so far (:attr:`position`), which is what torchdata's
        ``StatefulDataLoader`` expects: it calls ``state_dict()`` when it hands a batch to a worker and keeps the
        state until that batch reaches the training loop. With a plain ``DataLoader`` the sampler runs ahead of
        the training loop (prefetch), so pass the consumed step count.

        Returns:
            a dict of ints, bools and strings (JSON-serialisable): the sampler's settings, ``epoch`` and ``step``.

        Raises:
            InvalidArgumentError: a negative ``step``.
        """
        step = self.position if step is None else int(step)
        if step < 0:
            raise InvalidArgumentError(f"step must be >= 0, got {step}")
        return {**self._identity(), "epoch": self.epoch, "step": step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resumes at ``(state["epoch"], state["step"])``: the next iteration yields exactly the steps a run that
        was not interrupted would have yielded after that point. A state saved after the last step of its epoch
        ``e`` resumes as that epoch's empty remainder, unless ``set_epoch`` already moved this sampler past ``e``
        (a loop that calls ``set_epoch(e + 1)`` before iterating, whose StatefulDataLoader loads the state when
        the iteration starts): then that epoch starts at step 0. (Do not call ``set_epoch`` after loading for
        the resumed epoch: that restarts it at step 0.)

        Raises:
            InvalidArgumentError: the state comes from a sampler with other settings or data (the message names
                the setting and both values): resuming would not continue the same order.
        """
        for key, mine in self._identity().items():
            if state.get(key) != mine:
                raise InvalidArgumentError(
                    f"cannot resume: sampler state has {key}={state.get(key)!r} but this sampler has {key}={mine!r}"
                )
        epoch, step = int(state["epoch"]), int(state["step"])
        if self.epoch > epoch and step >= len(self._steps(epoch)):
            epoch, step = self.epoch, 0
        self.set_epoch(epoch, step)


class LengthGroupedBatchSampler(_Resumable, torch.utils.data.Sampler[list[int]]):
    """Batches of item indices with similar lengths, split across ranks; pass as ``DataLoader(batch_sampler=...)``.

    Each epoch: a seeded permutation of all items; consecutive groups of ``group_size`` items are each sorted by
    length (longest first, when ``group_by_length``); the sequence is cut into batches of ``batch_size`` items
    (the last may be smaller) or, with ``max_tokens``, greedily into batches with ``len(batch) * max(L) <=
    max_tokens`` (a bound on both the padded ``B x T`` of :class:`PaddingCollator` and the packed tokens of
    :class:`PackingCollator`); the batch order is shuffled (seeded); batch ``j`` goes to rank ``j % world_size``
    after the uneven split (module docstring). Ranks are disjoint except for batches repeated by ``"pad"``, and
    together cover every item every epoch (except those ``"drop"`` leaves out).

    Args:
        lengths: item token counts (``ShardDataset.lengths()``), or an object with a ``lengths()`` method.
        batch_size: items per batch; exactly one of ``batch_size`` and ``max_tokens``.
        max_tokens: token budget per batch (see above).
        rank, world_size: this process's rank and the number of ranks.
        seed: the run's seed; the order is a function of ``(seed, epoch, lengths)`` only.
        shuffle: permute items and batches; False keeps index order (still grouped and split).
        group_by_length: sort each group by length; False gives plain random batches.
        group_size: items per sorted group (default ``64 x batch_size``, or 1024 with ``max_tokens``).
        uneven: ``"pad"``, ``"drop"``, ``"uneven"`` or ``"split"`` (module docstring; ``"split"`` is the one that
            gives every item exactly once per epoch *and* the same step count on every rank).

    Resume: ``set_epoch(epoch, start_step)``; ``state_dict(step)`` / ``load_state_dict(state)``, or
    ``state_dict()`` through torchdata's ``StatefulDataLoader(batch_sampler=...)`` (module docstring). ``len()``
    is the number of batches this rank yields from ``start_step`` to the end of the epoch.

    Raises:
        InvalidArgumentError: both or neither of ``batch_size``/``max_tokens``; an item longer than
            ``max_tokens`` (names it; truncate with ``ShardDataset(max_length=...)``); a bad rank or ``uneven``;
            ``uneven="split"`` when the batches cannot be cut to a multiple of ``world_size`` (when the epoch is
            planned).
    """

    def __init__(
        self,
        lengths: Sequence[int] | Any,
        *,
        batch_size: int | None = None,
        max_tokens: int | None = None,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        group_by_length: bool = True,
        group_size: int | None = None,
        uneven: str = "pad",
    ) -> None:
        if (batch_size is None) == (max_tokens is None):
            raise InvalidArgumentError("give exactly one of batch_size and max_tokens")
        if (batch_size is not None and batch_size < 1) or (max_tokens is not None and max_tokens < 1):
            raise InvalidArgumentError(f"batch_size and max_tokens must be >= 1, got {batch_size}, {max_tokens}")
        _check_rank(rank, world_size, uneven)
        self.lengths = _lengths_of(lengths)
        self._lengths_crc32 = zlib.crc32(self.lengths.tobytes())  # state_dict() runs once per batch handed out
        if max_tokens is not None and len(self.lengths) and self.lengths.max() > max_tokens:
            i = int(np.argmax(self.lengths))
            raise InvalidArgumentError(
                f"item {i} has {int(self.lengths[i])} tokens > max_tokens={max_tokens}; truncate with "
                f"ShardDataset(max_length={max_tokens}) or raise max_tokens"
            )
        self.batch_size, self.max_tokens = batch_size, max_tokens
        self.rank, self.world_size, self.seed, self.shuffle = rank, world_size, seed, shuffle
        self.group_by_length, self.uneven = group_by_length, uneven
        self.group_size = group_size or (64 * batch_size if batch_size else 1024)
        self.epoch, self.start, self.position = 0, 0, 0
        self._cache: tuple[int, list[list[int]], dict[str, int]] | None = None

    def _identity(self) -> dict[str, Any]:
        return {
            "kind": "LengthGroupedBatchSampler",
            "n_items": len(self.lengths),
            "lengths_crc32": self._lengths_crc32,
            "batch_size": self.batch_size,
            "max_tokens": self.max_tokens,
            "rank": self.rank,
            "world_size": self.world_size,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "group_by_length": self.group_by_length,
            "group_size": self.group_size,
            "uneven": self.uneven,
        }

    def _all_batches(self, epoch: int) -> list[np.ndarray]:
        n = len(self.lengths)
        order = permutation(n, self.seed, epoch) if self.shuffle else np.arange(n, dtype=np.int64)
        if self.group_by_length:
            groups = []
            for s in range(0, n, self.group_size):
                g = order[s : s + self.group_size]
                groups.append(g[np.argsort(-self.lengths[g], kind="stable")])
            order = np.concatenate(groups) if groups else order
        if self.batch_size is not None:
            batches = [order[s : s + self.batch_size] for s in range(0, n, self.batch_size)]
        else:
            batches, start, longest = [], 0, 0
            for i, length in enumerate(self.lengths[order].tolist()):
                if i > start and (i - start + 1) * max(longest, length) > self.max_tokens:
                    batches.append(order[start:i])
                    start, longest = i, length
                else:
                    longest = max(longest, length)
            if start < n:
                batches.append(order[start:n])
        if self.shuffle:
            batches = [batches[j] for j in permutation(len(batches), self.seed, epoch, salt=1)]
        return batches

    def _plan(self, epoch: int) -> tuple[list[list[int]], dict[str, int]]:
        if self._cache is None or self._cache[0] != epoch:
            batches, cut = self._all_batches(epoch), 0
            if self.uneven == "split":
                batches, cut = _cut_until_divisible(batches, self.world_size)
            split, repeated, dropped = _split(batches, self.world_size, self.uneven)
            mine = [b.tolist() for b in split[self.rank :: self.world_size]]
            stats = {
                "batches": len(batches),
                "repeated_batches": repeated,
                "repeated_items": sum(len(b) for b in split[len(batches) :]),
                "dropped_batches": dropped,
                "dropped_items": sum(len(b) for b in batches[len(split) :]),
                "split_batches": cut,
                "rank_batches": len(mine),
            }
            self._cache = (epoch, mine, stats)
        return self._cache[1], self._cache[2]

    def epoch_stats(self, epoch: int | None = None) -> dict[str, int]:
        """For ``epoch`` (default: the current one): ``batches`` (all ranks, before the uneven split),
        ``repeated_batches``/``repeated_items`` (by ``"pad"``), ``dropped_batches``/``dropped_items`` (by
        ``"drop"``), ``split_batches`` (cut in two by ``"split"``; ``batches`` counts the halves), ``rank_batches``
        (this rank's, from step 0)."""
        return dict(self._plan(self.epoch if epoch is None else epoch)[1])

    def batches(self, epoch: int | None = None) -> list[list[int]]:
        """This rank's batches of ``epoch`` (default: the current one), from step 0."""
        return [list(b) for b in self._plan(self.epoch if epoch is None else epoch)[0]]

    def _steps(self, epoch: int) -> list[list[int]]:
        return self._plan(epoch)[0]

    def __iter__(self) -> Iterator[list[int]]:
        yield from (list(b) for b in super().__iter__())


class RankSampler(_Resumable, torch.utils.data.Sampler[int]):
    """Item indices for one rank: a seeded permutation of all ``n`` items per epoch, made to divide by
    ``world_size`` per ``uneven`` (module docstring), of which rank ``r`` takes positions ``r, r + W, ...``.
    Ranks are disjoint (except items repeated by ``"pad"``) and together cover all items every epoch (except
    those ``"drop"`` leaves out). Use with ``DataLoader(sampler=..., batch_size=B)``.

    Resume: ``set_epoch(epoch, start_step)`` where a step is one *item* of this rank (with ``DataLoader``
    batches of ``B``, resume at batch ``s`` with ``start_step = s * B``); ``state_dict(items_consumed)`` /
    ``load_state_dict(state)``, or ``state_dict()`` through torchdata's ``StatefulDataLoader(sampler=...,
    batch_size=B)`` (module docstring). ``len()`` is the number of items this rank yields from ``start_step``.

    Args:
        n: the number of items, or a sized dataset.
        rank, world_size, seed, shuffle, uneven: as for :class:`LengthGroupedBatchSampler` (``"split"`` excepted:
            items cannot be cut).
    """

    def __init__(
        self,
        n: int | Any,
        *,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        uneven: str = "pad",
    ) -> None:
        _check_rank(rank, world_size, uneven)
        if uneven == "split":
            raise InvalidArgumentError('uneven="split" cuts batches: use LengthGroupedBatchSampler for it')
        self.n = n if isinstance(n, int) else len(n)
        self.rank, self.world_size, self.seed, self.shuffle, self.uneven = rank, world_size, seed, shuffle, uneven
        self.epoch, self.start, self.position = 0, 0, 0
        self._cache: tuple[int, list[int], dict[str, int]] | None = None

    def _identity(self) -> dict[str, Any]:
        return {
            "kind": "RankSampler",
            "n_items": self.n,
            "rank": self.rank,
            "world_size": self.world_size,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "uneven": self.uneven,
        }

    def _plan(self, epoch: int) -> tuple[list[int], dict[str, int]]:
        if self._cache is None or self._cache[0] != epoch:
            order = permutation(self.n, self.seed, epoch) if self.shuffle else np.arange(self.n, dtype=np.int64)
            split, repeated, dropped = _split(order.tolist(), self.world_size, self.uneven)
            mine = split[self.rank :: self.world_size]
            stats = {"items": self.n, "repeated_items": repeated, "dropped_items": dropped, "rank_items": len(mine)}
            self._cache = (epoch, mine, stats)
        return self._cache[1], self._cache[2]

    def epoch_stats(self, epoch: int | None = None) -> dict[str, int]:
        """``items``, ``repeated_items`` (by ``"pad"``), ``dropped_items`` (by ``"drop"``), ``rank_items``."""
        return dict(self._plan(self.epoch if epoch is None else epoch)[1])

    def _steps(self, epoch: int) -> list[int]:
        return self._plan(epoch)[0]

    def __len__(self) -> int:
        n, W = self.n, self.world_size
        per = {"pad": -(-n // W), "drop": n // W, "uneven": n // W + (self.rank < n % W)}[self.uneven]
        return max(0, per - self.start)
