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

from ..errors import ArgumentTypeError, InvalidArgumentError

__all__ = [
    "AUX_LAYER_CONVENTION",
    "DEEPSEEK_STYLE_SETTERS",
    "FINAL_BOUNDARY_SETTERS",
    "capturable_range",
    "default_aux_layer_ids",
    "default_capture_ids",
    "explicit_ids_for",
    "from_specforge",
    "served_aux_layer_ids",
    "setter_rule",
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
        InvalidArgumentError: naming the offending id and the rule it breaks, or if ``num_layers < 2``
            (a ``ValueError``).
        ArgumentTypeError: if an id is not an integer (``bool`` included; a ``TypeError``).
    """
    if num_layers < 2:
        raise InvalidArgumentError(f"num_layers must be >= 2 to have any valid aux layer id, got {num_layers}")
    out: list[int] = []
    if len(ids) == 0:
        raise InvalidArgumentError("aux layer ids must not be empty")
    for pos, i in enumerate(ids):
        if isinstance(i, bool) or not isinstance(i, int):
            raise ArgumentTypeError(f"aux layer id at position {pos} is {i!r} ({type(i).__name__}), expected int")
        if not 1 <= i <= num_layers - 1:
            raise InvalidArgumentError(
                f"aux layer id {i} out of range: ids must satisfy 1 <= id <= num_layers-1 = {num_layers - 1} "
                f"(id = input of 0-based decoder layer id; 0 = embedding output and {num_layers} = final "
                "pre-norm output are not capturable)"
            )
        if out and i == out[-1]:
            raise InvalidArgumentError(f"aux layer id {i} is duplicated in {list(ids)}: ids must be distinct")
        if out and i < out[-1]:
            raise InvalidArgumentError(
                f"aux layer id {i} follows {out[-1]} in {list(ids)}: ids must be sorted ascending"
            )
        out.append(int(i))
    return out


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """SGLang's default EAGLE-3 aux layers ``[2, N//2, N-3]`` for a target with ``N`` decoder layers
    (:func:`default_capture_ids`, where SGLang's rule is cited), validated.
    Examples: N=30 -> [2, 15, 27]; N=61 -> [2, 30, 58].

    Raises:
        InvalidArgumentError: if the three ids collide or fall out of range (``N < 7``), e.g. N=6 gives [2, 3, 3];
            pass explicit ids for such tiny models.
    """
    ids = default_capture_ids(num_layers)
    try:
        return validate_aux_layer_ids(ids, num_layers)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(
            f"default aux layer ids [2, N//2, N-3] = {ids} are invalid for num_layers={num_layers} "
            f"(need N >= 7): {exc}; pass explicit aux layer ids"
        ) from exc


def from_specforge(
    ids: Sequence[int], architecture: str = "LlamaForCausalLM", num_layers: int | None = None
) -> list[int]:
    """Convert SpecForge ids to eagle-io ids: what SGLang's setter for ``architecture`` captures when given them.

    SpecForge (``scripts/prepare_hidden_states.py``) calls ``set_eagle3_layers_to_capture([1, N//2-1, N-4])``,
    which SGLang's Llama setter shifts by +1 to ``[2, N//2, N-3]``: the same physical layers as the default. The
    per-architecture rules are :func:`served_aux_layer_ids`. Not validated here.
    """
    return served_aux_layer_ids(architecture, num_layers, ids)


# --------------------------------------------------------------------------------------------------------------
# SGLang's setters: what each model's ``set_eagle3_layers_to_capture`` stores in ``layers_to_capture``
# (SGLang 0.5.23; the supported range is in eagle_io.serving.sglang_compat)
# --------------------------------------------------------------------------------------------------------------


DEEPSEEK_STYLE_SETTERS = frozenset(
    {
        "DeepseekV2ForCausalLM",
        "DeepseekV3ForCausalLM",
        "DeepseekV32ForCausalLM",
        "KimiK25ForConditionalGeneration",
        "Glm4MoeLiteForCausalLM",
    }
)
"""Targets whose setter adds +1 only when ``layer_ids[0] == 1`` (``srt/models/deepseek_v2.py``,
``DeepseekV2ForCausalLM.set_eagle3_layers_to_capture``; ``kimi_k25.py`` delegates to its DeepSeek
``language_model``; ``glm4_moe_lite.py`` copies the rule)."""


FINAL_BOUNDARY_SETTERS = frozenset({"GptOssForCausalLM"})
"""``srt/models/gpt_oss.py``: ids are kept as given when ``max(ids) == num_layers`` (the final boundary),
else +1 each."""


def default_capture_ids(num_layers: int) -> list[int]:
    """SGLang's default EAGLE-3 aux layers ``[2, N//2, N-3]``, what every model's ``set_eagle3_layers_to_capture``
    stores when the draft config names no ids (``srt/models/llama.py``: ``layer_ids=None`` branch; the Qwen3,
    DeepSeek-V2/V3 and other setters use the same list). Not validated (see
    :func:`eagle_io.capturing.layers.default_aux_layer_ids`)."""
    return [2, num_layers // 2, num_layers - 3]


def served_aux_layer_ids(architecture: str, num_layers: int | None, explicit_ids: Sequence[int] | None) -> list[int]:
    """The ids SGLang puts in ``layers_to_capture`` (eagle-io convention: input of 0-based layer i).

    ``explicit_ids`` is what SGLang passes to ``set_eagle3_layers_to_capture``: the draft config's
    ``eagle_config["eagle_aux_hidden_state_layer_ids"]`` (``spec_aux_hidden_state.py``,
    ``_resolve_eagle_aux_hidden_state``), None when absent. Rules per setter:

    * None: :func:`default_capture_ids` for every model (needs ``num_layers``).
    * Llama and most models: ``[i + 1 for i in ids]`` (explicit ids mean "output of layer i").
    * :data:`DEEPSEEK_STYLE_SETTERS`: ``+1`` only if ``ids[0] == 1`` (SpecForge-style ids), else unchanged.
    * :data:`FINAL_BOUNDARY_SETTERS`: unchanged if ``max(ids) == N``, else ``+1``.

    Raises:
        InvalidArgumentError: ``explicit_ids`` is None and ``num_layers`` is unknown (None).
    """
    if explicit_ids is None:
        if num_layers is None:
            raise InvalidArgumentError("SGLang's default aux layers [2, N//2, N-3] need the target's layer count")
        return default_capture_ids(num_layers)
    ids = [int(i) for i in explicit_ids]
    if architecture in DEEPSEEK_STYLE_SETTERS:
        return [i + 1 for i in ids] if ids and ids[0] == 1 else ids
    if architecture in FINAL_BOUNDARY_SETTERS:
        return ids if ids and max(ids) == num_layers else [i + 1 for i in ids]
    return [i + 1 for i in ids]


def setter_rule(architecture: str) -> str:
    """One line describing how ``architecture``'s SGLang setter maps explicit ids to captured (eagle-io) ids."""
    if architecture in DEEPSEEK_STYLE_SETTERS:
        return f"SGLang's {architecture} setter adds +1 to every id only when the first id is 1"
    if architecture in FINAL_BOUNDARY_SETTERS:
        return f"SGLang's {architecture} setter keeps the ids when the largest is num_layers, else adds +1"
    return f"SGLang's {architecture} setter adds +1 to every explicit id"


def explicit_ids_for(architecture: str, num_layers: int | None, wanted: Sequence[int]) -> list[int] | None:
    """The ``eagle_aux_hidden_state_layer_ids`` to write into the draft config so SGLang captures ``wanted``
    (eagle-io ids) on this target, or None if the target's setter cannot express them."""
    wanted = [int(i) for i in wanted]
    for cand in ([i - 1 for i in wanted], wanted):
        if served_aux_layer_ids(architecture, num_layers, cand) == wanted:
            return cand
    return None


def capturable_range(architecture: str, num_layers: int) -> tuple[int, int]:
    """Inclusive range of ids SGLang's forward loop can capture: ``1..N-1`` (``LlamaModel.forward`` checks
    ``i in layers_to_capture`` for ``i`` in ``range(start_layer, end_layer)``; id 0 has no residual yet), and
    ``1..N`` for :data:`FINAL_BOUNDARY_SETTERS` (gpt-oss also captures the final boundary)."""
    return 1, num_layers if architecture in FINAL_BOUNDARY_SETTERS else num_layers - 1
