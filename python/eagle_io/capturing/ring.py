"""The capture ring as seen from the target's forward: reserve a slot of host memory owned by the Rust core
(``_native.RingSlot``, a buffer of exactly that slot), copy a sample's states into it, commit it, and move on;
Rust threads compress and write it. Python never sees the rest of the arena.

On CUDA the arena is registered as pinned memory (``cudaHostRegister``) and each copy is a
``non_blocking`` device-to-host copy on a side stream; a completion thread waits on the copy's
CUDA event and commits the slot, so the forward thread never waits for the copy, compression or
disk, unless the ring is full.

Tensors the schema stores as FP8 (``precision="fp8"``) are quantised where the copy happens: a sample's CUDA
tensors on their GPU before the copy (:func:`eagle_io.store.fp8.quantize_rows`: the slot receives the scales and
FP8 bytes, half the bytes of bf16 over PCIe, and the writer stores them as given), CPU tensors in the Rust
encode pass. Both give the same shard bytes.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from .. import _native, defaults
from ..errors import ArgumentTypeError, InvalidArgumentError, SchemaError
from ..host import available_memory, human_bytes
from ..store import fp8
from ..store.writer import ShardWriter, check_sample_id

logger = logging.getLogger("eagle_io.capture")

_FOREVER_S = 1e9
"""``timeout_s=inf`` waits this long (31 years): the core's wait takes a finite duration."""


def check_ring_options(
    *, ring_bytes: int, batch: int, timeout_s: float, quantize_on_device: bool | None = None
) -> None:
    """Refuses ring options the core cannot take, before anything is created (a capture checks them before it
    opens its writer, so a bad option leaves no dataset behind). Whether the ring fits in memory is judged by the
    process that allocates it (:func:`check_ring_memory`), not by a client whose rings live in SGLang's schedulers.

    Raises:
        InvalidArgumentError: ``ring_bytes`` or ``batch`` not an integer >= 1, ``timeout_s`` not a number >= 0,
            ``quantize_on_device`` neither None nor a bool.
    """
    for name, value in (("ring_bytes", ring_bytes), ("batch", batch)):
        if type(value) is not int or value < 1:
            raise InvalidArgumentError(f"{name} must be an integer >= 1, not {value!r}")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s >= 0:
        raise InvalidArgumentError(f"timeout_s must be a number of seconds >= 0 (inf: no limit), not {timeout_s!r}")
    if quantize_on_device not in (None, True, False):
        raise InvalidArgumentError(f"quantize_on_device must be None, True or False, not {quantize_on_device!r}")


def check_ring_memory(ring_bytes: int) -> None:
    """Refuses a capture ring larger than the memory available to this process now (the arena is allocated at once:
    10**15 bytes aborted the process). Called by the process that allocates it, before anything is created: the
    Hugging Face capture's own, or each SGLang scheduler's (its refusal is the start's error in the server's status).

    Raises:
        InvalidArgumentError: naming ``ring_bytes`` and the memory available.
    """
    free = available_memory()
    if free is not None and ring_bytes > free:
        raise InvalidArgumentError(
            f"ring_bytes {ring_bytes:,} ({human_bytes(ring_bytes)}): the capture ring is allocated at once, and only "
            f"{human_bytes(free)} of memory is available; the default is {human_bytes(defaults.RING_BYTES)}"
        )


class RingSink:
    """Takes ownership of ``writer`` and feeds it from a ring of ``ring_bytes`` host memory.

    Args:
        writer: the dataset writer; after this call only the sink writes to it.
        ring_bytes: arena size (bytes). A sample larger than this is refused.
        batch: committed samples the sink thread encodes together (in parallel).
        timeout_s: how long :meth:`put` waits on a full ring before raising RingTimeoutError (``inf``: no limit).
        drop_when_full: instead of waiting, drop the sample and count it (``stats()["dropped_samples"]``).
        quantize_on_device: for a schema with FP8 tensors: None quantises a sample's FP8 tensors on their device
            before the copy when they are all on CUDA (else the writer quantises them), True always (CPU tensors too,
            in torch: the path tests can run without a GPU), False never.

    Raises:
        InvalidArgumentError: a bad option (:func:`check_ring_options`).
    """

    def __init__(
        self,
        writer: ShardWriter,
        *,
        ring_bytes: int = defaults.RING_BYTES,
        batch: int = defaults.RING_BATCH,
        timeout_s: float = defaults.RING_TIMEOUT_S,
        drop_when_full: bool = defaults.DROP_WHEN_FULL,
        quantize_on_device: bool | None = None,
    ) -> None:
        check_ring_options(
            ring_bytes=ring_bytes, batch=batch, timeout_s=timeout_s, quantize_on_device=quantize_on_device
        )
        self.schema = writer.schema
        self._ids = set(writer.sample_ids())  # refused at put, not later by the sink thread (which then stops)
        self._sink = _native.CaptureSink(writer._native, ring_bytes, batch)
        self._timeout_s = min(float(timeout_s), _FOREVER_S)
        self._drop = drop_when_full
        self._ring_bytes = ring_bytes
        self._row_bytes = [
            (s.width or 1) * torch.empty(0, dtype=getattr(torch, s.dtype)).element_size() for s in self.schema
        ]
        self._fp8 = [s.precision is not None for s in self.schema]
        self._stored_row_bytes = [
            fp8.stored_row_bytes(s) if q else rb
            for s, q, rb in zip(self.schema, self._fp8, self._row_bytes, strict=True)
        ]
        self._quantize_on_device = quantize_on_device if any(self._fp8) else False
        self.quantized_before_copy = 0
        self.pinned = False
        self._stream: torch.cuda.Stream | None = None
        self._done: queue.Queue | None = None
        self._completer: threading.Thread | None = None
        self._error: BaseException | None = None
        if torch.cuda.is_available():
            self._span = self._sink.arena_span()
            rc = torch.cuda.cudart().cudaHostRegister(*self._span, 0)
            self.pinned = int(rc) == 0
            self._stream = torch.cuda.Stream()
            self._done = queue.Queue()
            self._completer = threading.Thread(target=self._complete, name="eagle-io-d2h-complete", daemon=True)
            self._completer.start()

    def _complete(self) -> None:
        """Commits GPU-copied slots once their copy has finished (waits off the forward thread)."""
        assert self._done is not None
        while (item := self._done.get()) is not None:
            event, slot, sample_id, key, n, clamped, prefix = item
            try:
                event.synchronize()
                clamped = None if clamped is None else int(clamped)  # copied with the slot
                self._sink.commit(slot, sample_id, key, n, fp8_clamped=clamped, **prefix)
            except BaseException as e:  # surfaced by the next put() or close()
                self._error = e

    def put(
        self,
        sample_id: int,
        tensors: Mapping[str, torch.Tensor],
        key: str = "",
        *,
        shared_prefix: int = 0,
        stored_prefix: bytes | None = None,
    ) -> bool:
        """Copies one sample (CPU or CUDA tensors named by the schema, each ``[L]`` / ``[L, width]``,
        contiguous) into the ring and commits it. Returns False when the ring was full and the sink
        drops (counted; a sample larger than the whole ring too, which no wait would make room for), True otherwise.
        ``shared_prefix``: the sample's first tokens that other samples share, stored once
        (:meth:`eagle_io.ShardWriter.write`'s ``shared_prefix``; 0: none). ``stored_prefix``: the SHA-256 digest
        (32 bytes) of the token ids of a prefix record put before (by a sample's ``shared_prefix``, or in the
        dataset resumed): ``tensors`` then hold only the sample's ``L`` tokens after that prefix, and it reads back
        whole (docs/FORMAT.md 4.7). A digest the writer does not hold when it reaches the sample stops the
        capture (a producer's error: the ring writes in commit order).

        Raises:
            SchemaError: an id outside ``[0, 2**64)`` or already put (or in the resumed dataset), a missing tensor,
                or one of the wrong type, dtype or shape, or a ``shared_prefix`` that is not in ``[0, L)``. Nothing of
                the sample is put, and the ring goes on.
            ArgumentTypeError: a ``key`` that is not a string.
            RingTimeoutError: the ring stayed full for ``timeout_s``.
            InvalidArgumentError: a sample larger than the whole ring, unless the sink drops.
        """
        self._check_id(sample_id, key)
        ts = []
        for spec in self.schema:
            t = tensors.get(spec.name) if isinstance(tensors, Mapping) else None
            if not isinstance(t, torch.Tensor) or t.dim() == 0:
                what = "missing" if t is None else f"a {type(t).__name__}" if not isinstance(t, torch.Tensor) else "0-d"
                raise SchemaError.for_sample(sample_id, f"tensor {spec.name!r} is {what}; the schema needs a tensor")
            ts.append(t)
        n = ts[0].shape[0]
        for spec, t in zip(self.schema, ts, strict=True):
            want = (n,) if spec.width is None else (n, spec.width)
            if str(t.dtype).removeprefix("torch.") != spec.dtype or tuple(t.shape) != want:
                raise SchemaError.for_sample(
                    sample_id,
                    f"tensor {spec.name!r} is {t.dtype} {tuple(t.shape)}; the schema needs {spec.dtype} {want}",
                )
        if type(shared_prefix) is not int or not 0 <= shared_prefix < max(n, 1):
            raise SchemaError.for_sample(
                sample_id, f"shared_prefix {shared_prefix!r}: a shared prefix is an int in [0, {n}) (its L tokens)"
            )
        if stored_prefix is not None and (shared_prefix or n == 0):
            raise SchemaError.for_sample(
                sample_id, "a stored_prefix is given with no shared_prefix and 1 token or more"
            )
        prefix = {"shared_prefix": shared_prefix} if stored_prefix is None else {"stored_prefix": bytes(stored_prefix)}
        quantize = self._quantize_on_device is True or (
            self._quantize_on_device is None and all(t.is_cuda for t, q in zip(ts, self._fp8, strict=True) if q)
        )
        sizes = [n * rb for rb in (self._stored_row_bytes if quantize else self._row_bytes)]
        if self._drop and sum(sizes) > self._ring_bytes:
            logger.warning("eagle-io capture: sample %d (%d bytes) is larger than the capture ring (%d bytes); "
                           "dropped (raise ring_bytes)", sample_id, sum(sizes), self._ring_bytes)  # fmt: skip
            return False
        slot = self._sink.reserve(sum(sizes), self._timeout_s, self._drop)
        if slot is None:
            return False
        on_gpu = self._stream is not None and any(t.is_cuda for t in ts)
        try:
            event, clamped = self._copy_into(slot, ts, sizes, on_gpu, quantize)
        except BaseException:
            if on_gpu:  # no copy may still land in a slot the ring hands out again
                self._stream.synchronize()
            self._sink.commit(slot, sample_id, key, n, cancelled=True)
            raise
        if event is None:
            clamped = None if clamped is None else int(clamped)
            self._sink.commit(slot, sample_id, key, n, fp8_clamped=clamped, **prefix)
        else:
            self._done.put((event, slot, sample_id, key, n, clamped, prefix))
        self._ids.add(sample_id)
        self.quantized_before_copy += quantize
        return True

    def _check_id(self, sample_id: int, key: str) -> None:
        """Raises the error a previous commit left, or SchemaError / ArgumentTypeError for a bad id or key."""
        if self._error is not None:
            raise self._error
        check_sample_id(sample_id)
        if sample_id in self._ids:
            raise SchemaError.for_sample(sample_id, "this sample id is already in the dataset (ids must be unique)")
        if not isinstance(key, str):
            raise ArgumentTypeError(f"sample {sample_id}: key must be a str, not {type(key).__name__}")

    def put_stored(self, sample_id: int, tensors: Mapping[str, torch.Tensor], key: str = "") -> bool:
        """:meth:`put` for CPU tensors whose FP8 tensors are already quantised: each FP8 tensor ``name`` is given as
        ``Dataset(..., dequantize=False)`` returns it, ``name`` ``[L, width]`` float8_e4m3fn and ``name + "_scales"``
        ``[L, S]`` float32 (docs/FORMAT.md 3.1), and stored as given, bit for bit (an FP8 copy from another format
        keeps its bytes and scales); the other tensors as for :meth:`put`. Returns as :meth:`put`.

        Raises:
            SchemaError: a bad or repeated id, a missing tensor, or one of the wrong dtype or shape (named).
            ArgumentTypeError: a ``key`` that is not a string.
            RingTimeoutError: the ring stayed full for ``timeout_s``.
            InvalidArgumentError: a sample larger than the whole ring, unless the sink drops.
        """
        self._check_id(sample_id, key)
        rows, n = [], None
        for spec, q in zip(self.schema, self._fp8, strict=True):
            t = tensors.get(spec.name)
            parts = [(spec.name, t, spec.dtype, spec.width)]
            if q:
                parts = [
                    (spec.name + "_scales", tensors.get(spec.name + "_scales"), "float32", fp8.scales_per_row(spec))
                ]
                parts.append((spec.name, t, "float8_e4m3fn", spec.width))
            for name, x, dtype, width in parts:
                n = x.shape[0] if n is None and isinstance(x, torch.Tensor) and x.dim() else n
                want = (n,) if width is None else (n, width)
                if not isinstance(x, torch.Tensor) or str(x.dtype).removeprefix("torch.") != dtype or x.shape != want:
                    got = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else repr(type(x).__name__)
                    raise SchemaError.for_sample(
                        sample_id, f"tensor {name!r} is {got}; stored rows need {dtype} {want}"
                    )
            if q:
                s = tensors[spec.name + "_scales"].contiguous()
                rows.append(torch.cat([s.view(torch.uint8), t.contiguous().view(torch.uint8)], 1))
            else:
                rows.append(t)
        sizes = [n * rb for rb in self._stored_row_bytes]
        slot = self._sink.reserve(sum(sizes), self._timeout_s, self._drop)
        if slot is None:
            return False
        try:
            self._copy_into(slot, rows, sizes, False, False)
        except BaseException:
            self._sink.commit(slot, sample_id, key, n, cancelled=True)
            raise
        self._sink.commit(slot, sample_id, key, n, fp8_clamped=0 if any(self._fp8) else None)
        self._ids.add(sample_id)
        return True

    def _quantized(self, ts: list[torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor]:
        """``ts`` with each FP8 tensor as its stored rows (:func:`eagle_io.store.fp8.quantize_rows`, on its device),
        and the clamps counted (a 0-d tensor on the device: read once the copy is done)."""
        out, clamped = [], []
        for t, spec, q in zip(ts, self.schema, self._fp8, strict=True):
            if q:
                t, c = fp8.quantize_rows(t, spec.scale_block)
                clamped.append(c)
            out.append(t)
        return out, sum(clamped)  # 0-d CPU counts add to CUDA ones as scalars

    def _copy_into(
        self, slot: Any, ts: list[torch.Tensor], sizes: list[int], on_gpu: bool, quantize: bool
    ) -> tuple[Any, Any]:
        """Copies ``ts`` (with ``quantize``, their FP8 tensors quantised first) back to back into ``slot``; on the GPU
        asynchronously. Returns the copy's CUDA event (None on the CPU) and the clamps counted (None without
        ``quantize``; on the GPU a pinned 0-d tensor to read after the event). The slot's array or tensor view dies
        with this call, before the slot is committed (the ring's contract)."""
        if not on_gpu:
            clamped = None
            if quantize:
                ts, count = self._quantized(ts)
                clamped = int(count)
            # One single-threaded memcpy per tensor: torch's copy_ of a few MB spreads over its intra-op threads
            # and cost 3x the CPU (benches/README.md, capture ring path).
            host = np.frombuffer(slot, dtype=np.uint8)
            offset = 0
            for t, size in zip(ts, sizes, strict=True):
                if size:
                    np.copyto(host[offset : offset + size], t.contiguous().reshape(-1).view(torch.uint8).numpy())
                offset += size
            return None, clamped
        dst = torch.frombuffer(slot, dtype=torch.uint8) if len(slot) else torch.empty(0, dtype=torch.uint8)
        self._stream.wait_stream(torch.cuda.current_stream())
        offset = 0
        with torch.cuda.stream(self._stream):
            clamped = None
            if quantize:  # on the side stream, off the forward's; the quantised rows belong to it
                for t in ts:
                    if t.is_cuda:
                        t.record_stream(self._stream)
                ts, count = self._quantized(ts)
                clamped = torch.empty((), dtype=torch.int64, pin_memory=True)
                clamped.copy_(count, non_blocking=True)
            for t, size in zip(ts, sizes, strict=True):
                if size:
                    src = t.contiguous().reshape(-1).view(torch.uint8)
                    dst[offset : offset + size].copy_(src, non_blocking=True)
                    if src.is_cuda:
                        src.record_stream(self._stream)
                offset += size
            event = torch.cuda.Event()
            event.record(self._stream)
            return event, clamped

    def stats(self) -> dict[str, float]:
        """Writer counters plus ring counters: ring_capacity, ring_bytes_in_use, ring_slots_in_use,
        ring_high_water_bytes, producer_stall_seconds, dropped_samples, abandoned_slots, committed_bytes,
        ring_pinned (whether CUDA registered the arena as pinned memory) and fp8_quantized_before_copy (samples whose
        FP8 tensors were quantised on their device before the copy; the writer counts their values and clamps in
        fp8_values / fp8_clamped like its own)."""
        return {
            **self._sink.stats(),
            "ring_pinned": self.pinned,
            "fp8_quantized_before_copy": self.quantized_before_copy,
        }

    def close(self, complete: bool = True) -> dict:
        """Waits for pending copies, drains the ring, commits the last shard; returns the manifest, marked complete
        unless ``complete`` is False (an interrupted capture: resume continues it, a following reader waits on)."""
        if self._completer is not None:
            self._done.put(None)
            self._completer.join()
        manifest = self._sink.close(complete=complete)
        if self.pinned:
            torch.cuda.cudart().cudaHostUnregister(self._span[0])
            self.pinned = False
        if self._error is not None:
            raise self._error
        return manifest
