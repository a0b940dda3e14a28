"""Tiny targets, datasets and TEST-ONLY stand-in drafts for the speculative-decoding tests.

* :func:`tiny_target`: a random 4-layer ``LlamaForCausalLM`` (hidden 64, vocab 96) built from a config, float64 by
  default so that verifying a block and decoding token by token round alike (no near-tie argmax flip).
* :func:`write_dataset`: prompts plus continuations (e.g. the target's own greedy ones, :func:`count_up`), with the
  target's aux and final states, written as eagle-io shards; the continuation is loss-masked.
* :class:`OracleDraft`: a TEST-ONLY STAND-IN for an EAGLE-3 draft with the interface the decoder uses
  (``fc.in_features``, ``draft_token_ids``, ``extend``, ``logits``): it guesses by running the target itself on the
  tokens it was fed, so it proposes exactly the target's next tokens, or a wrong token where ``wrong(position)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

import eagle_io
from helpers.tiny_model import tiny_llama_config

V, H, LAYERS, AUX = 96, 64, 4, [1, 2, 3]


def tiny_target(seed: int = 0, *, dtype: torch.dtype = torch.float64, init: float = 0.3, counting: bool = False):
    """A random tiny Llama (``init``: its initializer range; 0.3 gives varied greedy continuations). ``counting``:
    its layers' output projections zeroed and ``lm_head[j] = embed[j - 1]``, so its greedy next token after ``t`` is
    ``(t + 1) % V``: a target a small draft learns in a few steps, and whose next token is never the one an EAGLE-3
    draft served as ``EAGLE`` guesses (the target's own prediction of the token it is fed)."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_llama_config(V, H, LAYERS, max_position_embeddings=256, initializer_range=init)
    model = LlamaForCausalLM(cfg).to(dtype).eval()
    if counting:
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
            model.lm_head.weight.copy_(torch.roll(model.model.embed_tokens.weight, 1, 0))
    return model


@torch.no_grad()
def states_of(model, ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(aux [L, 3H], final [L, H])`` of one sequence (HF ``output_hidden_states``; ids :data:`AUX`)."""
    out = model(input_ids=torch.tensor([list(ids)]), output_hidden_states=True)
    hs = out.hidden_states
    return torch.cat([hs[i][0] for i in AUX], -1), hs[-1][0]


def count_up(prompt: Sequence[int], n: int) -> list[int]:
    """The counting target's greedy continuation of ``prompt``."""
    return [(prompt[-1] + 1 + i) % V for i in range(n)]


def write_dataset(
    root: Path,
    model,
    prompts: Sequence[Sequence[int]],
    outs: Sequence[Sequence[int]],
    *,
    dtype: str = "float32",
    first_id: int = 0,
) -> None:
    """Writes one sample per prompt (id ``first_id + i``): prompt + ``outs[i]`` (loss-masked), with ``model``'s
    states."""
    meta = {
        "hidden_size": H,
        "vocab_size": V,
        "num_layers": LAYERS,
        "aux_layer_ids": AUX,
        "target_model": {"model_id": "tiny-llama", "architecture": "LlamaForCausalLM"},
        "source_dataset": "synthetic-prompts",
    }
    tdt = getattr(torch, dtype)
    with eagle_io.ShardWriter(root, eagle_io.eagle3_schema(H, len(AUX), dtype), meta, threads=1) as w:
        for i, (p, o) in enumerate(zip(prompts, outs, strict=True)):
            ids = [*p, *o]
            aux, fin = states_of(model, ids)
            mask = torch.tensor([0] * len(p) + [1] * len(o), dtype=torch.uint8)
            w.write(
                first_id + i,
                {
                    "input_ids": torch.tensor(ids),
                    "loss_mask": mask,
                    "aux_hidden_states": aux.to(tdt),
                    "hidden_states": fin.to(tdt),
                },
            )


def prompts_for(n: int, seed: int = 1, lo: int = 1, hi: int = 9) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(0, V, (int(torch.randint(lo, hi, (1,), generator=g)),), generator=g).tolist() for _ in range(n)
    ]


class OracleDraft(torch.nn.Module):
    """TEST-ONLY STAND-IN (module docstring). ``prompts`` in the order the decoder runs them, ``continuations`` the
    target's greedy continuation of each (long enough for the run: ``max_new_tokens + num_steps + 1``), so a guess
    costs no forward. Once the tokens fed leave that continuation (a wrong draft was fed) the guesses no longer
    matter (the verify rejects at the first wrong draft) and are 0."""

    def __init__(
        self,
        prompts: Sequence[Sequence[int]],
        continuations: Sequence[Sequence[int]],
        wrong: Callable[[int], bool] = lambda _p: False,
    ):
        super().__init__()
        self.prompts, self.wrong = [list(p) for p in prompts], wrong
        self.greedy = [list(p) + list(c) for p, c in zip(prompts, continuations, strict=True)]
        self.fc = torch.nn.Linear(len(AUX) * H, H, bias=False)
        self.request = -1
        self.tokens: dict[int, int] = {}

    def draft_token_ids(self) -> torch.Tensor:
        return torch.arange(V)

    def extend(self, states, next_ids, position_ids, cache) -> torch.Tensor:
        pos = position_ids[0].tolist()
        if pos[0] == 0:
            self.request += 1
            self.tokens = {0: self.prompts[self.request][0]}
        for t, tok in zip(pos, next_ids[0].tolist(), strict=True):
            self.tokens[t + 1] = tok
        want = pos[-1] + 2  # the position guessed
        ref = self.greedy[self.request]
        on_track = all(self.tokens[i] == ref[i] for i in range(want))
        guess = ref[want] if on_track else 0
        if self.wrong(want):
            guess = (guess + 1) % V
        out = torch.zeros(1, len(pos), H)
        out[..., 0] = guess
        return out

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot(hidden[..., 0].long(), V).float()
