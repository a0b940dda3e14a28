"""The hand-off between a capturing SGLang scheduler and its store: finished samples are queued here on the
scheduler's thread, and a thread of eagle-io's own checks their values and puts them into the capture ring
(:meth:`eagle_io.capturing.store.SampleStore.put_forward`, whose value checks read the states on the host). The
scheduler's thread never waits on the device for the capture.

On a CUDA device each sample carries the event recorded after its last rows were cloned (behind the forward, on
SGLang's stream); the hand-off thread waits for that event on a stream of its own (a non-blocking stream, so it never
orders SGLang's work) and marks the tensors used there (``Tensor.record_stream``), so the caching allocator never
gives their memory back to SGLang's stream early.

Queue full: a live capture drops the sample (counted ``queue_full``: serving never waits); a client-driven capture
(data generation, nothing else served) waits for room, which holds its scheduler as a full ring would.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..store import ForwardSample, SampleStore

__all__ = ["Finished", "Handoff"]

logger = logging.getLogger("eagle_io.serving")


@dataclass
class Finished:
    """Finished samples of one scheduler step: their rows (device tensors, ``[L_i, k*H]`` and ``[L_i, H]``), where
    each sample's rows are once joined, and the CUDA event after which the rows are complete (None on a CPU)."""

    samples: list[ForwardSample]
    aux: list[torch.Tensor]
    final: list[torch.Tensor]
    ready: Any = None


class Handoff:
    """One thread putting finished samples into ``store``; ``stored(sample, nbytes)`` is called after each put sample,
    ``fail(error)`` on the first error (a value policy's ``raise``, a writer error: the capture stops, the thread
    drops what comes after)."""

    def __init__(self, store: SampleStore, *, slots: int, drop_when_full: bool,
                 stored: Callable[[ForwardSample, int], None], fail: Callable[[str], None]) -> None:  # fmt: skip
        self.store, self.drop_when_full = store, drop_when_full
        self._stored, self._fail = stored, fail
        self._queue: queue.Queue[Finished | None] = queue.Queue(maxsize=slots)
        self.failed = self.closed = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="eagle-io-capture-handoff", daemon=True)
        self._thread.start()

    def put(self, item: Finished) -> bool:
        """Queues ``item``; False when the queue is full under ``drop_when_full``, or a stop is closing it right now
        (the caller counts it: a live capture never waits). After :meth:`close`, the store counts the samples
        (``after_stop``) and writes nothing."""
        if not self._lock.acquire(blocking=not self.drop_when_full):
            return False
        try:
            if self.closed:
                self._put_joined(item.samples, item.aux, item.final)
                return True
            if self.drop_when_full:
                try:
                    self._queue.put_nowait(item)
                except queue.Full:
                    return False
                return True
            self._queue.put(item)
            return True
        finally:
            self._lock.release()

    def wait_idle(self) -> None:
        """Waits until every sample queued so far was put (or dropped after a failure)."""
        self._queue.join()

    def close(self) -> None:
        """Waits until every queued sample was put (or dropped after a failure), then ends the thread."""
        with self._lock:  # no put lands behind the end mark
            if self.closed:
                return
            self.closed = True
            self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        stream = torch.cuda.Stream() if torch.cuda.is_available() else None
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                if not self.failed:
                    self._put(item, stream)
            except Exception as e:  # the capture stops; the scheduler serves on
                self.failed = True
                self._fail(f"{type(e).__name__}: {e}")
            finally:
                self._queue.task_done()

    def _put(self, item: Finished, stream: Any) -> None:
        aux, final = item.aux, item.final
        if stream is not None and aux[0].is_cuda:
            if item.ready is not None:
                stream.wait_event(item.ready)
            for t in (*aux, *final):
                t.record_stream(stream)
            with torch.cuda.stream(stream):
                self._put_joined(item.samples, aux, final)
                stream.synchronize()
            return
        self._put_joined(item.samples, aux, final)

    def _put_joined(self, samples: Sequence[ForwardSample], aux: list[torch.Tensor], final: list[torch.Tensor]) -> None:
        a = torch.cat(aux) if len(aux) > 1 else aux[0]
        f = torch.cat(final) if len(final) > 1 else final[0]
        put = self.store.put_forward(a, f, samples)
        per_row = (a.shape[1] + f.shape[1]) * self.store.state_dtype.itemsize
        for s, ok in zip(samples, put, strict=True):
            if ok:
                self._stored(s, s.length * per_row)
