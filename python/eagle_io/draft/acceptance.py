"""Accept length: how many tokens the target accepts per verify step of a chain (top-k 1) draft, counted SGLang's
way, live (:mod:`eagle_io.spec`) or offline from stored shards (:func:`offline_accept`).

Definitions (the field uses at least four):

* One verify step of ``S = num_steps`` drafts accepts ``j`` leading drafts (``0 <= j <= S``) plus the target's own
  next token (the *bonus* token): its accept length is ``j + 1``. SGLang counts it so (PR #24081: ``accept_*``
  counts the bonus token, ``correct_*`` the accepted drafts only; ``srt/speculative/eagle_utils.py``
  ``accept_lens = num_correct_drafts + 1``).
* ``accept_length`` is pooled: total accept lengths over all verify steps of all requests divided by the number of
  verify steps (SGLang's ``MetricsReporter``: ``spec_num_accept_tokens / spec_num_forward_ct``). The mean of
  per-request means is biased toward short requests (:func:`mean_of_request_means`: 10 verifies at 4.0 and 1000
  at 2.0 give 3.0, pooled 2.02).
* ``per_position_accept_rate[k-1]`` = share of verify steps whose first ``k`` drafts were all accepted (joint), so
  ``accept_length = 1 + sum(per_position_accept_rate)`` exactly; ``per_position_conditional[k-1]`` = the same
  share among the steps whose first ``k - 1`` drafts were accepted (speculators' ``cond_acc``).
* Offline (no target forward), each loss-masked position of a stored sample is a verify step: the draft is rolled
  out teacher-forced over the captured aux states as in SpecForge's test-time training
  (:meth:`eagle_io.draft.Eagle3Draft.ttt_forward`) and draft ``k`` counts as accepted when its token (through
  ``d2t``) equals the target's full-vocabulary argmax there (``lm_head(hidden_states)``) and that target is
  loss-masked. ``accept_length = 1 + sum_k P(first k drafts all correct)`` (joint, bonus counted: NeMo
  ``tau_sim``, DeepSpec ``tau_greedy``). Beside it, ``accept_length_product_of_marginals = 1 + sum_k prod_{j<=k}
  a_j`` over the teacher-forced per-step accuracies ``a_j`` (ModelOpt ``estimated_training_ar``; SpecForge's
  ``eval/simulated_acc_len`` is the same sum without the 1). The product ignores that a draft right at step ``k``
  is usually right at ``k + 1`` too: it understates the joint figure (speculators PR #1032: 1.25 vs 1.5).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import InvalidArgumentError
from .batches import Teacher, check_finite_batch, make_batch

__all__ = ["AcceptHistogram", "OfflineAccept", "mean_of_request_means", "offline_accept"]


@dataclass
class AcceptHistogram:
    """``counts[j]`` = verify steps (or offline start positions) whose first ``j`` drafts were accepted and draft
    ``j + 1`` was not (``j = num_steps``: all accepted). See the module docstring for the definitions."""

    num_steps: int
    counts: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.num_steps < 1:
            raise InvalidArgumentError(f"num_steps must be >= 1, got {self.num_steps}")
        if not self.counts:
            self.counts = [0] * (self.num_steps + 1)
        if len(self.counts) != self.num_steps + 1:
            raise InvalidArgumentError(f"{len(self.counts)} counts for num_steps {self.num_steps} (need num_steps+1)")

    def add(self, correct_drafts: int, n: int = 1) -> None:
        """Counts ``n`` verify steps that accepted ``correct_drafts`` drafts (the bonus token not included)."""
        if not 0 <= correct_drafts <= self.num_steps:
            raise InvalidArgumentError(f"{correct_drafts} correct drafts out of num_steps {self.num_steps}")
        self.counts[correct_drafts] += n

    def merge(self, other: AcceptHistogram) -> AcceptHistogram:
        """Pooled counts of both (same ``num_steps``)."""
        if other.num_steps != self.num_steps:
            raise InvalidArgumentError(f"cannot pool num_steps {self.num_steps} with {other.num_steps}")
        return AcceptHistogram(self.num_steps, [a + b for a, b in zip(self.counts, other.counts, strict=True)])

    @classmethod
    def pooled(cls, num_steps: int, histograms: Iterable[AcceptHistogram]) -> AcceptHistogram:
        """The counts of all ``histograms`` pooled (SGLang's convention: over every verify step, not per request).

        Raises:
            InvalidArgumentError: a histogram of another ``num_steps``.
        """
        out = cls(num_steps)
        for h in histograms:
            out = out.merge(h)
        return out

    @property
    def verify_steps(self) -> int:
        return sum(self.counts)

    @property
    def correct_drafts(self) -> int:
        """Accepted drafts over all steps (SGLang's ``spec_num_correct_drafts``)."""
        return sum(j * c for j, c in enumerate(self.counts))

    @property
    def accept_length(self) -> float | None:
        """Pooled mean accept length, bonus token counted (None without a step)."""
        n = self.verify_steps
        return None if n == 0 else 1.0 + self.correct_drafts / n

    @property
    def accept_rate(self) -> float | None:
        """SGLang's ``spec_accept_rate``: accepted drafts / drafts proposed (``verify_steps * num_steps``)."""
        n = self.verify_steps
        return None if n == 0 else self.correct_drafts / (n * self.num_steps)

    @property
    def per_position_accept_rate(self) -> list[float]:
        """``[k-1]``: share of steps whose first ``k`` drafts were all accepted (joint)."""
        n = self.verify_steps
        if n == 0:
            return [0.0] * self.num_steps
        return [sum(self.counts[k:]) / n for k in range(1, self.num_steps + 1)]

    @property
    def per_position_conditional(self) -> list[float | None]:
        """``[k-1]``: share of steps accepting draft ``k`` among those that accepted drafts ``1 .. k-1`` (None
        where no step got that far)."""
        out: list[float | None] = []
        for k in range(1, self.num_steps + 1):
            reached = sum(self.counts[k - 1 :])
            out.append(None if reached == 0 else sum(self.counts[k:]) / reached)
        return out

    def truncated(self, num_steps: int) -> AcceptHistogram:
        """The histogram the same draft gives with fewer draft steps (a chain accepting ``j`` of ``S`` accepts
        ``min(j, s)`` of ``s <= S``)."""
        if not 1 <= num_steps <= self.num_steps:
            raise InvalidArgumentError(f"cannot truncate num_steps {self.num_steps} to {num_steps}")
        counts = [*self.counts[:num_steps], sum(self.counts[num_steps:])]
        return AcceptHistogram(num_steps, counts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "num_steps": self.num_steps,
            "accept_length": self.accept_length,
            "accept_rate": self.accept_rate,
            "per_position_accept_rate": self.per_position_accept_rate,
            "per_position_conditional": self.per_position_conditional,
            "verify_steps": self.verify_steps,
            "correct_drafts": self.correct_drafts,
            "correct_drafts_histogram": list(self.counts),
        }


def mean_of_request_means(histograms: Sequence[AcceptHistogram]) -> float | None:
    """The mean over requests of each request's own mean accept length: the *biased* figure some tools report
    (short requests weigh as much as long ones). Shown for comparison only; eagle-io reports pooled counts."""
    means = [h.accept_length for h in histograms if h.verify_steps]
    return None if not means else sum(means) / len(means)


@dataclass
class OfflineAccept:
    """:func:`offline_accept`'s result. ``histogram`` is over the loss-masked start positions;
    ``marginal_correct[k]`` / ``marginal_positions[k]`` count step ``k``'s teacher-forced accuracy over the positions
    whose step-``k`` target is loss-masked."""

    histogram: AcceptHistogram
    marginal_correct: list[int]
    marginal_positions: list[int]
    samples: int = 0

    @property
    def accept_length(self) -> float | None:
        return self.histogram.accept_length

    @property
    def per_position_marginal(self) -> list[float]:
        return [c / p if p else 0.0 for c, p in zip(self.marginal_correct, self.marginal_positions, strict=True)]

    @property
    def accept_length_product_of_marginals(self) -> float | None:
        if self.histogram.verify_steps == 0:
            return None
        total, run = 1.0, 1.0
        for a in self.per_position_marginal:
            run *= a
            total += run
        return total

    def to_dict(self) -> dict[str, Any]:
        h = self.histogram
        return {
            "num_steps": h.num_steps,
            "accept_length": h.accept_length,
            "accept_length_product_of_marginals": self.accept_length_product_of_marginals,
            "per_position_accept_rate": h.per_position_accept_rate,
            "per_position_conditional": h.per_position_conditional,
            "per_position_marginal": self.per_position_marginal,
            "positions": h.verify_steps,
            "samples": self.samples,
            "correct_drafts_histogram": list(h.counts),
            "definition": (
                "accept_length = 1 + sum_k P(drafts 1..k all correct) over loss-masked start positions (joint, "
                "bonus token counted, pooled); product_of_marginals = 1 + sum_k prod_{j<=k} a_j (ModelOpt "
                "estimated_training_ar; SpecForge simulated_acc_len = the same without the 1)"
            ),
        }


def chain_correct(
    logits: Sequence[torch.Tensor], draft_ids: torch.Tensor, target_ids: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-step correctness of a teacher-forced unroll.

    Args:
        logits: ``S`` tensors ``[B, L, draft_vocab]`` (:meth:`eagle_io.draft.Eagle3Draft.ttt_forward`).
        draft_ids: ``[draft_vocab]`` target ids of the draft vocabulary (``d2t + arange``).
        target_ids: ``[B, L]`` the target's argmax at ``t + 1`` (what step 0 at ``t`` must guess).
        mask: ``[B, L]`` bool, step 0's target is loss-masked.

    Returns:
        ``correct [B, L, S]`` bool (step ``k`` at ``t`` guessed the target at ``t + 1 + k`` and that target is
        loss-masked) and ``masked [B, L, S]`` bool (that target is loss-masked).
    """
    b, n = target_ids.shape
    steps = len(logits)
    correct = torch.zeros(b, n, steps, dtype=torch.bool)
    masked = torch.zeros(b, n, steps, dtype=torch.bool)
    for k, lg in enumerate(logits):
        pred = draft_ids[lg.argmax(-1)]
        m = torch.zeros_like(mask)
        m[:, : n - k] = mask[:, k:]
        t = torch.zeros_like(target_ids)
        t[:, : n - k] = target_ids[:, k:]
        masked[..., k] = m
        correct[..., k] = (pred == t) & m
    return correct, masked


def count_chains(correct: torch.Tensor, masked: torch.Tensor, starts: torch.Tensor, into: OfflineAccept) -> None:
    """Adds one batch to ``into``: each start position (``starts [B, L]`` bool, usually step 0's mask) is a verify
    step accepting its leading run of correct steps; the marginals count every step over its own mask."""
    steps = correct.shape[-1]
    leading = correct.int().cumprod(-1).sum(-1)  # [B, L]: leading correct steps
    hist = torch.bincount(leading[starts], minlength=steps + 1).tolist()
    for j, c in enumerate(hist):
        into.histogram.add(j, int(c))
    for k in range(steps):
        into.marginal_correct[k] += int(correct[..., k][masked[..., k]].sum())
        into.marginal_positions[k] += int(masked[..., k].sum())


@torch.no_grad()
def offline_accept(
    model: Any,
    dataset: Any,
    positions: Sequence[int],
    head_w: torch.Tensor,
    num_steps: int,
    *,
    batch_size: int = 4,
    teacher: Any = None,
) -> OfflineAccept:
    """Offline accept length of ``model`` over ``dataset``'s items at ``positions`` (module docstring), no target
    forward: the teacher is ``hidden_states @ head_w.T`` (``head_w [vocab, H]``, the target's ``lm_head``).

    Args:
        model: an :class:`eagle_io.draft.Eagle3Draft` (its ``d2t`` maps its guesses to target ids).
        dataset: an :class:`eagle_io.feed.ShardDataset` (batches through :func:`eagle_io.draft.make_batch`: the
            shift contract, ``max_length`` truncation).
        num_steps: drafts per verify step (SGLang's ``--speculative-num-steps``).
        teacher: the teacher's argmax per position (:class:`eagle_io.draft.batches.Teacher`; share one between calls
            on the same dataset object); built when None.

    Raises:
        NonFiniteTrainingError: states holding NaN/Inf (:func:`eagle_io.draft.batches.check_finite_batch`).
    """
    teacher = teacher or Teacher(head_w.float())
    out = OfflineAccept(AcceptHistogram(num_steps), [0] * num_steps, [0] * num_steps)
    was_training = model.training
    model.eval()
    draft_ids = model.draft_token_ids()
    for i in range(0, len(positions), batch_size):
        batch = make_batch(dataset, positions[i : i + batch_size])
        if not batch["positions"]:
            continue
        check_finite_batch(batch, "offline accept length")
        batch = teacher.add_target_ids(batch)
        logits = model.ttt_forward(batch["aux"], batch["next_ids"], num_steps)
        correct, masked = chain_correct(logits, draft_ids, batch["target_ids"], batch["mask"])
        count_chains(correct, masked, batch["mask"], out)
        out.samples += len(batch["positions"])
    model.train(was_training)
    return out
