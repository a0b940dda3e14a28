"""``eagle_io.capture``: attach to a target, stream every forward's per-sample aux and final hidden
states through the capture ring into shards, and leave a committed manifest on exit."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..errors import InvalidArgumentError, NonFiniteStatesError, SchemaError
from ..store.metadata import eagle3_metadata
from ..store.schema import eagle3_schema
from ..store.writer import ShardWriter
from .hf import HFCapture
from .ring import RingSink


class CaptureSession:
    """A capture in progress; build it with :func:`capture`. Use as a context manager.

    Attributes:
        done: ids of samples already in the dataset (on resume), which :meth:`submit` skips.
        aux_layer_ids: the captured layers (eagle-io ids: input of decoder layer i).
        counts: ``submitted``, ``written``, ``already_done``, ``dropped``, ``nonfinite_skipped``.
        forward_seconds / store_seconds: time in the target's forward vs. copying into the ring.
    """

    def __init__(
        self,
        target: Any,
        out_dir: str | os.PathLike[str],
        *,
        target_info: Mapping[str, Any],
        tokenizer_identity: Mapping[str, Any] | None,
        aux_layer_ids: Sequence[int] | None,
        state_dtype: torch.dtype,
        max_length: int | None,
        metadata: Mapping[str, Any] | None,
        nonfinite: str,
        writer_options: Mapping[str, Any],
        ring_options: Mapping[str, Any],
    ) -> None:
        if not isinstance(target, torch.nn.Module):
            raise InvalidArgumentError(
                f"cannot capture from a {type(target).__name__}: expected a Hugging Face model (torch.nn.Module)"
            )
        if nonfinite not in ("raise", "skip"):
            raise InvalidArgumentError(f"nonfinite must be 'raise' or 'skip', not {nonfinite!r}")
        self._hooks = HFCapture(target, aux_layer_ids, state_dtype=state_dtype)
        self.aux_layer_ids = list(self._hooks.aux_layer_ids)
        k, hidden = len(self._hooks.aux_layer_ids), int(target_info["hidden_size"])
        dtype = str(state_dtype).removeprefix("torch.")
        meta = eagle3_metadata(
            target_info=target_info,
            aux_layer_ids=self._hooks.aux_layer_ids,
            dtype=dtype,
            tokenizer_identity=tokenizer_identity,
            max_length=max_length,
            extra=metadata,
        )
        writer = ShardWriter(out_dir, eagle3_schema(hidden, k, dtype), meta, **writer_options)
        self.manifest_path = writer.manifest_path
        self.done = set(writer.sample_ids())
        self._sink = RingSink(writer, **ring_options)
        self._nonfinite = nonfinite
        self._max_length = max_length
        self._vocab_size = int(target_info["vocab_size"])
        self._device = next(target.parameters()).device
        self.counts = dict.fromkeys(("submitted", "written", "already_done", "dropped", "nonfinite_skipped"), 0)
        self.forward_seconds = self.store_seconds = 0.0
        self.manifest: dict[str, Any] | None = None
        self._hooks.__enter__()

    def submit(self, samples: Sequence[Any]) -> None:
        """Runs one batched forward over ``samples`` and stores each sample's states unpadded.

        Each sample has ``index`` (int, the sample id), ``id`` (str or None, stored as the key),
        ``input_ids [L]`` int64 and ``loss_mask [L]`` (0/1), e.g. :class:`eagle_io.data.TokenizedSample`.
        Samples already in the dataset are skipped and counted (``already_done``).

        Raises:
            SchemaError: a sample with 0 tokens, more than ``max_length``, a loss mask of another length,
                or token ids outside the target's vocabulary (checked before the forward).
            NonFiniteStatesError: NaN/Inf states under ``nonfinite="raise"`` (names sample and row).
            RingTimeoutError: the writers could not keep up for the ring's timeout.
        """
        self.counts["submitted"] += len(samples)
        for s in samples:
            self._check_sample(s)
        todo = [s for s in samples if s.index not in self.done]
        self.counts["already_done"] += len(samples) - len(todo)
        if not todo:
            return
        width = max(len(s.input_ids) for s in todo)
        ids = torch.zeros(len(todo), width, dtype=torch.int64)
        mask = torch.zeros(len(todo), width, dtype=torch.int64)
        for b, s in enumerate(todo):
            ids[b, : len(s.input_ids)] = s.input_ids
            mask[b, : len(s.input_ids)] = 1
        t0 = time.perf_counter()
        out = self._hooks.forward(ids.to(self._device), mask.to(self._device))
        t1 = time.perf_counter()
        self.forward_seconds += t1 - t0
        finite = bool(torch.isfinite(out.aux_hidden_states).all() and torch.isfinite(out.hidden_states).all())
        for b, s in enumerate(todo):
            if out.lengths[b] != len(s.input_ids):
                raise RuntimeError(f"sample {s.index}: captured {out.lengths[b]} tokens for {len(s.input_ids)} inputs")
            aux, hidden = out.aux(b), out.hidden(b)
            if not finite and not self._check_finite(s.index, aux, hidden):
                continue
            tensors = {
                "input_ids": s.input_ids,
                "loss_mask": s.loss_mask.to(torch.uint8),
                "aux_hidden_states": aux,
                "hidden_states": hidden,
            }
            if self._sink.put(s.index, tensors, key=s.id or ""):
                self.done.add(s.index)
                self.counts["written"] += 1
            else:
                self.counts["dropped"] += 1
        self.store_seconds += time.perf_counter() - t1

    def _check_sample(self, s: Any) -> None:
        """Refuses, before any forward, a sample this run cannot store as declared."""
        n = len(s.input_ids)
        problem = None
        if n == 0:
            problem = "it has 0 tokens"
        elif self._max_length is not None and n > self._max_length:
            problem = f"it has {n} tokens, more than this run's max_length {self._max_length}"
        elif len(s.loss_mask) != n:
            problem = f"its loss_mask has {len(s.loss_mask)} tokens for {n} input_ids"
        elif int(s.input_ids.min()) < 0 or int(s.input_ids.max()) >= self._vocab_size:
            bad = int(s.input_ids.max()) if int(s.input_ids.max()) >= self._vocab_size else int(s.input_ids.min())
            problem = f"it holds token id {bad}, outside the target's vocab of {self._vocab_size}"
        if problem:
            raise SchemaError.for_sample(s.index, f"{problem}; nothing of it was written")

    def _check_finite(self, sample_id: int, aux: torch.Tensor, hidden: torch.Tensor) -> bool:
        bad = ~(torch.isfinite(aux).all(dim=-1) & torch.isfinite(hidden).all(dim=-1))
        if not bool(bad.any()):
            return True
        row = int(bad.nonzero()[0, 0])
        if self._nonfinite == "skip":
            self.counts["nonfinite_skipped"] += 1
            return False
        err = NonFiniteStatesError(
            f"sample {sample_id}: NaN/Inf in captured states at token row {row} "
            f"({int(bad.sum())} bad rows); nothing of this sample was written"
        )
        err.sample_id, err.row = sample_id, row
        raise err

    def stats(self) -> dict[str, Any]:
        """Counts, forward/store seconds and the writer's and ring's counters."""
        return {
            **self.counts,
            "forward_seconds": self.forward_seconds,
            "store_seconds": self.store_seconds,
            **self._sink.stats(),
        }

    def close(self) -> dict[str, Any]:
        """Removes the hooks, drains the ring and commits the last shard; returns the manifest."""
        if self.manifest is None:
            self._hooks.__exit__(None, None, None)
            self.manifest = self._sink.close()
        return self.manifest

    def __enter__(self) -> CaptureSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def capture(
    target: Any,
    out_dir: str | os.PathLike[str],
    *,
    target_info: Mapping[str, Any],
    tokenizer_identity: Mapping[str, Any] | None = None,
    aux_layer_ids: Sequence[int] | None = None,
    state_dtype: torch.dtype = torch.bfloat16,
    max_length: int | None = None,
    metadata: Mapping[str, Any] | None = None,
    nonfinite: str = "raise",
    ring_bytes: int = 1 << 30,
    timeout_s: float = 600.0,
    drop_when_full: bool = False,
    **writer_options: Any,
) -> CaptureSession:
    """Starts capturing EAGLE-3 training data from ``target`` into ``out_dir``.

    ``target`` is a Hugging Face Llama-like model (the reference path, :mod:`eagle_io.capturing.hf`), or an
    ``sglang.Engine`` launched in capture-only mode (:mod:`eagle_io.capturing.sglang`, docs/SERVING.md). Each
    :meth:`CaptureSession.submit` runs one batched forward and stores, per sample, ``input_ids [L]`` int64,
    ``loss_mask [L]`` uint8, ``aux_hidden_states [L, k*H]`` and ``hidden_states [L, H]`` (post-norm) in
    ``state_dtype``; padding is never stored. On exit (also on an exception) the ring is drained and the
    manifest committed, so everything submitted before stays valid.

    Args:
        target_info: facts about the target (``load_target``'s info: ``num_layers``, ``hidden_size``, ...).
        tokenizer_identity: :func:`eagle_io.data.chat_template_identity`, recorded in the manifest.
        aux_layer_ids: eagle-io ids (input of decoder layer i); None = SGLang's default ``[2, N//2, N-3]``.
        state_dtype: stored dtype (float32 forwards are rounded to nearest-even).
        nonfinite: ``"raise"`` (default) or ``"skip"`` (counted) for samples with NaN/Inf states.
        ring_bytes, timeout_s, drop_when_full: the capture ring (:class:`eagle_io.capturing.ring.RingSink`).
        writer_options: :class:`eagle_io.ShardWriter` options (``shard_bytes``, ``threads``, ``rank``,
            ``world_size``, ``resume``, ...).
    """
    from .sglang import client as sglang_client

    if sglang_client.is_sglang_engine(target):
        return sglang_client.SGLangCaptureSession(
            target,
            out_dir,
            state_dtype=str(state_dtype).removeprefix("torch."),
            metadata=metadata,
            target_info=target_info,
            tokenizer_identity=tokenizer_identity,
            aux_layer_ids=aux_layer_ids,
            max_length=max_length,
            nonfinite=nonfinite,
            ring_bytes=ring_bytes,
            timeout_s=timeout_s,
            **writer_options,
        )
    batch = writer_options.pop("batch", 16)
    return CaptureSession(
        target,
        out_dir,
        target_info=target_info,
        tokenizer_identity=tokenizer_identity,
        aux_layer_ids=aux_layer_ids,
        state_dtype=state_dtype,
        max_length=max_length,
        metadata=metadata,
        nonfinite=nonfinite,
        writer_options=writer_options,
        ring_options={
            "ring_bytes": ring_bytes,
            "timeout_s": timeout_s,
            "drop_when_full": drop_when_full,
            "batch": batch,
        },
    )
