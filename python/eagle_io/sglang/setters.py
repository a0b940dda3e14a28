"""SGLang's layer-id setters: what each target model's ``set_eagle3_layers_to_capture`` stores in
``layers_to_capture``, what its forward then captures, and the ids to write into a draft config so that it
captures the ids a dataset was trained on (SGLang 0.5.23; the supported range is
:data:`eagle_io.sglang.compat.SUPPORTED_SGLANG`).

Ids here are eagle-io ids (input of 0-based decoder layer i: :mod:`eagle_io.store.eagle3`, which also holds their
one validator), except the *explicit* ids a draft config carries in
``eagle_config["eagle_aux_hidden_state_layer_ids"]``, whose meaning depends on the target's setter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import InvalidArgumentError
from ..store.eagle3 import sglang_default_ids, validate_aux_layer_ids

__all__ = [
    "DEEPSEEK_STYLE_SETTERS",
    "FINAL_BOUNDARY_SETTERS",
    "PACKING_TARGETS",
    "SETTER_RULES",
    "SetterRule",
    "capturable_range",
    "captured_ids",
    "default_capture_ids",
    "explicit_ids_for",
    "from_specforge",
    "served_aux_layer_ids",
    "setter_for",
    "setter_rule",
    "short_capture",
]


@dataclass(frozen=True)
class SetterRule:
    """How one family of SGLang targets turns ``eagle_aux_hidden_state_layer_ids`` into ``layers_to_capture``.

    Attributes:
        explicit: ``"+1"`` (every id shifted), ``"+1 if first is 1"`` (DeepSeek-style), ``"keep if max is N"``
            (gpt-oss: kept when the largest id is ``N``, else +1).
        default_shift: added to SGLang's default ``[2, N//2, N-3]`` (1 only for MiniMax-M3-VL).
        final_boundary: the forward also captures id ``N`` (the final pre-norm boundary).
        source: the SGLang function the rule is read from.
    """

    explicit: str
    default_shift: int
    final_boundary: bool
    source: str


_LLAMA = SetterRule("+1", 0, False, "srt/models/llama.py: LlamaForCausalLM.set_eagle3_layers_to_capture")
_DEEPSEEK = SetterRule(
    "+1 if first is 1", 0, False, "srt/models/deepseek_v2.py: DeepseekV2ForCausalLM.set_eagle3_layers_to_capture"
)
_GPT_OSS = SetterRule(
    "keep if max is N", 0, True, "srt/models/gpt_oss.py: GptOssForCausalLM.set_eagle3_layers_to_capture"
)
_LLAMA_FINAL = SetterRule(
    "+1",
    0,
    True,
    "srt/models/gemma3_causal.py, gemma4_causal.py, minimax_m3.py: Llama's +1 setter; the model's forward also "
    "appends a state for id N after its layer loop",
)
_MINIMAX_M3_VL = SetterRule(
    "+1",
    1,
    True,
    "srt/models/minimax_m3_vl.py: MiniMaxM3SparseForConditionalGeneration.set_eagle3_layers_to_capture "
    "(adds +1 to the default ids too; MiniMaxM3Model.forward captures end_layer)",
)

SETTER_RULES: dict[str, SetterRule] = {
    "DeepseekV2ForCausalLM": _DEEPSEEK,
    "DeepseekV3ForCausalLM": _DEEPSEEK,  # subclass of DeepseekV2ForCausalLM
    "DeepseekV32ForCausalLM": _DEEPSEEK,  # subclass
    "GlmMoeDsaForCausalLM": _DEEPSEEK,  # srt/models/glm4_moe.py: subclass of DeepseekV2ForCausalLM
    "MistralLarge3ForCausalLM": _DEEPSEEK,  # srt/models/mistral_large_3.py: subclass of DeepseekV3ForCausalLM
    "KimiK25ForConditionalGeneration": _DEEPSEEK,  # srt/models/kimi_k25.py delegates to its DeepSeek-V3 model
    "Glm4MoeLiteForCausalLM": _DEEPSEEK,  # srt/models/glm4_moe_lite.py copies DeepSeek's rule
    "GptOssForCausalLM": _GPT_OSS,
    "Gemma3ForCausalLM": _LLAMA_FINAL,
    "Gemma3ForConditionalGeneration": _LLAMA_FINAL,  # gemma3_mm.py delegates to its Gemma3ForCausalLM
    "Gemma4ForCausalLM": _LLAMA_FINAL,
    "Gemma4ForConditionalGeneration": _LLAMA_FINAL,  # gemma4_mm.py: +1 on its Gemma4TextModel
    "MiniMaxM3SparseForCausalLM": _LLAMA_FINAL,
    "MiniMaxM3SparseForConditionalGeneration": _MINIMAX_M3_VL,
}
"""Target architecture -> its setter's rule; every architecture not listed uses Llama's (``[i + 1 for i in
layer_ids]``: Llama, Qwen2/3, Qwen3-MoE/Next/VL, Qwen3.5, GLM-4-MoE, Gemma, MiniMax-M2/M3, ... in SGLang 0.5.23;
wrappers such as Gemma3/Llama4 VLMs delegate to a Llama-rule language model)."""

DEEPSEEK_STYLE_SETTERS = frozenset(a for a, r in SETTER_RULES.items() if r is _DEEPSEEK)
"""Targets whose setter adds +1 only when ``layer_ids[0] == 1`` (``srt/models/deepseek_v2.py``,
``DeepseekV2ForCausalLM.set_eagle3_layers_to_capture``; ``kimi_k25.py`` delegates to its DeepSeek
``language_model``; ``glm4_moe_lite.py`` copies the rule)."""

FINAL_BOUNDARY_SETTERS = frozenset(a for a, r in SETTER_RULES.items() if r.final_boundary)
"""Targets whose forward also captures id ``N`` after the layer loop: gpt-oss (``srt/models/gpt_oss.py``: ids kept
as given when ``max(ids) == num_layers``, else +1; ``GptOssModel.forward`` captures ``end_layer`` at the final
norm), Gemma-3/4 and MiniMax-M3 (Llama's +1 setter; ``if num_layers in self.layers_to_capture`` after the loop).
What each appends there is that model's final-boundary state; eagle-io's HF capture records the input of the
final norm."""


def setter_for(architecture: str) -> SetterRule:
    """The :class:`SetterRule` of a target architecture (Llama's for any architecture not in
    :data:`SETTER_RULES`)."""
    return SETTER_RULES.get(architecture, _LLAMA)


def default_capture_ids(num_layers: int, architecture: str | None = None) -> list[int]:
    """SGLang's default EAGLE-3 aux layers ``[2, N//2, N-3]``, what every model's ``set_eagle3_layers_to_capture``
    stores when the draft config names no ids (``srt/models/llama.py``: ``layer_ids=None`` branch; the Qwen3,
    DeepSeek-V2/V3 and other setters use the same list; MiniMax-M3-VL's adds +1, see :data:`SETTER_RULES`).
    Not validated (see :func:`eagle_io.store.eagle3.default_aux_layer_ids`)."""
    shift = setter_for(architecture).default_shift if architecture else 0
    return [i + shift for i in sglang_default_ids(num_layers)]


def served_aux_layer_ids(architecture: str, num_layers: int | None, explicit_ids: Sequence[int] | None) -> list[int]:
    """The ids SGLang puts in ``layers_to_capture`` (eagle-io convention: input of 0-based layer i).

    ``explicit_ids`` is what SGLang passes to ``set_eagle3_layers_to_capture``: the draft config's
    ``eagle_config["eagle_aux_hidden_state_layer_ids"]`` (``spec_aux_hidden_state.py``,
    ``_resolve_eagle_aux_hidden_state``), None when absent. Rules per setter (:data:`SETTER_RULES`):

    * None: :func:`default_capture_ids` (needs ``num_layers``).
    * Llama and most models: ``[i + 1 for i in ids]`` (explicit ids mean "output of layer i").
    * :data:`DEEPSEEK_STYLE_SETTERS`: ``+1`` only if ``ids[0] == 1`` (SpecForge-style ids), else unchanged.
    * :data:`FINAL_BOUNDARY_SETTERS`: unchanged if ``max(ids) == N``, else ``+1``.

    Duplicates and out-of-range ids are passed through as SGLang does (see :func:`captured_ids`).

    Raises:
        InvalidArgumentError: ``explicit_ids`` is None and ``num_layers`` is unknown (None).
    """
    rule = setter_for(architecture)
    if explicit_ids is None:
        if num_layers is None:
            raise InvalidArgumentError("SGLang's default aux layers [2, N//2, N-3] need the target's layer count")
        return default_capture_ids(num_layers, architecture)
    ids = [int(i) for i in explicit_ids]
    if rule.explicit == "+1 if first is 1":
        return [i + 1 for i in ids] if ids and ids[0] == 1 else ids
    if rule.explicit == "keep if max is N":
        return ids if ids and max(ids) == num_layers else [i + 1 for i in ids]
    return [i + 1 for i in ids]


def setter_rule(architecture: str) -> str:
    """One line describing how ``architecture``'s SGLang setter maps explicit ids to captured (eagle-io) ids."""
    rule = setter_for(architecture)
    if rule.explicit == "+1 if first is 1":
        return f"SGLang's {architecture} setter adds +1 to every id only when the first id is 1"
    if rule.explicit == "keep if max is N":
        return f"SGLang's {architecture} setter keeps the ids when the largest is num_layers, else adds +1"
    return f"SGLang's {architecture} setter adds +1 to every explicit id"


def capturable_range(architecture: str, num_layers: int) -> tuple[int, int]:
    """Inclusive range of ids SGLang's forward loop can capture: ``1..N-1`` (``LlamaModel.forward`` checks
    ``i in layers_to_capture`` for ``i`` in ``range(start_layer, end_layer)``; id 0 has no residual yet), and
    ``1..N`` for :data:`FINAL_BOUNDARY_SETTERS` (gpt-oss also captures the final boundary)."""
    return 1, num_layers if setter_for(architecture).final_boundary else num_layers - 1


def final_boundary_allowed(architecture: str, num_layers: int | None) -> bool:
    """Whether id ``N`` (the final pre-norm boundary) is a capturable aux layer id on this target: its
    :func:`capturable_range` reaches ``N`` (:data:`FINAL_BOUNDARY_SETTERS`); False when ``N`` is unknown. The one
    statement of the rule every ``validate_aux_layer_ids(..., final_boundary=)`` of an SGLang target uses."""
    return num_layers is not None and capturable_range(architecture, num_layers)[1] == num_layers


def captured_ids(architecture: str, num_layers: int, layers_to_capture: Sequence[int]) -> list[int]:
    """The states an SGLang target actually records for ``layers_to_capture``, in the order they arrive.

    The forward loops once over the layers and captures layer ``i`` when ``i in layers_to_capture``
    (``LlamaModel.forward``; the per-layer ``_is_layer_to_capture`` flags of Qwen3.5/Qwen3-Next/MiniMax-M3 are set
    from the same list), so a duplicated id is captured once, ids outside :func:`capturable_range` never, and the
    order is execution order: ``sorted(set(ids) & range)``. ``len()`` of this is the number of aux states the
    draft receives (width ``len * target_hidden``).
    """
    lo, hi = capturable_range(architecture, num_layers)
    return sorted({int(i) for i in layers_to_capture if lo <= int(i) <= hi})


def explicit_ids_for(architecture: str, num_layers: int | None, wanted: Sequence[int]) -> list[int] | None:
    """The ``eagle_aux_hidden_state_layer_ids`` to write into the draft config so SGLang's setter for
    ``architecture`` captures ``wanted`` (eagle-io ids) on this target, or None if that setter cannot express
    them with non-negative ids.

    Raises:
        ArgumentTypeError / InvalidArgumentError: ``wanted`` breaks :func:`validate_aux_layer_ids` (with the
            target's :func:`capturable_range` when ``num_layers`` is known, else only ``id >= 1``, distinct,
            ascending), so a negative or out-of-range id never turns into a "fix".
    """
    final = final_boundary_allowed(architecture, num_layers)
    wanted = validate_aux_layer_ids(list(wanted), num_layers, final_boundary=final)
    for cand in ([i - 1 for i in wanted], wanted):
        if min(cand) >= 0 and served_aux_layer_ids(architecture, num_layers, cand) == wanted:
            return cand
    return None


def from_specforge(
    ids: Sequence[int], architecture: str = "LlamaForCausalLM", num_layers: int | None = None
) -> list[int]:
    """Convert SpecForge ids to eagle-io ids: what SGLang's setter for ``architecture`` captures when given them.

    SpecForge (``scripts/prepare_hidden_states.py``) calls ``set_eagle3_layers_to_capture([1, N//2-1, N-4])``,
    which SGLang's Llama setter shifts by +1 to ``[2, N//2, N-3]``: the same physical layers as the default. The
    per-architecture rules are :func:`served_aux_layer_ids`. Not validated here.
    """
    return served_aux_layer_ids(architecture, num_layers, ids)


PACKING_TARGETS = frozenset(
    {
        "DeepseekV2ForCausalLM",
        "DeepseekV3ForCausalLM",
        "DeepseekV32ForCausalLM",
        "GlmMoeDsaForCausalLM",
        "MistralLarge3ForCausalLM",
        "KimiK25ForConditionalGeneration",  # its language_model is a DeepseekV3ForCausalLM
    }
)
"""Targets whose forward collects aux states in ``AuxHiddenStatePacker(len(layers_to_capture))``
(``srt/models/deepseek_v2.py``, ``DeepseekV2Model.forward``): when fewer states are captured than ids listed (a
duplicate, an id out of range), its ``finalize()`` raises ``RuntimeError("captured 2 of 3 aux hidden states")``
(``srt/layers/aux_hidden_states.py``) at the first forward, instead of sending fewer states as Llama's list does."""


def short_capture(architecture: str, captured: int, listed: int) -> str:
    """What happens on ``architecture`` when ``listed`` ids in ``layers_to_capture`` yield ``captured`` states:
    a crash at the first forward (:data:`PACKING_TARGETS`), or fewer states sent to the draft."""
    if architecture in PACKING_TARGETS:
        return (
            f"SGLang's AuxHiddenStatePacker on {architecture} raises 'captured {captured} of {listed} aux hidden "
            "states' at the first forward (srt/layers/aux_hidden_states.py): the server starts, then fails on its "
            "first request"
        )
    return f"only {captured} of {listed} states are captured and sent to the draft"
