"""The target side of speculative decoding: a Hugging Face causal LM run incrementally over its own KV cache
(``transformers.DynamicCache``), handing back what SGLang's target forward hands its draft worker.

Per position of a forward: the greedy next token (``argmax`` of the logits), the aux states (HF
``output_hidden_states[i]`` for each eagle-io id ``i``: the input of decoder layer ``i``, concatenated in layer
order, as SGLang's ``LogitsProcessor._get_hidden_states_to_store`` packs them under ``CaptureHiddenMode.FULL``), and
the final post-norm state (``output_hidden_states[-1]`` in transformers 5.x, the state SGLang stores when no aux
state is captured: what an EAGLE-3 draft receives when served as ``EAGLE``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import InvalidArgumentError

__all__ = ["Target", "TargetStep"]


@dataclass
class TargetStep:
    """One target forward over ``n`` positions: ``next_ids [n]`` int64 (greedy), ``aux [n, k*H]``, ``final [n, H]``
    (float, the model's dtype)."""

    next_ids: torch.Tensor
    aux: torch.Tensor
    final: torch.Tensor


class Target:
    """A loaded Hugging Face causal LM (``eagle_io.capturing.models.load_target``'s model, in eval mode) and the aux
    layer ids SGLang would capture on it for the served draft.

    Args:
        model: the causal LM. One sequence at a time (batch 1): no padding enters a forward.
        aux_layer_ids: eagle-io ids ``1 .. N-1`` (input of 0-based layer ``i``).

    Raises:
        InvalidArgumentError: an id outside ``1 .. N-1`` (id ``N``, the final pre-norm boundary, is not in HF's
            ``output_hidden_states``).
    """

    def __init__(self, model: torch.nn.Module, aux_layer_ids: Sequence[int]) -> None:
        n = int(model.config.num_hidden_layers)
        bad = [i for i in aux_layer_ids if not 1 <= int(i) <= n - 1]
        if bad:
            raise InvalidArgumentError(
                f"aux layer ids {list(aux_layer_ids)}: {bad} outside 1..{n - 1} of this {n}-layer target (the "
                "reference decoder reads HF output_hidden_states, which has no final pre-norm boundary N)"
            )
        self.model = model
        self.aux_layer_ids = [int(i) for i in aux_layer_ids]
        self.forwards = 0

    @property
    def context_length(self) -> int:
        """The target's context length in tokens, as SGLang derives it from its config
        (:func:`eagle_io.sglang.compat.context_length`)."""
        from ..sglang.compat import context_length

        return context_length(self.model.config.to_dict())

    @property
    def lm_head(self) -> torch.nn.Module:
        return self.model.get_output_embeddings()

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    @staticmethod
    def crop(cache: Any, length: int) -> None:
        """Keeps the first ``length`` positions of ``cache``."""
        extra = cache.get_seq_length() - length
        if extra > 0:
            cache.crop(-extra)

    @torch.no_grad()
    def forward(self, ids: Sequence[int] | torch.Tensor, cache: Any, *, states: bool = True) -> TargetStep:
        """Runs ``ids`` (continuing ``cache``, which grows by ``len(ids)``). ``states=False`` (plain decoding) keeps
        no hidden state: ``aux`` and ``final`` are then empty."""
        x = torch.as_tensor(ids, dtype=torch.int64).reshape(1, -1)
        out = self.model(input_ids=x, cache=cache, use_cache=True, output_hidden_states=states)
        self.forwards += 1
        if not states:
            empty = torch.empty(0)
            return TargetStep(next_ids=out.logits[0].argmax(-1), aux=empty, final=empty)
        hs = out.hidden_states
        aux = torch.cat([hs[i][0] for i in self.aux_layer_ids], dim=-1)
        return TargetStep(next_ids=out.logits[0].argmax(-1), aux=aux, final=hs[-1][0])
