"""The batch buffers of :class:`eagle_io.feed.Loader`: a ring of slots, each a set of byte arenas (one per batch
entry, pinned when CUDA is there) that batch after batch are viewed as that batch's tensors, and the leases of its
debug mode, which catch a batch used after its slot went back to the ring.

Slot ``k % n`` holds batch ``k``. The producer acquires it (waiting until the consumer released it and, when a
CUDA event was recorded at the release or after the loader's own device copy, until that event completed), fills
it, and hands it over; the consumer releases it when the contract says the batch is no longer valid.

Debug mode: *versioned views*. Every tensor of a debug batch is a :class:`LeasedTensor` carrying its slot and the
slot's generation when the batch was filled; releasing the slot bumps the generation, and any torch operation on
the tensor, or on a view of it, after that raises :class:`eagle_io.errors.BatchRecycledError` naming the batch.
That is deterministic: the misuse raises where it happens, whether or not the slot was written again yet. Memory
reached around torch (a ``.numpy()`` view, a ``data_ptr()`` in C) cannot be guarded that way, so in debug mode the
slot is also *poisoned* when it is acquired again: every byte 0xFF (NaN in bf16/fp16, -1 in ints) before the
next batch is decoded into it, so stale reads never pass for data.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import torch

from ..errors import BatchRecycledError


class Slot:
    """One batch's buffers: ``empty(key, shape, dtype)`` (an :class:`eagle_io.feed.collate.Allocator`) views the
    slot's arena for ``key``, grown (by at least 1/4) when the batch needs more bytes than it holds."""

    def __init__(self, index: int, pin: bool) -> None:
        self.index, self.pin = index, pin
        self.arenas: dict[str, torch.Tensor] = {}
        #: Bumped at each release: the leases of the batches it held expire.
        self.generation = 0
        #: Number of the batch it holds (for messages).
        self.batch = -1
        self.held = False
        #: A CUDA event that must complete before the slot is written again (a copy out of it in flight).
        self.event: Any = None

    def empty(self, key: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        numel = 1
        for d in shape:
            numel *= d
        nbytes = numel * dtype.itemsize
        arena = self.arenas.get(key)
        if arena is None or arena.numel() < nbytes:
            grown = 0 if arena is None else arena.numel() + arena.numel() // 4
            arena = self.arenas[key] = torch.empty(max(nbytes, grown), dtype=torch.uint8, pin_memory=self.pin)
        return arena[:nbytes].view(dtype).view(shape)

    def poison(self) -> None:
        for arena in self.arenas.values():
            arena.numpy().fill(0xFF)


class Ring:
    """``slots`` handed out in turn (:meth:`acquire` for batch ``k`` takes slot ``k % n``), at most ``ahead``
    batches acquired and not yet :meth:`taken` by the consumer; :meth:`stop` wakes a producer waiting for one (it
    then gets None) and sets :attr:`stopped`. The slots outlive a ring: a loader's next pass reuses them (and their
    memory, already mapped), after the previous pass's ring released them all."""

    def __init__(self, slots: list[Slot], ahead: int, poison: bool, stopped: threading.Event) -> None:
        for slot in slots:
            slot.generation += slot.held  # a batch the last pass's consumer still held expires now
            slot.held = False
        self.slots = slots
        self.poison = poison
        self.stopped = stopped
        self._ahead, self._in_flight = ahead, 0
        self._cond = threading.Condition()

    def acquire(self, k: int) -> Slot | None:
        slot = self.slots[k % len(self.slots)]
        with self._cond:
            while (slot.held or self._in_flight >= self._ahead) and not self.stopped.is_set():
                self._cond.wait()
            if self.stopped.is_set():
                return None
            slot.held, slot.batch = True, k
            self._in_flight += 1
        if slot.event is not None:
            slot.event.synchronize()  # a copy out of the slot still in flight (torch releases the GIL here)
            slot.event = None
        if self.poison:
            slot.poison()
        return slot

    def taken(self) -> None:
        """The consumer took a batch: the producer may start another."""
        with self._cond:
            self._in_flight -= 1
            self._cond.notify_all()

    def release(self, slot: Slot, event: Any = None) -> None:
        """``slot`` may be reused (after ``event``, a CUDA event, completed): its batch's leases expire."""
        with self._cond:
            slot.generation += 1
            slot.event = event
            slot.held = False
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self.stopped.set()
            self._cond.notify_all()


class LeasedTensor(torch.Tensor):
    """A debug batch's tensor (:mod:`eagle_io.feed.ring`): every torch operation first checks that its slot was
    not released since the batch was filled (else :class:`eagle_io.errors.BatchRecycledError`); views made from
    it carry the same lease, other results are plain tensors."""

    _lease: tuple[Slot, int, int, str, int]  # slot, generation, batch number, entry, keep

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        lease = None
        for t in tensors((args, kwargs)):
            if isinstance(t, LeasedTensor):
                _check(t._lease)
                lease = lease or t._lease
        with torch._C.DisableTorchFunctionSubclass():
            return _relabel(func(*args, **kwargs), lease)


def lease(t: torch.Tensor, slot: Slot, batch: int, key: str, keep: int) -> LeasedTensor:
    """``t`` (a view of ``slot``'s memory) as a :class:`LeasedTensor` of ``batch``."""
    out = t.as_subclass(LeasedTensor)
    out._lease = (slot, slot.generation, batch, key, keep)
    return out


def _check(lease: tuple[Slot, int, int, str, int]) -> None:
    slot, generation, batch, key, keep = lease
    if slot.generation != generation:
        raise BatchRecycledError(
            f"batch {batch}'s {key!r} was used after its buffers went back to the loader's ring (slot {slot.index}): "
            f"a Loader batch stays valid until {keep} more batch(es) are taken; clone() what you keep longer, or "
            f"raise Loader(keep=...)"
        )


def tensors(obj: Any) -> Iterable[torch.Tensor]:
    """The tensors in ``obj`` (a tensor, or dicts, lists and tuples of them, nested)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from tensors(o)


def _relabel(out: Any, lease: tuple | None) -> Any:
    """Results that view the slot's memory keep the lease (by storage, not ``_base``: ``detach()`` aliases the
    memory without being a view); the others become plain tensors."""
    if isinstance(out, (list, tuple)):
        return type(out)([_relabel(o, lease) for o in out])
    if not isinstance(out, torch.Tensor):
        return out
    plain = out.as_subclass(torch.Tensor) if isinstance(out, LeasedTensor) else out
    if lease is None or plain.device.type != "cpu":
        return plain
    ptr = plain.untyped_storage().data_ptr()
    if not ptr or not any(ptr == a.untyped_storage().data_ptr() for a in lease[0].arenas.values()):
        return plain
    kept = plain.as_subclass(LeasedTensor)
    kept._lease = lease
    return kept
