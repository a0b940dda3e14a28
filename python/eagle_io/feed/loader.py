"""``Loader``: the training feed without worker processes. A thread plans each batch and eagle-io's native decode
threads (GIL released) fill it straight into a small ring of reused batch buffers (:mod:`eagle_io.feed.ring`),
pinned when CUDA is there, optionally copied to the device on a side stream. DataLoader's argument names, so
swapping ``torch.utils.data.DataLoader(...)`` for ``Loader(...)`` is one line (drop ``num_workers`` and its
companions: decode threads are ``ShardDataset(threads=...)``).

Why threads: eagle-io's decode is native and releases the GIL, so worker processes only add what crossing
processes costs (shared-memory allocation, page faults, copies); FFCV, DALI and torchdata's thread-based nodes feed
GPUs the same way. benches/README.md has the measured comparison.
"""

from __future__ import annotations

import collections
import queue
import threading
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from ..errors import ArgumentTypeError, InvalidArgumentError
from ..host import available_memory
from ..store.manifest import data_fingerprint
from .collate import PaddingCollator, _Collator
from .dataset import ShardDataset
from .follow import FollowingShardDataset
from .ring import Ring, Slot, lease, tensors
from .samplers import RankSampler, _Resumable

_END = object()
"""The last work a source yields, with the loader state once every batch was taken (:meth:`Loader._source`)."""
_STATE_KEYS = ("batches", "finished", "sampler", "follow", "dataset")


class _Failed:
    """An exception raised in the producer thread, handed to the consumer to raise there."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Ended:
    """The end of a pass, handed to the consumer with the loader state it leaves (``finished``), or None when the
    pass was stopped before its end (the state after the last batch taken stands)."""

    def __init__(self, state: dict[str, Any] | None) -> None:
        self.state = state


#: What one batch slot costs before any batch is in it (the Python object and its bookkeeping), for the estimate of
#: ``prefetch`` + ``keep`` slots against the memory available.
SLOT_OVERHEAD_BYTES = 1024


def _largest_batch_bytes(dataset: Any, batch_size: int | None) -> int | None:
    """Bytes of the largest batch of ``batch_size`` items a :class:`ShardDataset` can make, padded to its longest
    item (the ``batch_size`` longest items, every schema tensor as read); None for another dataset."""
    if not isinstance(dataset, ShardDataset) or not batch_size:
        return None
    longest = sorted(dataset.lengths(), reverse=True)[:batch_size]
    if not longest:
        return 0
    row = sum(torch.empty(0, dtype=getattr(torch, s.dtype)).element_size() * (s.width or 1) for s in dataset.schema)
    return len(longest) * longest[0] * row


class Loader:
    """Batches of ``dataset`` decoded on eagle-io's native threads into reused buffers; iterates like a
    ``torch.utils.data.DataLoader`` and yields the same batch dicts (:class:`PaddingCollator` /
    :class:`PackingCollator`, or whatever ``collate_fn`` returns).

    Buffer-reuse contract: the tensors of a CPU batch are views of the loader's ring; batch ``k`` stays valid until
    the consumer takes batch ``k + keep`` (by default: until the next batch is asked for), and at the latest until
    the next pass over the loader starts (the buffers serve every epoch). ``clone()`` what is kept longer, or raise
    ``keep``. ``debug=True`` enforces it: any torch operation on a batch's tensor (or a view of it)
    after that raises :class:`eagle_io.errors.BatchRecycledError`, and a reused buffer is first filled with 0xFF (NaN
    in bf16), so reads around torch (``.numpy()``) see poison, not data (:mod:`eagle_io.feed.ring`). With
    ``device``, the batch is copied to it on a side stream and the yielded tensors are the device copies (fresh
    allocations from torch's caching allocator, valid as long as referenced); the pinned buffer is reused once its
    copy event completed. With ``pin_memory`` and no ``device``, a buffer is reused only after the work queued on
    the consumer's current CUDA stream when it was released (e.g. a ``.to(device, non_blocking=True)`` of it) is
    done.

    Args:
        dataset: a :class:`ShardDataset` (decoded straight into the batch by the eagle-io collators), a
            ``ShardDataset(follow=True)`` (:class:`FollowingShardDataset`: ``batch_size`` items in commit order;
            no sampler), or any map-style dataset (its items collated into the buffers).
        batch_size, shuffle, sampler, batch_sampler, drop_last: as for ``DataLoader``: ``batch_sampler`` (e.g.
            :class:`LengthGroupedBatchSampler`) excludes the other four; ``sampler`` (e.g. :class:`RankSampler`)
            is cut into batches of ``batch_size``; ``shuffle=True`` is ``RankSampler(dataset, seed=seed)``, a new
            order each iteration (epoch 0, 1, ...).
        collate_fn: default :class:`PaddingCollator()`. An eagle-io collator fills the ring's buffers; any other
            callable gets the items (``ShardDataset.__getitems__``) and its batch is not reused.
        prefetch: batches decoded ahead of the consumer (>= 1).
        keep: batches the consumer may hold at once (>= 1): see the contract above.
        pin_memory: pinned (page-locked) buffers when CUDA is available; without CUDA, plain ones and a warning.
        device: a CUDA device to copy each batch to (``non_blocking``, on a side stream, the consumer's stream
            waiting on the copy's event); None or ``"cpu"``: CPU batches.
        debug: enforce the buffer-reuse contract (above); slower, for tests and debugging.
        seed: the seed of ``shuffle=True``.

    Checkpointing follows torchdata's ``StatefulDataLoader``: :meth:`state_dict` is the position after the batches
    the consumer has *taken* (not those decoded ahead); :meth:`load_state_dict` applies at the next iteration, which
    continues exactly there. Through a resumable sampler (:class:`RankSampler`, :class:`LengthGroupedBatchSampler`)
    the state is the sampler's own, so each rank of a distributed run resumes its share exactly once; through a
    sampler without ``state_dict`` the next iteration skips the batches already taken (exact for deterministic
    orders only); through a :class:`FollowingShardDataset`, the next position per followed capture.

    Errors raised while decoding (:class:`eagle_io.CorruptRecordError` naming shard, sample id and offset, under
    ``on_corrupt="raise"``) are raised in the consumer's thread by the ``next()`` that would have returned that
    batch; the iteration then ends. Leaving an iteration (``break``, an exception, Ctrl-C, the iterator
    garbage-collected, or :meth:`close`) stops and joins its thread: none is left behind.

    Raises:
        InvalidArgumentError: ``batch_sampler`` with ``batch_size``/``shuffle``/``sampler``/``drop_last``,
            ``shuffle`` with ``sampler``, a sampler for a followed dataset, ``prefetch`` or ``keep`` < 1, a
            ``device`` that is neither CPU nor an available CUDA device, or a state from another kind of loader.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        *,
        shuffle: bool = False,
        sampler: Any = None,
        batch_sampler: Any = None,
        collate_fn: Any = None,
        drop_last: bool = False,
        prefetch: int = 2,
        keep: int = 1,
        pin_memory: bool = False,
        device: str | torch.device | None = None,
        debug: bool = False,
        seed: int = 0,
    ) -> None:
        for name, value in (("prefetch", prefetch), ("keep", keep)):
            if type(value) is not int or value < 1:
                raise InvalidArgumentError(f"Loader {name} must be an integer >= 1, got {value!r}")
        self.dataset = dataset
        self.collate_fn = PaddingCollator() if collate_fn is None else collate_fn
        self.prefetch, self.keep, self.debug = prefetch, keep, debug
        self._follow = isinstance(dataset, FollowingShardDataset)
        self._owns_shuffle = False
        if self._follow:
            if sampler is not None or batch_sampler is not None or shuffle:
                raise InvalidArgumentError("a followed dataset (follow=True) yields in commit order: no sampler")
            if batch_size is None or batch_size < 1:
                raise InvalidArgumentError(f"batch_size must be >= 1, got {batch_size}")
            self.batch_size, self.drop_last, self.batch_sampler, self._stateful = batch_size, drop_last, None, None
        elif batch_sampler is not None:
            if batch_size not in (None, 1) or shuffle or sampler is not None or drop_last:
                raise InvalidArgumentError(
                    "batch_sampler is mutually exclusive with batch_size, shuffle, sampler and drop_last"
                )
            self.batch_size, self.drop_last, self.batch_sampler = None, False, batch_sampler
            self._stateful = batch_sampler if _is_stateful(batch_sampler) else None
        else:
            if batch_size is None or batch_size < 1:
                raise InvalidArgumentError(f"batch_size must be >= 1 (or pass batch_sampler), got {batch_size}")
            if shuffle and sampler is not None:
                raise InvalidArgumentError("sampler is mutually exclusive with shuffle")
            if shuffle:
                sampler, self._owns_shuffle = RankSampler(len(dataset), seed=seed), True
            elif sampler is None:
                sampler = torch.utils.data.SequentialSampler(dataset)
            self.batch_size, self.drop_last = batch_size, drop_last
            self.batch_sampler = torch.utils.data.BatchSampler(sampler, batch_size, drop_last)
            self._stateful = sampler if _is_stateful(sampler) else None
        #: The data's fingerprint (:func:`eagle_io.store.manifest.data_fingerprint`; None for a followed or a
        #: non-eagle-io dataset), carried by :meth:`state_dict` and compared by :meth:`load_state_dict`.
        self._fingerprint = (
            data_fingerprint([d.manifest for d in dataset.datasets]) if isinstance(dataset, ShardDataset) else None
        )
        prefetch, keep = self._bounded(prefetch, keep)
        self.prefetch, self.keep = prefetch, keep
        self.device = _check_device(device)
        cuda = torch.cuda.is_available()
        if pin_memory and not cuda:
            warnings.warn("Loader(pin_memory=True): CUDA is not available, so the batch buffers are not pinned",
                          stacklevel=2)  # fmt: skip
        self.pin_memory = (pin_memory or self.device is not None) and cuda
        # The ring's slots, kept from pass to pass; with a device copy the slots are only staging, reused as soon
        # as their copy completed, so `keep` needs none.
        n_slots = prefetch if self.device is not None else prefetch + keep
        self._slots = [Slot(i, self.pin_memory) for i in range(n_slots)]
        self._epochs = 0  # iterations started, for shuffle=True
        self._pending: dict[str, Any] | None = None
        self._state: dict[str, Any] | None = None  # after the last batch taken; None before any iteration
        self._close_active: _Stop | None = None

    def _bounded(self, prefetch: int, keep: int) -> tuple[int, int]:
        """``prefetch`` and ``keep`` bounded by the data: no more batches ahead or kept than there are batches (a
        sampler with a length), and their buffers estimated before any is made: refused, with the figures, when
        they would not fit in the memory available.

        Raises:
            InvalidArgumentError: the estimate exceeds the memory available.
        """
        batches = None
        if not self._follow:
            try:
                batches = len(self.batch_sampler)
            except TypeError:  # a batch sampler without a length
                batches = None
        if batches is not None:
            prefetch, keep = min(prefetch, max(batches, 1)), min(keep, max(batches, 1))
        slots = prefetch + keep
        per_batch = _largest_batch_bytes(self.dataset, self.batch_size)
        need = slots * (SLOT_OVERHEAD_BYTES + (per_batch or 0))
        free = available_memory()
        if free is not None and need > free:
            what = f" and up to {per_batch:,} bytes of batch each" if per_batch else ""
            raise InvalidArgumentError(
                f"Loader(prefetch={prefetch}, keep={keep}): {slots:,} batch buffers ({SLOT_OVERHEAD_BYTES} bytes of "
                f"bookkeeping{what}: batch_size x the longest items x bytes per token) need about {need:,} bytes, "
                f"more than the {free:,} bytes of memory available: lower prefetch (2 keeps the reader ahead)"
            )
        return prefetch, keep

    def _fresh_state(self) -> dict[str, Any]:
        sampler = None if self._stateful is None else self._stateful.state_dict()
        follow = [0] * len(self.dataset.manifests) if self._follow else None
        return {"batches": 0, "finished": False, "sampler": sampler, "follow": follow, "dataset": self._fingerprint}

    def __len__(self) -> int:
        if self._follow:
            raise ArgumentTypeError("a followed dataset (follow=True) has no length until its captures complete")
        return len(self.batch_sampler)

    def state_dict(self) -> dict[str, Any]:
        """The resume point after the batches taken so far in the current (or last) iteration: ``batches``
        (taken), ``finished`` (the iteration ended), ``sampler`` (the resumable sampler's ``state_dict()`` after
        them, or None), ``follow`` (per followed capture, the next position, or None) and ``dataset`` (the data's
        fingerprint, or None). JSON-serialisable."""
        if self._pending is not None:
            return dict(self._pending)
        return self._fresh_state() if self._state is None else dict(self._state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resumes at ``state`` (from :meth:`state_dict` of a loader over the same data and sampler settings) when
        the next iteration starts. A state saved when an iteration had finished starts the next epoch.

        Raises:
            InvalidArgumentError: ``state`` is not a Loader state, was saved over other data (its ``dataset``
                fingerprint differs), or its sampler/follow part does not fit this loader (the sampler's own
                ``load_state_dict`` names a differing setting when it runs).
        """
        # A state saved before it carried the dataset's fingerprint has the other keys only.
        if not isinstance(state, dict) or set(state) not in (set(_STATE_KEYS), set(_STATE_KEYS) - {"dataset"}):
            raise InvalidArgumentError(f"not a Loader state (keys {_STATE_KEYS}): {state!r}")
        theirs, mine = state.get("dataset"), self._fingerprint
        if theirs is not None and mine is not None and theirs != mine:  # the count alone was compared
            raise InvalidArgumentError(
                f"cannot resume: the state was saved over other data (dataset fingerprint {str(theirs)[:16]}...) "
                f"than this loader's {self.dataset!r} ({mine[:16]}...): the same sample count is not the same samples"
            )
        state = {**state, "dataset": mine}
        if (state["sampler"] is not None) != (self._stateful is not None):
            raise InvalidArgumentError("the state's sampler part does not fit this loader's sampler")
        if (state["follow"] is not None) != self._follow or (
            self._follow and len(state["follow"]) != len(self.dataset.manifests)
        ):
            raise InvalidArgumentError("the state's follow part does not fit this loader's dataset")
        self._pending = dict(state)

    def close(self) -> None:
        """Stops the current iteration, if any, and joins its thread."""
        if self._close_active is not None:
            self._close_active()

    def __iter__(self) -> Iterator[Any]:
        self.close()  # one iteration at a time, like DataLoader's in-process iterator
        state, self._pending = self._pending, None
        skip = 0
        if state is not None:
            if self._stateful is not None:
                self._stateful.load_state_dict(state["sampler"])
                if self._owns_shuffle:
                    self._epochs = self._stateful.epoch + 1
                    if state["finished"]:
                        self._stateful.set_epoch(self._epochs)
                        self._epochs += 1
                elif state["finished"] and isinstance(self._stateful, _Resumable) and len(self._stateful) == 0:
                    # Left at the end of the finished epoch (no set_epoch moved it past): the next pass runs that
                    # epoch again from step 0, as the uninterrupted loader's next pass would.
                    self._stateful.set_epoch(self._stateful.epoch)
            elif not state["finished"] and not self._follow:
                skip = state["batches"]
            taken = 0 if state["finished"] else state["batches"]
            follow = state["follow"] if self._follow and not state["finished"] else None
            self._state = state if not state["finished"] else self._fresh_state()
        else:
            if self._owns_shuffle:
                self._stateful.set_epoch(self._epochs)
                self._epochs += 1
            taken, follow = 0, None
            self._state = self._fresh_state()
        it, self._close_active = _start(self, self._source(skip, taken, follow, stopped := threading.Event()), stopped)
        return it

    def _source(self, skip: int, taken: int, follow: list[int] | None, stopped: threading.Event):
        """A generator (run by the producer thread) of ``(work, state after it)`` per batch: the item indices
        (map-style) or items (followed) of the batch, and the loader state once it is taken; then ``(_END, the
        finished state)``, or ``(_END, None)`` when ``stopped`` ended a followed dataset's waiting for its captures."""
        if self._follow:
            return self._follow_source(taken, follow, stopped)
        return self._map_source(skip, taken)

    def _map_source(self, skip: int, taken: int):
        stateful = self._stateful
        for k, indices in enumerate(self.batch_sampler):
            if k < skip:
                continue
            taken += 1
            sampler = None if stateful is None else stateful.state_dict()
            yield (
                list(indices),
                {"batches": taken, "finished": False, "sampler": sampler, "follow": None, "dataset": self._fingerprint},
            )
        # The sampler's state once the batch sampler drained it: with drop_last, past the items of a dropped last
        # batch too, so that it reads as the end of its epoch (the state after the last batch does not).
        sampler = None if stateful is None else stateful.state_dict()
        yield (
            _END,
            {"batches": taken, "finished": True, "sampler": sampler, "follow": None, "dataset": self._fingerprint},
        )

    def _follow_source(self, taken: int, start: list[int] | None, stopped: threading.Event):
        nexts = list(start) if start is not None else [0] * len(self.dataset.manifests)
        items: list[Any] = []
        for d, p, item in self.dataset.entries(nexts, stopped):
            items.append(item)
            nexts[d] = p + 1
            if len(items) == self.batch_size:
                taken += 1
                yield (
                    items,
                    {"batches": taken, "finished": False, "sampler": None, "follow": list(nexts), "dataset": None},
                )
                items = []
        if stopped.is_set():  # closed while waiting for the captures: not their end, the state stays
            yield _END, None
            return
        if items and not self.drop_last:
            taken += 1
            yield items, {"batches": taken, "finished": False, "sampler": None, "follow": list(nexts), "dataset": None}
        yield _END, {"batches": taken, "finished": True, "sampler": None, "follow": list(nexts), "dataset": None}

    def _build(self, work: Any, slot: Slot, k: int) -> Any:
        """Batch ``k`` from ``work`` (see :meth:`_source`), its tensors in ``slot``'s buffers."""
        ds, fn = self.dataset, self.collate_fn
        ours = isinstance(fn, _Collator)
        if ours and isinstance(ds, ShardDataset):
            batch = fn.collate_from(ds, work, empty=slot.empty)
        else:
            if self._follow:
                items = work
            elif hasattr(ds, "__getitems__"):
                items = ds.__getitems__(work)
            else:
                items = [ds[i] for i in work]
            batch = fn(items, empty=slot.empty) if ours else fn(items)
        if self.debug and self.device is None and isinstance(batch, dict):
            arenas = {a.untyped_storage().data_ptr() for a in slot.arenas.values()}
            for key, v in batch.items():
                if isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() in arenas:
                    batch[key] = lease(v, slot, k, key, self.keep)
        return batch

    def __repr__(self) -> str:
        return (
            f"Loader({self.dataset!r}, prefetch={self.prefetch}, keep={self.keep}, pin_memory={self.pin_memory}, "
            f"device={self.device})"
        )


def _is_stateful(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def _check_device(device: Any) -> torch.device | None:
    if device is None:
        return None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise InvalidArgumentError(f"device {device!r}: {e}") from e
    if dev.type == "cpu":
        return None
    if dev.type != "cuda" or not torch.cuda.is_available():
        cuda = "available" if torch.cuda.is_available() else "not available"
        raise InvalidArgumentError(f"device {device!r}: the Loader copies to CUDA devices only (CUDA is {cuda})")
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if not 0 <= index < torch.cuda.device_count():
        raise InvalidArgumentError(
            f"device {device!r}: this process sees {torch.cuda.device_count()} CUDA device(s) (0 .. "
            f"{torch.cuda.device_count() - 1}; CUDA_VISIBLE_DEVICES renumbers them)"
        )
    return torch.device("cuda", index)


def _start(loader: Loader, source, stopped: threading.Event) -> tuple[Iterator[Any], _Stop]:
    """Starts one pass: the producer thread, and the consumer's generator. Closing the generator (``break``, an
    exception, garbage collection) or calling the returned :class:`_Stop` stops the producer and joins it."""
    ring = Ring(loader._slots, loader.prefetch, poison=loader.debug, stopped=stopped)
    out: queue.SimpleQueue = queue.SimpleQueue()
    stream = torch.cuda.Stream(loader.device) if loader.device is not None else None
    thread = threading.Thread(target=_produce, args=(loader, source, ring, out, stream), name="eagle-io-loader")
    thread.daemon = True
    thread.start()
    stop = _Stop(ring, thread, source)
    gen = _consume(loader, ring, out, stream, stop)
    weakref.finalize(gen, stop)  # a generator dropped before its first next() runs no finally
    return gen, stop


def _consume(loader: Loader, ring: Ring, out: queue.SimpleQueue, stream: Any, stop: _Stop) -> Iterator[Any]:
    held: collections.deque[Slot] = collections.deque()
    try:
        while not ring.stopped.is_set():
            while len(held) >= loader.keep:
                ring.release(held.popleft(), _release_event(loader, stream))
            got = out.get()  # Ctrl-C here leaves through the finally below: the producer stops at once
            if isinstance(got, _Ended):
                if got.state is not None:
                    loader._state = got.state
                return
            if isinstance(got, _Failed):
                raise got.error
            slot, batch, state, event = got
            ring.taken()
            if slot is not None:
                held.append(slot)
            if event is not None:
                current = torch.cuda.current_stream(loader.device)
                current.wait_event(event)
                for t in tensors(batch):
                    t.record_stream(current)  # allocated on the side stream, used on this one
            loader._state = state
            yield batch
    finally:
        stop()


def _release_event(loader: Loader, stream: Any) -> Any:
    """With pinned buffers and no device copy of ours: an event after the consumer's queued work (its own
    ``non_blocking`` copies out of the batch), which the producer waits on before reusing the buffer."""
    if not loader.pin_memory or stream is not None:
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream())
    return event


class _Stop:
    """Stops a pass's producer and joins it (idempotent)."""

    def __init__(self, ring: Ring, thread: threading.Thread, source) -> None:
        self.ring, self.thread, self.source = ring, thread, source

    def __call__(self) -> None:
        self.ring.stop()  # wakes a producer waiting for a slot, or a followed dataset waiting for its captures
        if self.thread is not threading.current_thread():  # (a garbage collection the producer itself ran)
            self.thread.join()
            self.source.close()


def _produce(loader: Loader, source, ring: Ring, out: queue.SimpleQueue, stream: Any) -> None:
    """The producer thread: each batch into the next free slot, decoded (GIL released in the native reader),
    optionally copied to the device, then handed to the consumer."""
    try:
        for k, (work, state) in enumerate(source):
            if work is _END:
                out.put(_Ended(state))
                return
            slot = ring.acquire(k)
            if slot is None:
                return  # stopped
            batch = loader._build(work, slot, k)
            event = None
            if stream is not None:
                with torch.cuda.stream(stream):
                    batch = _to_device(batch, loader.device)
                    event = torch.cuda.Event()
                    event.record(stream)
                ring.release(slot, event)  # the device copy owns the data; the slot is reused once it is done
                slot = None
            out.put((slot, batch, state, event))
    except BaseException as e:  # every failure is raised again in the consumer's thread
        out.put(_Failed(e))


def _to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` (a dict, list or tuple of tensors and other values, nested) with its tensors copied to ``device``
    (``non_blocking``: from pinned memory, asynchronous on the current stream)."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)([_to_device(v, device) for v in batch])
    return batch
