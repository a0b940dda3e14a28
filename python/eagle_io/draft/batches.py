"""Training batches of an eagle-io dataset as the reference trainer and the offline accept length read them: the
feed's right-padded batches shifted so position ``t`` is trained toward ``t+1`` (:func:`make_batch`), the check that
they hold finite states, and the frozen target head's argmax per position (:class:`Teacher`, cached)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import NonFiniteTrainingError

# --- data: the feed's padded batches, shifted --------------------------------------------------------------


def make_batch(dataset: Any, positions: Sequence[int]) -> dict[str, Any]:
    """One right-padded, shifted training batch of ``dataset``'s items at ``positions``.

    Args:
        dataset: an :class:`eagle_io.feed.ShardDataset` (its ``max_length`` truncates each sample first).

    Returns:
        ``aux [B, T, k*H]`` (stored dtype), ``next_ids [B, T]`` int64 (``input_ids[t+1]``, 0 without one),
        ``target_hidden [B, T, H]`` (``hidden_states[t+1]``, 0 without one), ``mask [B, T]`` bool
        (``loss_mask[t+1] == 1`` and ``t+1`` is a real token of the same sample), ``lengths [B]`` int64,
        ``positions`` (the dataset positions of the ``B`` rows, a list: without the records a dataset opened with
        ``on_corrupt="skip"`` left out, so ``B`` can be smaller than ``len(positions)``), ``sample_ids`` (theirs, a
        list). Built with
        :class:`eagle_io.feed.PaddingCollator` and :func:`eagle_io.feed.shift_targets` (``loss_mask="target"``).
    """
    from ..feed import PaddingCollator, shift_targets

    batch = shift_targets(PaddingCollator().collate_from(dataset, list(positions)), loss_mask="target")
    left_out = {s["item"] for s in batch["skipped"] + batch["unsupervised"]}
    return {
        "aux": batch["aux_hidden_states"],
        "next_ids": batch["next_input_ids"],
        "target_hidden": batch["target_hidden_states"],
        "mask": batch["loss_mask"] == 1,
        "lengths": batch["lengths"],
        "positions": [p for p in positions if p not in left_out],
        "sample_ids": list(batch["sample_ids"]),
    }


def check_finite_batch(batch: dict[str, Any], where: str) -> None:
    """Refuses a :func:`make_batch` batch whose states hold NaN/Inf: training on it gives a NaN loss and metrics
    computed from NaN.

    Raises:
        NonFiniteTrainingError: naming ``where`` (e.g. ``"step 12"``) and the sample ids holding them.
    """
    bad = []
    for name in ("aux", "target_hidden"):
        x = batch[name]
        rows = ~torch.isfinite(x.reshape(x.shape[0], -1)).all(-1)
        bad += [sid for sid, b in zip(batch["sample_ids"], rows.tolist(), strict=True) if b and sid not in bad]
    if bad:
        raise NonFiniteTrainingError(
            f"{where}: the states of sample id(s) {sorted(bad)} hold NaN/Inf; nothing is trained on them "
            "(`eagle-io verify` lists every such sample)"
        )


def _teacher_ids(head_w: torch.Tensor, target_hidden: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """Full-vocabulary argmax of ``target_hidden [L, H] @ head_w.T`` (float32), chunked over rows."""
    out = torch.empty(target_hidden.shape[0], dtype=torch.int64)
    for i in range(0, target_hidden.shape[0], chunk):
        out[i : i + chunk] = (target_hidden[i : i + chunk].float() @ head_w.T).argmax(-1)
    return out


class Teacher:
    """The teacher's full-vocabulary argmax per dataset position (``hidden_states @ head_w.T``, ``head_w [vocab, H]``
    float32), computed on first use and cached (the target head is frozen); ``seconds`` accumulates that cost. Share
    one between calls over the same dataset object (its positions are the keys)."""

    def __init__(self, head_w: torch.Tensor) -> None:
        self.head_w = head_w
        self.cache: dict[int, torch.Tensor] = {}
        self.seconds = 0.0

    def add_target_ids(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Adds ``target_ids [B, T]`` int64 (0 where there is no target) to a :func:`make_batch` batch."""
        t0 = time.perf_counter()
        out = torch.zeros(batch["next_ids"].shape, dtype=torch.int64)
        for b, pos in enumerate(batch["positions"]):
            n = int(batch["lengths"][b])
            ids = self.cache.get(pos)
            if ids is None:
                ids = self.cache[pos] = _teacher_ids(self.head_w, batch["target_hidden"][b, :n])
            out[b, :n] = ids
        batch["target_ids"] = out
        self.seconds += time.perf_counter() - t0
        return batch
