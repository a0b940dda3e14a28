"""The bounds of SGLang's speculative-decoding knobs (``--speculative-num-steps``, ``--speculative-eagle-topk``,
``--speculative-num-draft-tokens``), in one place for every command that takes them: ``check-serving`` (a finding)
and ``eval-draft`` (a refusal before anything loads).

SGLang 0.5.23 accepts values it cannot serve: a topk of -5 parses, and a tree asking for more draft tokens than it
drafts fails in the first verify step. What it can serve, from its own code:

* ``num_steps`` >= 1 draft forwards per verify step; each drafts one token on, so fewer than the context length.
* ``topk`` >= 1 candidates per draft step, drawn from the draft's vocabulary (``draft_vocab_size``).
* ``num_draft_tokens``: with topk 1 SGLang sets it to ``num_steps + 1`` (``speculative_hook.py``, with a warning);
  with topk > 1 the verify step takes the best ``num_draft_tokens - 1`` of the ``topk + (num_steps - 1) * topk**2``
  scored candidates (``speculative/eagle_utils.py``, ``organize_draft_results``: ``torch.topk`` over them), so
  ``2 <= num_draft_tokens <= topk + (num_steps - 1) * topk**2 + 1``.
"""

from __future__ import annotations

__all__ = ["max_draft_tokens", "speculative_param_problems"]


def max_draft_tokens(num_steps: int, topk: int) -> int:
    """The most ``--speculative-num-draft-tokens`` a tree of ``num_steps`` x ``topk`` can verify (root included)."""
    return topk + (num_steps - 1) * topk * topk + 1


def _int(v: object) -> bool:
    return type(v) is int


def speculative_param_problems(
    num_steps: int | None,
    topk: int | None,
    draft_tokens: int | None,
    *,
    context_length: int | None = None,
    draft_vocab_size: int | None = None,
) -> list[str]:
    """One sentence per value SGLang cannot serve, naming the flag, the value and its bound; empty when all are
    fine. None: not given (SGLang picks it)."""
    out = []
    if num_steps is not None:
        if not _int(num_steps) or num_steps < 1:
            out.append(f"--speculative-num-steps {num_steps!r}: must be an integer >= 1")
        elif context_length is not None and num_steps >= context_length:
            out.append(
                f"--speculative-num-steps {num_steps}: must be below the context length {context_length} (each step "
                "drafts one token on)"
            )
    if topk is not None:
        if not _int(topk) or topk < 1:
            out.append(f"--speculative-eagle-topk {topk!r}: must be an integer >= 1")
        elif draft_vocab_size is not None and topk > draft_vocab_size:
            out.append(
                f"--speculative-eagle-topk {topk}: more than the draft's {draft_vocab_size} vocabulary entries it "
                "draws candidates from"
            )
    if draft_tokens is not None:
        steps_ok = _int(num_steps) and num_steps >= 1
        k = topk if _int(topk) and topk >= 1 else 1
        if not _int(draft_tokens) or draft_tokens < 2:
            out.append(
                f"--speculative-num-draft-tokens {draft_tokens!r}: must be an integer >= 2 (the root and a draft)"
            )
        elif steps_ok and k > 1 and draft_tokens > max_draft_tokens(num_steps, k):
            out.append(
                f"--speculative-num-draft-tokens {draft_tokens}: a tree of {num_steps} steps x topk {k} scores "
                f"{max_draft_tokens(num_steps, k) - 1} candidates, so at most {max_draft_tokens(num_steps, k)} tokens "
                "(the root included) can be verified"
            )
    return out
