"""The EAGLE-3 draft SGLang builds from a ``config.json``, and the one shape checker against its checkpoint.

SGLang 0.5.23 builds the draft from ``architectures[0]`` (``ModelConfig`` rewrites no EAGLE-3 draft name), so a
draft that declares a plain ``LlamaForCausalLM`` is built as a plain Llama without ``fc``. The EAGLE-3 draft
classes, :data:`EAGLE3_DRAFT_CLASSES`:

* ``LlamaForCausalLMEagle3`` (``srt/models/llama_eagle3.py``, ``LlamaModel.__init__`` /
  ``LlamaForCausalLMEagle3.__init__`` / ``load_weights``; its ``LlamaDecoderLayer`` over ``srt/models/llama.py``'s):
  every parameter it allocates, for every config switch it reads.
* ``Eagle3DeepseekV2ForCausalLM`` (``srt/models/kimi_k25_eagle3.py``, ``Eagle3MLAModel`` / ``Eagle3MLADecoderLayer``
  over ``srt/models/deepseek_v2.py``'s ``DeepseekV2AttentionMLA`` and ``DeepseekV2MLP``): every parameter too.

The config switches that add parameters (SGLang 0.5.23), each modelled in :func:`draft_build`:

======================================  =====================================================================
``bias``                                ``fc.bias`` (both classes); Llama also ``layers.{i}.self_attn.o_proj.bias``
                                        (``llama.py`` ``LlamaDecoderLayer``: ``attention_bias or bias``)
``attention_bias``                      Llama: ``layers.{i}.self_attn.o_proj.bias`` (``qkv_proj`` is rebuilt
                                        without bias by ``llama_eagle3.py``'s ``LlamaDecoderLayer``)
``norm_before_fc`` (or in eagle_config)  Llama: ``input_norm.weight [k * hidden_size_in]``
``fc_norm`` / ``use_aux_norm``          ``fc_norm.{j}.weight [hidden_size_in]``, one per aux state
``tie_word_embeddings`` /               ``lm_head.weight`` (or none: tied, or replaced by the target's)
``draft_vocab_size``
``target_hidden_size`` != hidden        ``embed_tokens.weight`` must be the draft's own (``set_embed`` keeps it)
``num_hidden_layers``                   Llama: ``layers.{i}.*`` for each layer (layer 0 reads ``2 x hidden``)
``q_lora_rank`` / ``kv_lora_rank`` ...  MLA: the attention's projections and norms (``q_lora_rank`` required)
======================================  =====================================================================

SGLang's fc-skip rule (both classes' ``forward``: ``if hidden_states.shape[-1] != embeds.shape[-1]``): ``fc`` runs
only when the incoming states are not as wide as the draft's embedding (its hidden size), so a draft whose
``k x target hidden`` equals its hidden size is served without its ``fc`` (:func:`fc_skip_problem`).

Nothing here reads a weight or imports SGLang.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .checkpoint import TensorHeader

__all__ = [
    "EAGLE3_CLASS_FIX",
    "EAGLE3_DRAFT_CLASSES",
    "FUSED_TENSORS",
    "LEGACY_NAMES",
    "DraftBuild",
    "TensorProblem",
    "canonical_name",
    "draft_build",
    "eagle3_class_problem",
    "fc_skip_problem",
    "tensor_problems",
]

EAGLE3_DRAFT_CLASSES = {
    "LlamaForCausalLMEagle3": "srt/models/llama_eagle3.py",
    "Eagle3DeepseekV2ForCausalLM": "srt/models/kimi_k25_eagle3.py",
}
"""SGLang's EAGLE-3 draft model classes (``EntryClass`` of those files) -> source file."""

EAGLE3_CLASS_FIX = (
    'set "architectures": ["LlamaForCausalLMEagle3"] in the draft\'s config.json (the class SpecForge and eagle-io '
    "export)"
)
"""The fix of :func:`eagle3_class_problem`."""


def eagle3_class_problem(built_class: str, has_fc: bool = True) -> str | None:
    """Why an EAGLE-3 draft that SGLang builds as ``built_class`` cannot use the target's aux states, or None.

    The one rule of ``eagle-io check-serving``'s ``draft-architecture`` finding (``built_class`` from the config's
    ``architectures[0]``) and of the serving plugin's startup guard (the class of the live draft model, and
    whether it has an ``fc``): SGLang builds ``architectures[0]`` as given (``ModelConfig`` rewrites no EAGLE-3
    draft name), and only :data:`EAGLE3_DRAFT_CLASSES` have the ``fc`` that projects the aux states."""
    if built_class not in EAGLE3_DRAFT_CLASSES:
        return (
            f"SGLang builds the draft as {built_class!r} (its architectures[0]), not as an EAGLE-3 draft class "
            f"({', '.join(EAGLE3_DRAFT_CLASSES)}), so fc.weight is dropped and the target's aux states are never used"
        )
    if not has_fc:
        return f"SGLang built the draft as {built_class} without an fc: the target's aux states would not be projected"
    return None


LEGACY_NAMES = {"midlayer": "layers.0", "aux_norm_low": "fc_norm.0", "aux_norm_mid": "fc_norm.1",
                "aux_norm_high": "fc_norm.2"}  # fmt: skip
"""``LlamaForCausalLMEagle3.load_weights``: ``legacy_name_map`` (substring replacements, applied first)."""


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


@dataclass(frozen=True)
class DraftBuild:
    """What SGLang builds from one draft config.

    Attributes:
        architecture: ``architectures[0]``; ``family``: ``"llama_eagle3"``, ``"mla_eagle3"`` or None (not an
            SGLang EAGLE-3 draft class: SGLang builds something without ``fc``).
        hidden_size: the draft's own hidden size.
        hidden_size_in: width of one target state as SGLang sizes ``fc`` (``target_hidden_size`` when the key is
            present, else ``hidden_size``: ``LlamaModel.__init__``'s ``hasattr(config, "target_hidden_size")``);
            ``hidden_size_in_source`` says which.
        num_aux / num_aux_source: the aux states ``fc`` is sized for (Llama: ``num_aux_hidden_states`` >
            ``len(eagle_config ids)`` > 3; MLA: ``len(eagle_config ids)`` > ``len(top-level ids)`` > 3,
            ``_get_eagle_aux_layer_count``).
        norm_before_fc: ``eagle_config.norm_before_fc`` or top-level ``norm_before_fc`` (Llama only): one RMSNorm
            ``input_norm`` over the concatenated ``num_aux * hidden_size_in`` input.
        fc_norm: ``fc_norm`` or the legacy ``use_aux_norm``: one RMSNorm per aux state (``fc_norm.{j}``).
        use_aux_hidden_state: ``eagle_config.use_aux_hidden_state`` (default true): false switches the target's
            capture off (``spec_aux_hidden_state.py``, ``_resolve_eagle_aux_hidden_state``).
        tie_word_embeddings: the draft's ``lm_head`` is its embedding.
        lm_head_rows: ``draft_vocab_size`` (or ``vocab_size`` when absent); ``lm_head_from_target``: no
            ``draft_vocab_size`` and not tied, so SGLang replaces the head (and embedding) with the target's
            (``load_lm_head_from_target``; ``EAGLEWorkerV2.init_lm_head``).
        own_embedding: ``target_hidden_size`` is set and differs from ``hidden_size``: ``set_embed`` keeps the
            draft's own ``embed_tokens`` (otherwise the target's replaces it).
        expected: canonical tensor name (:func:`canonical_name`) -> the shape SGLang allocates for it.
        required: canonical names that must be in the checkpoint (SGLang allocates the parameter uninitialised,
            or as ones for a norm, and keeps it when the checkpoint has no tensor for it).
        switched: patterns (``re.fullmatch``) of canonical names SGLang would load only under a config switch that
            is off -> the switch.
        switched_on: patterns of required names that SGLang allocates only because a switch is on -> the switch.
    """

    architecture: str
    family: str | None
    hidden_size: int | None
    hidden_size_in: int | None
    hidden_size_in_source: str
    num_aux: int
    num_aux_source: str
    norm_before_fc: bool
    fc_norm: bool
    use_aux_hidden_state: bool
    tie_word_embeddings: bool
    lm_head_rows: int | None
    lm_head_from_target: bool
    own_embedding: bool
    expected: dict[str, tuple[int, ...]] = field(default_factory=dict)
    required: frozenset[str] = frozenset()
    switched: dict[str, str] = field(default_factory=dict)
    switched_on: dict[str, str] = field(default_factory=dict)

    @property
    def fc_in(self) -> int | None:
        """Input width of the ``fc`` SGLang allocates: ``num_aux * hidden_size_in``."""
        return None if self.hidden_size_in is None else self.num_aux * self.hidden_size_in


def _eagle_ids(config: Mapping[str, Any]) -> list[Any] | None:
    ec = config.get("eagle_config")
    ids = ec.get("eagle_aux_hidden_state_layer_ids") if isinstance(ec, dict) else None
    return ids if isinstance(ids, list) else None


def draft_build(config: Mapping[str, Any]) -> DraftBuild:
    """The :class:`DraftBuild` SGLang makes from ``config`` (a draft ``config.json`` dict)."""
    archs = config.get("architectures") or []
    arch = str(archs[0]) if isinstance(archs, list) and archs else str(archs or "?")
    family = {"LlamaForCausalLMEagle3": "llama_eagle3", "Eagle3DeepseekV2ForCausalLM": "mla_eagle3"}.get(arch)
    h = _int(config.get("hidden_size"))
    ec = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
    ids = _eagle_ids(config)
    if family == "mla_eagle3":
        hin_raw = _int(config.get("target_hidden_size"))
        hin, hin_src = (hin_raw, "target_hidden_size") if hin_raw else (h, "hidden_size (no target_hidden_size)")
        top = config.get("eagle_aux_hidden_state_layer_ids")
        if ids is not None:
            k, k_src = len(ids), "len(eagle_config.eagle_aux_hidden_state_layer_ids)"
        elif isinstance(top, list):
            k, k_src = len(top), "len(eagle_aux_hidden_state_layer_ids) (top level)"
        else:
            k, k_src = 3, "SGLang's default of 3 aux layers"
    else:
        if "target_hidden_size" in config:
            hin, hin_src = _int(config.get("target_hidden_size")), "target_hidden_size"
        else:
            hin, hin_src = h, "hidden_size (the config has no target_hidden_size)"
        n = config.get("num_aux_hidden_states")
        if n is not None and _int(n) is not None:
            k, k_src = int(n), "num_aux_hidden_states"
        elif ids:
            k, k_src = len(ids), "len(eagle_config.eagle_aux_hidden_state_layer_ids)"
        else:
            k, k_src = 3, "SGLang's default of 3 aux layers"
    norm_before_fc = family == "llama_eagle3" and bool(ec.get("norm_before_fc", config.get("norm_before_fc", False)))
    fc_norm = bool(config.get("fc_norm") or config.get("use_aux_norm", False))
    tie = bool(config.get("tie_word_embeddings", False))
    dvs = _int(config.get("draft_vocab_size"))
    vocab = _int(config.get("vocab_size"))
    tths = _int(config.get("target_hidden_size"))
    build = DraftBuild(
        architecture=arch,
        family=family,
        hidden_size=h,
        hidden_size_in=hin,
        hidden_size_in_source=hin_src,
        num_aux=k,
        num_aux_source=k_src,
        norm_before_fc=norm_before_fc,
        fc_norm=fc_norm,
        use_aux_hidden_state=bool(ec.get("use_aux_hidden_state", True)),
        tie_word_embeddings=tie,
        lm_head_rows=dvs if dvs is not None else vocab,
        lm_head_from_target=not tie and dvs is None,
        own_embedding=tths is not None and h is not None and tths != h,
    )
    if family is None or h is None or hin is None:
        return build
    expected: dict[str, tuple[int, ...]] = {"fc.weight": (h, k * hin), "norm.weight": (h,)}
    required = {"fc.weight", "norm.weight"}
    switched = {r"fc\.bias": "bias", r"input_norm\..*": "norm_before_fc", r"fc_norm\..*": "fc_norm (or use_aux_norm)"}
    on: dict[str, str] = {}
    if config.get("bias"):
        expected["fc.bias"] = (h,)
        required.add("fc.bias")
        on[r"fc\.bias"] = "bias: true"
        switched.pop(r"fc\.bias")
    if norm_before_fc:
        expected["input_norm.weight"] = (k * hin,)
        required.add("input_norm.weight")
        on[r"input_norm\..*"] = "norm_before_fc: true"
        switched.pop(r"input_norm\..*")
    if fc_norm:
        for j in range(k):
            expected[f"fc_norm.{j}.weight"] = (hin,)
            required.add(f"fc_norm.{j}.weight")
        on[r"fc_norm\..*"] = "fc_norm (or use_aux_norm): true"
        switched.pop(r"fc_norm\..*")
    if vocab is not None:
        expected["embed_tokens.weight"] = (vocab, h)
        if build.own_embedding:
            required.add("embed_tokens.weight")
            on[r"embed_tokens\.weight"] = f"target_hidden_size {tths} != hidden_size {h} (SGLang keeps the draft's own)"
    if tie:
        switched[r"lm_head\..*"] = "tie_word_embeddings: false (while tied, the draft's lm_head is its embedding)"
    elif build.lm_head_from_target:
        switched[r"lm_head\..*"] = "draft_vocab_size (without it SGLang replaces the draft's lm_head by the target's)"
    elif build.lm_head_rows is not None:
        expected["lm_head.weight"] = (build.lm_head_rows, h)
        required.add("lm_head.weight")
    if family == "llama_eagle3":
        _llama_layers(config, h, expected, required, switched, on)
    else:
        _mla_layer(config, h, expected, required)
    parts = {"expected": expected, "required": frozenset(required), "switched": switched, "switched_on": on}
    return DraftBuild(**{**vars(build), **parts})


def fc_skip_problem(num_aux: int, hidden_size_in: int | None, hidden_size: int | None) -> str | None:
    """The sentence saying why SGLang would serve this draft without its ``fc``, or None when it applies ``fc``.

    SGLang's EAGLE-3 drafts (``srt/models/llama_eagle3.py`` ``LlamaModel.forward`` and ``kimi_k25_eagle3.py``
    ``Eagle3MLAModel.forward``) run ``fc`` only ``if hidden_states.shape[-1] != embeds.shape[-1]``: the incoming
    states, ``num_aux x hidden_size_in`` wide, against the draft's embedding, ``hidden_size`` wide. When they are
    equal (one aux layer of a target as wide as the draft; three of a 1024-wide target under a 3072-wide draft) the
    draft takes the raw concatenated states as its hidden state and its trained ``fc`` is never applied."""
    if not num_aux or hidden_size_in is None or hidden_size is None or num_aux * hidden_size_in != hidden_size:
        return None
    return (
        f"{num_aux} aux state(s) x target hidden {hidden_size_in} = {num_aux * hidden_size_in} is the draft's own "
        f"hidden size {hidden_size}: SGLang runs the draft's fc only when the incoming width differs from its "
        "embedding's (llama_eagle3.py / kimi_k25_eagle3.py forward: `if hidden_states.shape[-1] != "
        "embeds.shape[-1]`), so this draft is served without its fc"
    )


def _llama_layers(
    config: Mapping[str, Any],
    h: int,
    expected: dict[str, tuple[int, ...]],
    required: set[str],
    switched: dict[str, str],
    on: dict[str, str],
) -> None:
    """``LlamaDecoderLayer`` of ``llama_eagle3.py`` over ``llama.py``'s: layer 0's ``qkv_proj`` reads
    ``cat(embeds, hidden)`` (2H) and is rebuilt without bias; ``o_proj`` keeps ``llama.py``'s bias switch
    (``attention_bias = getattr(config, "attention_bias", False) or getattr(config, "bias", False)``); heads and
    ``head_dim`` as ``llama.py``'s ``LlamaAttention`` (``getattr(config, "head_dim", hidden_size // num_heads)``);
    ``intermediate_size`` (``intermediate_size_mlp`` for ``llama4_text``); ``LlamaMLP`` has no bias."""
    nh = _int(config.get("num_attention_heads"))
    if not nh:
        return
    nkv = _int(config.get("num_key_value_heads")) or nh
    hd = _int(config.get("head_dim")) or h // nh
    inter_key = "intermediate_size_mlp" if config.get("model_type") == "llama4_text" else "intermediate_size"
    inter = _int(config.get(inter_key))
    o_bias = bool(config.get("attention_bias") or config.get("bias"))
    o_bias_name = r"layers\.\d+\.self_attn\.o_proj\.bias"
    if o_bias:
        on[o_bias_name] = (
            "attention_bias: true"
            if config.get("attention_bias")
            else "bias: true (llama.py reads it as attention_bias too)"
        )
    else:
        switched[o_bias_name] = "attention_bias (or bias)"
    for i in range(_int(config.get("num_hidden_layers")) or 1):
        d_in = 2 * h if i == 0 else h
        p = f"layers.{i}."
        attn = {
            "self_attn.q_proj.weight": (nh * hd, d_in),
            "self_attn.k_proj.weight": (nkv * hd, d_in),
            "self_attn.v_proj.weight": (nkv * hd, d_in),
            "self_attn.o_proj.weight": (h, nh * hd),
            "input_layernorm.weight": (h,),
            "hidden_norm.weight": (h,),
            "post_attention_layernorm.weight": (h,),
        }
        if o_bias:
            attn["self_attn.o_proj.bias"] = (h,)
        if inter:
            attn |= {
                "mlp.gate_proj.weight": (inter, h),
                "mlp.up_proj.weight": (inter, h),
                "mlp.down_proj.weight": (h, inter),
            }
        for name, shape in attn.items():
            expected[p + name] = shape
            required.add(p + name)
        expected[p + "self_attn.qkv_proj.weight"] = ((nh + 2 * nkv) * hd, d_in)  # fused form, also accepted
        if inter:
            expected[p + "mlp.gate_up_proj.weight"] = (2 * inter, h)


def _mla_layer(config: Mapping[str, Any], h: int, expected: dict[str, tuple[int, ...]], required: set[str]) -> None:
    """``Eagle3MLADecoderLayer`` (one layer, checkpoint names ``layers.0.`` or ``midlayer.``): SGLang's
    ``DeepseekV2AttentionMLA`` with ``q_lora_rank`` (required: the layer refuses to build without it) and its
    ``fused_qkv_a_proj_with_mqa`` rebuilt for the ``2 x hidden`` input, which ``load_weights`` fills from the
    checkpoint's ``q_a_proj`` and ``kv_a_proj_with_mqa`` (concatenated); ``q_a_layernorm``, ``q_b_proj``,
    ``kv_a_layernorm``, ``kv_b_proj``, ``o_proj`` (no biases); ``DeepseekV2MLP`` (no bias; ``gate_proj`` /
    ``up_proj`` or the fused ``gate_up_proj``); the three RMSNorms."""
    nh, q_lora, kv_lora = (_int(config.get(key)) for key in ("num_attention_heads", "q_lora_rank", "kv_lora_rank"))
    nope, rope, v = (_int(config.get(key)) for key in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    inter = _int(config.get("intermediate_size"))
    p = "layers.0."
    shapes: dict[str, tuple[int, ...]] = {
        "input_layernorm.weight": (h,),
        "hidden_norm.weight": (h,),
        "post_attention_layernorm.weight": (h,),
    }
    if None not in (nh, q_lora, kv_lora, nope, rope, v):
        assert nh is not None and q_lora is not None and kv_lora is not None  # (for the type checker)
        assert nope is not None and rope is not None and v is not None
        shapes |= {
            "self_attn.q_a_proj.weight": (q_lora, 2 * h),
            "self_attn.kv_a_proj_with_mqa.weight": (kv_lora + rope, 2 * h),
            "self_attn.q_a_layernorm.weight": (q_lora,),
            "self_attn.q_b_proj.weight": (nh * (nope + rope), q_lora),
            "self_attn.kv_a_layernorm.weight": (kv_lora,),
            "self_attn.kv_b_proj.weight": (nh * (nope + v), kv_lora),
            "self_attn.o_proj.weight": (h, nh * v),
        }
    if inter:
        shapes |= {"mlp.gate_proj.weight": (inter, h), "mlp.up_proj.weight": (inter, h),
                   "mlp.down_proj.weight": (h, inter)}  # fmt: skip
        expected[p + "mlp.gate_up_proj.weight"] = (2 * inter, h)  # fused form, also accepted
    for name, shape in shapes.items():
        expected[p + name] = shape
        required.add(p + name)


FUSED_TENSORS = {"self_attn.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                        "self_attn.v_proj.weight"),
          "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight")}  # fmt: skip
"""The fused tensors SGLang's Llama layers load (``stacked_params_mapping``) and the parts each stands for, in order."""


def canonical_name(name: str, family: str | None = "llama_eagle3") -> str:
    """A checkpoint tensor name as SGLang's loader resolves it, without the ``model.`` prefix.

    ``llama_eagle3`` (``LlamaForCausalLMEagle3.load_weights``): :data:`LEGACY_NAMES` replaced (``midlayer.`` ->
    ``layers.0.``), then a leading ``model.`` dropped (it tries ``name`` and ``"model." + name``), except before
    ``lm_head.``: the head is the one top-level parameter (``lm_head.weight``), so ``model.lm_head.weight`` is
    neither it nor ``"model." +`` a parameter, and is never loaded (it stays as it is here).
    ``mla_eagle3`` (``Eagle3DeepseekV2ForCausalLM.load_weights``): ``layers.0.`` and ``midlayer.`` name the one
    layer, no legacy names, and the loader prefixes ``model.`` itself, so a checkpoint name that starts with
    ``model.`` is never loaded: it stays as it is here (SGLang logs "skipping unexpected weight")."""
    if family == "mla_eagle3":
        return "layers.0." + name[len("midlayer.") :] if name.startswith("midlayer.") else name
    for legacy, new in LEGACY_NAMES.items():
        if legacy in name:
            name = name.replace(legacy, new)
    return name if name.startswith("model.lm_head.") else name.removeprefix("model.")


@dataclass(frozen=True)
class TensorProblem:
    """One checkpoint tensor that does not fit the draft SGLang builds.

    ``kind``: ``"shape"`` (loading fails: SGLang's weight loader asserts equal shapes), ``"missing"`` (the
    parameter keeps its uninitialised / ones value; ``detail`` names a checkpoint tensor of that parameter under a
    name SGLang does not load), ``"switched-off"`` (SGLang allocates no parameter for it, so
    the trained values are silently dropped). ``name`` is the checkpoint's name (the canonical one when missing).
    """

    kind: str
    name: str
    canonical: str
    expected: tuple[int, ...] | None
    found: tuple[int, ...] | None
    detail: str


def tensor_problems(build: DraftBuild, tensors: Mapping[str, TensorHeader]) -> list[TensorProblem]:
    """Checks every checkpoint tensor's shape against ``build.expected``, and that every ``build.required``
    tensor is present (a fused ``qkv_proj`` / ``gate_up_proj`` stands for its parts). ``d2t`` / ``t2d`` are not
    parameters (see :func:`eagle_io.interop.vocab.mapping_problems`); tensors SGLang does not know are ignored, as
    its loader ignores them. Empty when ``build.family`` is None (not an EAGLE-3 draft class)."""
    if build.family is None:
        return []
    out: list[TensorProblem] = []
    present: set[str] = set()
    for name, t in tensors.items():
        if name in ("d2t", "t2d") or name.endswith((".d2t", ".t2d")):
            continue
        c = canonical_name(name, build.family)
        present.add(c)
        for fused, parts in FUSED_TENSORS.items():
            if c.endswith(fused):
                present.update(c[: -len(fused)] + part for part in parts)
        if c in build.expected:
            if tuple(t.shape) != build.expected[c]:
                out.append(TensorProblem("shape", name, c, build.expected[c], tuple(t.shape), ""))
            continue
        for pattern, switch in build.switched.items():
            if re.fullmatch(pattern, c):
                out.append(TensorProblem("switched-off", name, c, None, tuple(t.shape), switch))
    for c in sorted(build.required - present):
        unloaded = next(
            (n for n in (f"model.{c}", f"model.{c}".replace("layers.0.", "midlayer.")) if n in present), None
        )
        switch = next((sw for pattern, sw in build.switched_on.items() if re.fullmatch(pattern, c)), None)
        if unloaded:
            why = "the head is top-level: lm_head.*" if c.startswith("lm_head.") else "it adds the model. prefix itself"
            detail = f"the checkpoint names it {unloaded}, which {build.architecture}.load_weights never loads ({why})"
        else:
            detail = f"the config's {switch} asks for it" if switch else ""
        out.append(TensorProblem("missing", c, c, build.expected.get(c), None, detail))
    return out
