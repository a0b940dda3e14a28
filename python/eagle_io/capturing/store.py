"""The capture core: what every backend (the Hugging Face hooks, SGLang's scheduler hook) does with a forward's
per-sample states. One place checks a sample, applies the NaN/Inf policy, skips what the dataset already holds,
counts, and puts the sample into the capture ring (:class:`~eagle_io.capturing.ring.RingSink`), which copies it
asynchronously and feeds the shard writer.

A backend calls :func:`check_sample` (or :meth:`SampleStore.check`) before or while it runs the forward, then
:meth:`SampleStore.put` for each sample of the forward, then :meth:`SampleStore.close`.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from .. import defaults
from ..errors import InvalidArgumentError, NonFiniteStatesError, SchemaError
from ..store.metadata import eagle3_metadata
from ..store.schema import eagle3_schema
from ..store.writer import ShardWriter
from .ring import RingSink, check_ring_options

__all__ = ["COUNTS", "NONFINITE_POLICIES", "SampleStore", "check_sample"]

logger = logging.getLogger("eagle_io.capture")

NONFINITE_POLICIES = ("raise", "skip")
"""What :meth:`SampleStore.put` does with a sample whose states hold NaN/Inf: raise
:class:`~eagle_io.errors.NonFiniteStatesError`, or skip it and count it (``nonfinite_skipped``)."""

COUNTS = ("written", "already_done", "dropped", "nonfinite_skipped", "after_stop")
"""The store's counters: samples put into the ring; skipped because the dataset holds them (resume); dropped by a
full ring (``drop_when_full``); skipped for NaN/Inf; arriving after :meth:`SampleStore.close`."""

_STATE_TENSORS = ("aux_hidden_states", "hidden_states")


def check_sample(
    sample_id: Any,
    input_ids: Sequence[int] | torch.Tensor,
    loss_mask: Sequence[int] | torch.Tensor,
    *,
    max_length: int | None,
    vocab_size: int | None,
) -> None:
    """Refuses a sample the capture cannot store as declared, before anything of it is written.

    Args:
        sample_id: must be an ``int`` (not ``bool``) in ``[0, 2**64)``.
        input_ids: ``[L]`` integer token ids, ``1 <= L <= max_length``, each in ``[0, vocab_size)``.
        loss_mask: ``[L]`` values 0 or 1.

    Raises:
        SchemaError: naming the sample and the problem (``sample_id`` attribute set).
    """
    if type(sample_id) is not int or not 0 <= sample_id < 1 << 64:
        raise SchemaError.for_sample(sample_id, "sample ids are integers in [0, 2**64)")
    ids = torch.as_tensor(input_ids)
    mask = torch.as_tensor(loss_mask)
    n = int(ids.shape[0]) if ids.dim() else 0
    problem = None
    if ids.dim() != 1 or n == 0:
        problem = "it has 0 tokens" if n == 0 else f"input_ids has shape {tuple(ids.shape)}, not [L]"
    elif ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        problem = f"its input_ids are {str(ids.dtype).removeprefix('torch.')}, not integers"
    elif max_length is not None and n > max_length:
        problem = f"it has {n} tokens, more than this run's max_length {max_length}"
    elif mask.dim() != 1 or mask.shape[0] != n:
        problem = f"its loss_mask has {mask.shape[0] if mask.dim() else 0} tokens for {n} input_ids"
    elif bool(((mask != 0) & (mask != 1)).any()):
        problem = f"its loss_mask holds {int(mask[(mask != 0) & (mask != 1)][0])}; values must be 0 or 1"
    elif vocab_size is not None and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        bad = int(ids.max()) if int(ids.max()) >= vocab_size else int(ids.min())
        problem = f"it holds token id {bad}, outside the target's vocab of {vocab_size}"
    if problem:
        raise SchemaError.for_sample(sample_id, f"{problem}; nothing of it was written")


class SampleStore:
    """Stores captured samples through a capture ring; thread-safe (SGLang calls it from its forward thread while a
    stop may arrive on another).

    Args:
        sink: the capture ring feeding a shard writer (:class:`~eagle_io.capturing.ring.RingSink`); see
            :meth:`create` for the usual construction.
        state_dtype: dtype the states are stored in (``torch.bfloat16``...); float32 forwards are rounded to nearest.
        max_length, vocab_size: :func:`check_sample`'s limits (None: unchecked).
        nonfinite: one of :data:`NONFINITE_POLICIES`.
        done: ids the dataset already holds (resume); :meth:`put` skips them.
        manifest_path: the writer's manifest file.

    Attributes:
        counts: :data:`COUNTS` as a dict.
        done: ids already in the dataset or put since.

    Raises:
        InvalidArgumentError: an unknown ``nonfinite`` policy.
    """

    def __init__(
        self,
        sink: RingSink,
        *,
        state_dtype: torch.dtype,
        max_length: int | None,
        vocab_size: int | None,
        nonfinite: str = "raise",
        done: Iterable[int] = (),
        manifest_path: str | None = None,
    ) -> None:
        if nonfinite not in NONFINITE_POLICIES:
            raise InvalidArgumentError(f"nonfinite must be 'raise' or 'skip', not {nonfinite!r}")
        self._sink = sink
        self.state_dtype = state_dtype
        self.max_length, self.vocab_size, self.nonfinite = max_length, vocab_size, nonfinite
        self.done = set(done)
        self.manifest_path = manifest_path
        self.counts = dict.fromkeys(COUNTS, 0)
        self.manifest: dict[str, Any] | None = None
        self._closed = False
        self._close_error: Exception | None = None
        self._lock = threading.Lock()

    @classmethod
    def create(
        cls,
        out_dir: str | os.PathLike[str],
        *,
        target_info: Mapping[str, Any],
        aux_layer_ids: Sequence[int],
        state_dtype: str = "bfloat16",
        tokenizer_identity: Mapping[str, Any] | None = None,
        max_length: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        nonfinite: str = "raise",
        ring_bytes: int = defaults.RING_BYTES,
        batch: int = defaults.RING_BATCH,
        timeout_s: float = defaults.RING_TIMEOUT_S,
        drop_when_full: bool = False,
        **writer_options: Any,
    ) -> SampleStore:
        """Opens (or, with ``resume=True``, continues) the EAGLE-3 dataset in ``out_dir`` behind a capture ring.

        Args:
            target_info: ``num_layers``, ``hidden_size``, ``vocab_size`` (and ``model_id``, ``files``,
                ``architecture`` when known), recorded in the metadata
                (:func:`eagle_io.store.metadata.eagle3_metadata`).
            aux_layer_ids: the captured layers (eagle-io ids, :mod:`eagle_io.capturing.layers`).
            state_dtype: stored dtype name of the states.
            ring_bytes, batch, timeout_s, drop_when_full: the capture ring (:class:`~eagle_io.capturing.ring.RingSink`).
            writer_options: :class:`eagle_io.ShardWriter` options (``shard_bytes``, ``threads``, ``rank``,
                ``world_size``, ``resume``...).

        Raises:
            InvalidArgumentError: ``out_dir`` holds this writer's data without ``resume``, a bad option, a
                ``target_info`` without positive ``num_layers`` / ``hidden_size`` / ``vocab_size``, or a
                ``state_dtype`` that is not floating.
            IncompatibleDatasetError: resuming a dataset of another schema or metadata.
        """
        if nonfinite not in NONFINITE_POLICIES:  # before anything is created on disk
            raise InvalidArgumentError(f"nonfinite must be 'raise' or 'skip', not {nonfinite!r}")
        check_ring_options(ring_bytes=ring_bytes, batch=batch, timeout_s=timeout_s)
        meta = eagle3_metadata(  # checks target_info
            target_info=target_info,
            aux_layer_ids=aux_layer_ids,
            dtype=state_dtype,
            tokenizer_identity=tokenizer_identity,
            max_length=max_length,
            extra=metadata,
        )
        schema = eagle3_schema(int(target_info["hidden_size"]), len(aux_layer_ids), state_dtype)
        writer = ShardWriter(out_dir, schema, meta, **writer_options)
        done = writer.sample_ids()
        sink = RingSink(writer, ring_bytes=ring_bytes, batch=batch, timeout_s=timeout_s, drop_when_full=drop_when_full)
        return cls(
            sink,
            state_dtype=getattr(torch, state_dtype),
            max_length=max_length,
            vocab_size=int(target_info["vocab_size"]),
            nonfinite=nonfinite,
            done=done,
            manifest_path=writer.manifest_path,
        )

    def check(self, sample_id: Any, input_ids: Any, loss_mask: Any) -> None:
        """:func:`check_sample` with this store's ``max_length`` and ``vocab_size``."""
        check_sample(sample_id, input_ids, loss_mask, max_length=self.max_length, vocab_size=self.vocab_size)

    def is_done(self, sample_id: int) -> bool:
        """Whether the dataset already holds ``sample_id`` (counted as ``already_done`` when it does), so a backend
        can leave it out of its forward."""
        with self._lock:
            if sample_id in self.done:
                self.counts["already_done"] += 1
                return True
            return False

    @staticmethod
    def all_finite(*tensors: torch.Tensor) -> bool:
        """Whether every value of ``tensors`` is finite: one device sync for a whole forward, so :meth:`put` can
        skip its per-sample check when it holds (``known_finite``)."""
        return all(bool(torch.isfinite(t).all()) for t in tensors)

    def put(
        self,
        sample_id: int,
        input_ids: Sequence[int] | torch.Tensor,
        loss_mask: Sequence[int] | torch.Tensor,
        aux_hidden_states: torch.Tensor,
        hidden_states: torch.Tensor,
        *,
        key: str = "",
        known_finite: bool = False,
    ) -> bool:
        """Puts one sample (``aux_hidden_states [L, k*H]``, ``hidden_states [L, H]``, on any device) into the ring.
        The caller has checked it (:meth:`check`). Returns True when it was put, False when it was skipped and
        counted: NaN/Inf under ``nonfinite="skip"``, already in the dataset, the ring full under
        ``drop_when_full``, or the store closed.

        Raises:
            NonFiniteStatesError: NaN/Inf under ``nonfinite="raise"`` (names the sample, row and tensor).
            SchemaError: tensors that do not fit the dataset's schema.
            RingTimeoutError: the writers could not keep up for the ring's timeout.
        """
        if not known_finite and not self._finite_or_skip(sample_id, aux_hidden_states, hidden_states):
            return False
        tensors = {
            "input_ids": torch.as_tensor(input_ids, dtype=torch.int64),
            "loss_mask": torch.as_tensor(loss_mask).to(torch.uint8),
            "aux_hidden_states": aux_hidden_states.to(self.state_dtype),
            "hidden_states": hidden_states.to(self.state_dtype),
        }
        with self._lock:
            if self._closed:
                self.counts["after_stop"] += 1
                logger.warning("eagle-io capture: sample %d arrived after the capture stopped; not written", sample_id)
                return False
            if sample_id in self.done:
                self.counts["already_done"] += 1
                return False
            if not self._sink.put(sample_id, tensors, key=key):
                self.counts["dropped"] += 1
                return False
            self.done.add(sample_id)
            self.counts["written"] += 1
            return True

    def _finite_or_skip(self, sample_id: int, aux: torch.Tensor, hidden: torch.Tensor) -> bool:
        bad_aux, bad_hidden = ~torch.isfinite(aux).all(dim=-1), ~torch.isfinite(hidden).all(dim=-1)
        bad = bad_aux | bad_hidden
        if not bool(bad.any()):
            return True
        if self.nonfinite == "skip":
            with self._lock:
                self.counts["nonfinite_skipped"] += 1
            return False
        row = int(bad.nonzero()[0, 0])
        tensor = _STATE_TENSORS[0] if bool(bad_aux[row]) else _STATE_TENSORS[1]
        err = NonFiniteStatesError(
            f"sample {sample_id}: NaN/Inf in captured {tensor} at token row {row} "
            f"({int(bad.sum())} bad rows); nothing of this sample was written"
        )
        err.sample_id, err.row, err.tensor = sample_id, row, tensor
        raise err

    def ring_stats(self) -> dict[str, Any]:
        """The ring's and the writer's counters (:meth:`~eagle_io.capturing.ring.RingSink.stats`)."""
        return self._sink.stats()

    def stats(self) -> dict[str, Any]:
        """:data:`COUNTS` plus :meth:`ring_stats`."""
        return {**self.counts, **self.ring_stats()}

    def close(self) -> dict[str, Any]:
        """Drains the ring, commits the last shard and returns the manifest. Samples put from now on are counted
        (``after_stop``), not written; a later call returns the same manifest, or raises the same error.

        Raises:
            StorageError, InternalError: the writer failed while committing (what it committed before stays valid).
        """
        with self._lock:
            if not self._closed:
                self._closed = True
                try:
                    self.manifest = self._sink.close()
                except Exception as e:
                    self._close_error = e
            if self._close_error is not None:
                raise self._close_error
            return self.manifest
