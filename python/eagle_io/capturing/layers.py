"""Auxiliary-layer ids for EAGLE-3 capture: the one place that defines their meaning.

Convention used everywhere in eagle-io (and written into dataset manifests as
:data:`AUX_LAYER_CONVENTION`): id ``i`` is the residual stream at the *input* of 0-based decoder layer ``i``,
which equals Hugging Face ``output_hidden_states[i]`` (index 0 is the embedding output, index ``k`` the output
of decoder layer ``k - 1``). SGLang's Llama capture uses the same meaning for the ids it stores in
``LlamaModel.layers_to_capture``: ``sglang/srt/models/llama.py``, ``LlamaModel.forward`` appends
``hidden_states + residual`` *before* running layer ``i`` when ``i in self.layers_to_capture``.

Valid ids are ``1 <= i <= N - 1`` for a target with ``N`` decoder layers:

* ``0`` (the embedding output) is rejected: SGLang's ``LlamaModel.forward`` cannot capture it (``residual`` is
  still ``None`` before layer 0, so ``hidden_states + residual`` fails), and it carries no context.
* ``N`` (the final *pre-norm* output) is rejected: SGLang's capture loop stops at layer ``N - 1`` and would
  silently return one state fewer. The final state eagle-io stores is the *post-norm* one, kept separately.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "AUX_LAYER_CONVENTION",
    "default_aux_layer_ids",
    "from_sglang_deepseek_explicit",
    "from_sglang_llama_explicit",
    "from_specforge",
    "to_sglang_llama_explicit",
    "validate_aux_layer_ids",
]

AUX_LAYER_CONVENTION = "input of 0-based decoder layer i = HF output_hidden_states[i] (index 0 = embedding output)"


def validate_aux_layer_ids(ids: Sequence[int], num_layers: int) -> list[int]:
    """Check aux-layer ids (eagle-io convention, see module docstring) and return them as a list of ``int``.

    Rules: at least one id; each an ``int`` with ``1 <= id <= num_layers - 1``; strictly ascending (hence
    distinct).
    Ascending order is required, not repaired: the stored ``[L, k*H]`` concatenation follows layer-execution
    order (as SGLang's ``pack_aux_hidden_states`` does), so a caller giving another order would be surprised.

    Raises:
        ValueError: naming the offending id and the rule it breaks, or if ``num_layers < 2``.
        TypeError: if an id is not an integer (``bool`` included).
    """
    if num_layers < 2:
        raise ValueError(f"num_layers must be >= 2 to have any valid aux layer id, got {num_layers}")
    out: list[int] = []
    if len(ids) == 0:
        raise ValueError("aux layer ids must not be empty")
    for pos, i in enumerate(ids):
        if isinstance(i, bool) or not isinstance(i, int):
            raise TypeError(f"aux layer id at position {pos} is {i!r} ({type(i).__name__}), expected int")
        if not 1 <= i <= num_layers - 1:
            raise ValueError(
                f"aux layer id {i} out of range: ids must satisfy 1 <= id <= num_layers-1 = {num_layers - 1} "
                f"(id = input of 0-based decoder layer id; 0 = embedding output and {num_layers} = final "
                "pre-norm output are not capturable)"
            )
        if out and i == out[-1]:
            raise ValueError(f"aux layer id {i} is duplicated in {list(ids)}: ids must be distinct")
        if out and i < out[-1]:
            raise ValueError(f"aux layer id {i} follows {out[-1]} in {list(ids)}: ids must be sorted ascending")
        out.append(int(i))
    return out


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """SGLang's default EAGLE-3 aux layers ``[2, N//2, N-3]`` for a target with ``N`` decoder layers.

    Defined in SGLang by ``LlamaForCausalLM.set_eagle3_layers_to_capture(layer_ids=None)``
    (``sglang/srt/models/llama.py``: ``self.model.layers_to_capture = [2, num_layers // 2, num_layers - 3]``;
    the Qwen3, DeepSeek-V2/V3 and other setters use the same list). Examples: N=30 -> [2, 15, 27];
    N=61 -> [2, 30, 58].

    Raises:
        ValueError: if the three ids collide or fall out of range (``N < 7``), e.g. N=6 gives [2, 3, 3];
            pass explicit ids for such tiny models.
    """
    ids = [2, num_layers // 2, num_layers - 3]
    try:
        return validate_aux_layer_ids(ids, num_layers)
    except ValueError as exc:
        raise ValueError(
            f"default aux layer ids [2, N//2, N-3] = {ids} are invalid for num_layers={num_layers} "
            f"(need N >= 7): {exc}; pass explicit aux layer ids"
        ) from exc


def from_sglang_llama_explicit(ids: Sequence[int]) -> list[int]:
    """Convert ids given to SGLang's Llama setter to eagle-io ids: ``+1`` each.

    SGLang's ``LlamaForCausalLM.set_eagle3_layers_to_capture(layer_ids)`` stores
    ``[i + 1 for i in layer_ids]`` (explicit ids there mean "output of layer i"); the default branch does
    *not* add 1. This returns what SGLang would capture, in eagle-io's convention. Not validated (the layer
    count is unknown here).
    """
    return [int(i) + 1 for i in ids]


def to_sglang_llama_explicit(ids: Sequence[int]) -> list[int]:
    """Inverse of :func:`from_sglang_llama_explicit`: eagle-io ids -> argument for SGLang's Llama setter."""
    return [int(i) - 1 for i in ids]


def from_sglang_deepseek_explicit(ids: Sequence[int]) -> list[int]:
    """Convert ids given to SGLang's DeepSeek-V2/V3 setter to eagle-io ids.

    ``DeepseekV2ForCausalLM.set_eagle3_layers_to_capture`` (``sglang/srt/models/deepseek_v2.py``, as read from
    sglang 0.5.23 in eagle-io's reference notes) adds 1 to every id only when ``layer_ids[0] == 1``
    (SpecForge-style ids); otherwise it uses them unchanged.
    """
    ids = [int(i) for i in ids]
    return [i + 1 for i in ids] if ids and ids[0] == 1 else ids


def from_specforge(ids: Sequence[int]) -> list[int]:
    """Convert SpecForge ids to eagle-io ids: ``+1`` each.

    SpecForge (``scripts/prepare_hidden_states.py``) calls ``set_eagle3_layers_to_capture([1, N//2-1, N-4])``,
    which SGLang's Llama setter shifts by +1 to ``[2, N//2, N-3]``: the same physical layers as the default.
    """
    return from_sglang_llama_explicit(ids)
