"""The reference chain speculative decoder: an EAGLE-3 draft proposing ``num_steps`` tokens per step (top-k 1),
verified greedily by the target, as SGLang's EAGLE worker runs them (``srt/speculative/eagle_worker_v2.py``).

One request's loop (positions 0-based; ``p`` prompt tokens)::

    prefill      target over the prompt -> aux[0..p-1], first token x_p (greedy)
    draft extend draft over positions 0..p-1 fed (aux[t], token t+1)          EagleDraftWorker._draft_extend_for_prefill
    repeat:
      draft      d_1 = the extend's guess; d_2..d_S from S-1 draft decode steps, each fed the previous
                 step's own H-wide hidden state (fc skipped) and its token      EagleDraftWorker.draft / draft_forward
      verify     target over [x, d_1..d_S] (its KV cache holds the prefix) -> greedy y_0..y_S;
                 j = leading i with d_{i+1} == y_i; accept d_1..d_j and the bonus y_j (accept length j+1)
                                                                              eagle_utils.py verify: accept_lens = j + 1
      draft extend draft cache cut back to the verified prefix, then over the j+1 verified positions fed the
                 target's aux states there and the next tokens [d_1..d_j, y_j]
                                                                     EagleDraftWorker._draft_extend_for_decode
                 (SGLang runs it over all S+1 positions and picks position j: causal attention makes it the same)

Both models keep KV caches (the target's ``DynamicCache`` cropped to the accepted prefix, the draft's
:class:`eagle_io.draft.caches.DraftKVCache`): no prefix is recomputed. The output is the target's greedy decoding by
construction (every emitted token is the target's argmax given the emitted prefix); :func:`greedy_decode` is the plain
decoding it is tested against. Counts follow SGLang (:mod:`eagle_io.draft.acceptance`): every verify step counts its
``j + 1``, also the last one of a request that stops inside the block at EOS or ``max_new_tokens`` (SGLang's
``update_spec_metrics`` adds the verify's ``accept_lens`` before the scheduler trims the output); the prefill's first
token is not a verify step.

``as_algorithm="EAGLE"`` runs the draft as SGLang runs an EAGLE-3 draft launched with ``--speculative-algorithm
EAGLE``: the target captures no aux state, so the draft is fed the target's final post-norm ``H``-wide state
(``LogitsProcessor._get_hidden_states_to_store`` without aux states), ``llama_eagle3.py`` skips ``fc`` because the
width equals the embedding's, and ``EagleDraftWorker.init_lm_head`` (non-EAGLE3 branch) replaces the draft's
``lm_head`` weight with the target's and ignores its ``d2t`` (``init_token_map`` leaves the worker's ``hot_token_id``
None, so draft ids are read as target ids). The draft's ``LogitsProcessor`` keeps the ``draft_vocab_size`` it was
built with (``LlamaForCausalLMEagle3.__init__``: ``config_.vocab_size = draft_vocab_size``), and
``LogitsProcessor._copy_logits_to_buffer`` cuts wider logits to that many columns: under EAGLE the draft can only
propose target ids ``0 .. draft_vocab_size - 1``, whatever its ``d2t`` maps. (Found by holding this decoder to a real
SGLang engine: without the cut it accepted more than SGLang did on a draft with a reduced vocabulary.)

Requests run one after another (batch 1 per forward); counts are pooled over them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..draft.acceptance import AcceptHistogram
from ..draft.caches import DraftKVCache
from ..errors import InvalidArgumentError
from .target import Target, TargetStep

__all__ = ["ALGORITHMS", "SpecOutput", "SpeculativeDecoder", "greedy_decode"]

ALGORITHMS = ("EAGLE3", "EAGLE")


@dataclass
class SpecOutput:
    """What :meth:`SpeculativeDecoder.generate` produced: ``tokens[i]`` the new tokens of prompt ``i`` (ending at
    the first EOS, included, or at ``max_new_tokens``), ``histogram`` the pooled verify counts, ``per_request`` each
    prompt's, ``trace[i]`` prompt ``i``'s verify steps as ``(position of the last verified token, correct drafts)``,
    ``seconds`` wall time, ``target_forwards`` / ``draft_forwards`` forward calls."""

    tokens: list[list[int]]
    histogram: AcceptHistogram
    per_request: list[AcceptHistogram] = field(default_factory=list)
    trace: list[list[tuple[int, int]]] = field(default_factory=list)
    seconds: float = 0.0
    target_forwards: int = 0
    draft_forwards: int = 0

    @property
    def generated_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)


def check_fits(target: Target, prompt: Sequence[int], max_new_tokens: int) -> None:
    """Refuses a request SGLang refuses: ``len(prompt) + max_new_tokens`` over the target's context length
    (``TokenizerManager._validate_one_request``, without ``--allow-auto-truncate``; the context length from
    :attr:`Target.context_length`), so that no figure is measured at positions SGLang never serves.

    Raises:
        InvalidArgumentError: naming the prompt's and the completion's token counts and the context length.
    """
    context = target.context_length
    if len(prompt) + max_new_tokens > context:
        raise InvalidArgumentError(
            f"a prompt of {len(prompt)} tokens and max_new_tokens {max_new_tokens} exceed the target's context length "
            f"of {context} tokens (as SGLang derives it; SGLang refuses such a request): lower max_new_tokens or "
            "use shorter prompts"
        )


def _stop(tokens: list[int], eos: frozenset[int], limit: int) -> bool:
    return len(tokens) >= limit or (bool(tokens) and tokens[-1] in eos)


def _append(out: list[int], new: Sequence[int], eos: frozenset[int], limit: int) -> None:
    """Appends ``new`` to ``out`` up to the first EOS (included) or ``limit`` tokens."""
    for t in new:
        if _stop(out, eos, limit):
            return
        out.append(int(t))


class SpeculativeDecoder:
    """Chain speculative decoding of a target with an EAGLE-3 draft (module docstring).

    Args:
        target: :class:`eagle_io.spec.target.Target` (its aux layer ids: those SGLang captures for this draft).
        draft: an :class:`eagle_io.draft.Eagle3Draft` in eval mode (``embed_tokens`` = the target's embedding, as
            SGLang's ``set_embed`` shares it).
        num_steps: drafts per verify step (SGLang's ``--speculative-num-steps``; ``--speculative-eagle-topk 1``,
            ``--speculative-num-draft-tokens num_steps + 1``).
        as_algorithm: ``"EAGLE3"`` or ``"EAGLE"`` (what SGLang feeds an EAGLE-3 draft under the wrong flag).
        eos_token_ids: tokens that end a request.

    Raises:
        InvalidArgumentError: ``num_steps < 1``, an unknown ``as_algorithm``, or a target aux width that is not the
            draft's ``fc`` input.
    """

    def __init__(
        self,
        target: Target,
        draft: torch.nn.Module,
        *,
        num_steps: int = 3,
        as_algorithm: str = "EAGLE3",
        eos_token_ids: Sequence[int] = (),
    ) -> None:
        if num_steps < 1:
            raise InvalidArgumentError(f"num_steps must be >= 1, got {num_steps}")
        if as_algorithm not in ALGORITHMS:
            raise InvalidArgumentError(f"as_algorithm must be one of {ALGORITHMS}, got {as_algorithm!r}")
        want = draft.fc.in_features
        got = len(target.aux_layer_ids) * int(target.model.config.hidden_size)
        if as_algorithm == "EAGLE3" and got != want:
            raise InvalidArgumentError(
                f"the target captures {len(target.aux_layer_ids)} aux states {target.aux_layer_ids} x hidden "
                f"{target.model.config.hidden_size} = {got} wide but the draft's fc expects {want}"
            )
        self.target, self.draft = target, draft
        self.num_steps, self.as_algorithm = num_steps, as_algorithm
        self.eos = frozenset(int(e) for e in eos_token_ids)
        self.draft_forwards = 0
        if as_algorithm == "EAGLE":
            self._head = target.lm_head  # init_lm_head: the target's head, no d2t
            self._vocab_ids = None
            self._width = len(draft.draft_token_ids())  # the draft LogitsProcessor's draft_vocab_size columns
        else:
            self._head = None
            self._vocab_ids = draft.draft_token_ids()

    def _states(self, step: TargetStep) -> torch.Tensor:
        return step.final if self.as_algorithm == "EAGLE" else step.aux

    def _guess(self, hidden: torch.Tensor) -> int:
        """The draft's greedy token (a target id) from its pre-norm hidden state ``[H]``."""
        if self._head is None:
            return int(self._vocab_ids[self.draft.logits(hidden).argmax(-1)])
        normed = self.draft.norm(hidden).to(self._head.weight.dtype)
        return int(self._head(normed)[..., : self._width].argmax(-1))

    def _extend(self, states: torch.Tensor, next_ids: Sequence[int], start: int, cache: DraftKVCache) -> torch.Tensor:
        """Draft over positions ``start ..`` (one per state row); returns the last position's hidden ``[H]``."""
        n = states.shape[0]
        ids = torch.as_tensor(next_ids, dtype=torch.int64).reshape(1, n)
        pos = torch.arange(start, start + n).reshape(1, n)
        self.draft_forwards += 1
        return self.draft.extend(states[None], ids, pos, cache)[0, -1]

    @torch.no_grad()
    def _one(
        self, prompt: Sequence[int], max_new_tokens: int
    ) -> tuple[list[int], AcceptHistogram, list[tuple[int, int]]]:
        hist, trace = AcceptHistogram(self.num_steps), []
        p = len(prompt)
        if p == 0:
            raise InvalidArgumentError("an empty prompt: the target needs at least one token")
        check_fits(self.target, prompt, max_new_tokens)
        t_cache, d_cache = self.target.new_cache(), DraftKVCache()
        pre = self.target.forward(prompt, t_cache)
        x = int(pre.next_ids[-1])
        out: list[int] = []
        _append(out, [x], self.eos, max_new_tokens)
        hidden = self._extend(self._states(pre), [*prompt[1:], x], 0, d_cache)
        verified = p  # positions 0..verified-1 are in both caches; token x sits at position `verified`
        while not _stop(out, self.eos, max_new_tokens):
            drafts = [self._guess(hidden)]
            for i in range(1, self.num_steps):  # draft decode steps at positions verified + i - 1
                hidden = self._extend(hidden[None], [drafts[-1]], verified + i - 1, d_cache)
                drafts.append(self._guess(hidden))
            ver = self.target.forward([x, *drafts], t_cache)
            y = ver.next_ids.tolist()
            j = 0
            while j < self.num_steps and drafts[j] == y[j]:
                j += 1
            hist.add(j)
            trace.append((verified, j))
            accepted = [*drafts[:j], y[j]]
            _append(out, accepted, self.eos, max_new_tokens)
            Target.crop(t_cache, verified + j + 1)  # x and the j accepted drafts; the bonus y_j is not in yet
            d_cache.crop(verified)
            hidden = self._extend(self._states(ver)[: j + 1], accepted, verified, d_cache)
            verified += j + 1
            x = y[j]
        return out, hist, trace

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> SpecOutput:
        """Decodes each prompt (token ids) up to ``max_new_tokens`` new tokens or an EOS.

        Raises:
            InvalidArgumentError: ``max_new_tokens`` < 1, an empty prompt, or one that does not fit the target's
                context with ``max_new_tokens`` (:func:`check_fits`).
        """
        if max_new_tokens < 1:
            raise InvalidArgumentError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        t0 = time.perf_counter()
        f0, d0 = self.target.forwards, self.draft_forwards
        tokens, per, traces = [], [], []
        for prompt in prompts:
            toks, hist, trace = self._one([int(t) for t in prompt], max_new_tokens)
            tokens.append(toks)
            per.append(hist)
            traces.append(trace)
        return SpecOutput(
            tokens=tokens,
            histogram=AcceptHistogram.pooled(self.num_steps, per),
            per_request=per,
            trace=traces,
            seconds=time.perf_counter() - t0,
            target_forwards=self.target.forwards - f0,
            draft_forwards=self.draft_forwards - d0,
        )


@torch.no_grad()
def greedy_decode(
    target: Target, prompts: Sequence[Sequence[int]], max_new_tokens: int, eos_token_ids: Sequence[int] = ()
) -> tuple[list[list[int]], float]:
    """The target's own greedy decoding, one token per forward over its KV cache (the reference the speculative
    decoder must equal, and its speed baseline). Returns the new tokens per prompt (as :class:`SpecOutput`) and the
    wall seconds.

    Raises:
        InvalidArgumentError: a prompt that, with ``max_new_tokens``, does not fit the context (:func:`check_fits`).
    """
    eos = frozenset(int(e) for e in eos_token_ids)
    t0 = time.perf_counter()
    outs = []
    for prompt in prompts:
        check_fits(target, prompt, max_new_tokens)
        cache = target.new_cache()
        step = target.forward([int(t) for t in prompt], cache, states=False)
        out: list[int] = []
        while True:
            _append(out, [int(step.next_ids[-1])], eos, max_new_tokens)
            if _stop(out, eos, max_new_tokens):
                break
            step = target.forward([out[-1]], cache, states=False)
        outs.append(out)
    return outs, time.perf_counter() - t0
