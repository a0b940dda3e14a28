"""The draft-checkpoint part of the serving preflight: the class SGLang builds, the config switches it reads on
the EAGLE-3 path, every tensor shape (one checker: :func:`eagle_io.sglang.draft_build.tensor_problems`), the
vocab map's values (one checker: :func:`eagle_io.interop.vocab.mapping_problems`), positions and RoPE."""

from __future__ import annotations

from typing import Any

from ..errors import CheckpointError
from ..sglang.checkpoint import CheckpointInfo, DraftInfo, read_tensor_values
from ..sglang.compat import context_length
from ..sglang.draft_build import EAGLE3_CLASS_FIX, DraftBuild, eagle3_class_problem, tensor_problems
from .findings import ERROR, WARNING, Findings

__all__ = ["check_draft_build", "check_positions", "check_tensors", "check_vocab"]


def check_draft_build(out: Findings, draft: DraftInfo, build: DraftBuild, h_t: int | None) -> None:
    """The draft class and the config switches SGLang reads to build it (EAGLE3 launches only)."""
    problem = eagle3_class_problem(build.architecture)
    if problem is not None:
        out.add(ERROR, "draft-architecture", problem, EAGLE3_CLASS_FIX)
    if not build.use_aux_hidden_state:
        out.add(
            ERROR,
            "aux-capture-disabled",
            "the draft config has eagle_config.use_aux_hidden_state: false: SGLang then captures no aux states "
            "(spec_aux_hidden_state.py) and the draft receives the target's final states only",
            "remove use_aux_hidden_state from eagle_config (or set it to true)",
        )
    if "target_hidden_size" in draft.config and draft.target_hidden_size is None:
        out.add(
            ERROR,
            "target-hidden-size",
            f"the draft config has target_hidden_size = {draft.config['target_hidden_size']!r}: SGLang sizes fc with "
            "it and fails to build the draft",
            f'set "target_hidden_size": {h_t}' if h_t else "set target_hidden_size to the target's hidden size",
        )
    elif draft.target_hidden_size is not None and h_t is not None and draft.target_hidden_size != h_t:
        out.add(
            ERROR,
            "target-hidden-size",
            f"draft config target_hidden_size = {draft.target_hidden_size} but the target's hidden size is {h_t}",
            "serve the draft with the target it was trained for (or retrain it on this target)",
        )
    elif draft.target_hidden_size is None and h_t is not None and build.hidden_size not in (None, h_t):
        out.add(
            ERROR,
            "target-hidden-size",
            f"the draft config has no target_hidden_size and its hidden_size is {build.hidden_size}, but the target's "
            f"hidden size is {h_t}: SGLang takes the target's states as {build.hidden_size} wide (fc input "
            f"{build.num_aux} x {build.hidden_size}) and gives the draft the target's {h_t}-wide embedding",
            f'add "target_hidden_size": {h_t} to the draft\'s config.json',
        )
    act = draft.config.get("hidden_act", "silu")
    if build.family == "llama_eagle3" and act != "silu":
        out.add(
            ERROR,
            "draft-activation",
            f"the draft config has hidden_act = {act!r}: SGLang's LlamaMLP (srt/models/llama.py) supports only silu "
            "and refuses to build the draft",
            'set "hidden_act": "silu" if the draft was trained with it; SGLang cannot serve another activation here',
        )
    if build.family == "mla_eagle3" and draft.config.get("q_lora_rank") is None:
        out.add(
            ERROR,
            "draft-mla-q-lora-rank",
            f"{build.architecture} has no q_lora_rank: SGLang's Eagle3MLADecoderLayer refuses to build without it "
            "(kimi_k25_eagle3.py: 'Eagle3 MLA layer requires q_lora_rank in the draft config')",
            "set q_lora_rank in the draft's config.json to the rank its q_a_proj was trained with",
        )
    n_layers = draft.config.get("num_hidden_layers")
    if build.family == "mla_eagle3" and n_layers not in (None, 1):
        out.add(
            ERROR,
            "draft-num-layers",
            f"{build.architecture} has num_hidden_layers = {n_layers}: SGLang's Eagle3MLAModel refuses anything but 1",
            'set "num_hidden_layers": 1',
        )


def _dims(shape: tuple[int, ...] | None) -> str:
    return "absent" if shape is None else "[" + ", ".join(map(str, shape)) + "]"


def check_tensors(out: Findings, draft: DraftInfo, build: DraftBuild) -> None:
    """Every tensor of the draft's safetensors headers against the draft SGLang builds from its config.

    ``fc.weight`` input width and ``lm_head.weight`` rows have their own findings (``fc-width``,
    ``lm-head-size``); any other difference of those two is reported here. Nothing is checked when the draft has
    no safetensors file (``.bin`` weights are not read: ``fc-unknown`` says so)."""
    if not draft.weight_files:
        return
    for p in tensor_problems(build, draft.tensors):
        if p.kind == "shape" and p.expected and p.found and len(p.expected) == len(p.found) == 2:
            if p.canonical == "fc.weight" and p.found[1] != p.expected[1]:
                continue
            if p.canonical == "lm_head.weight" and p.found[0] != p.expected[0]:
                continue
        if p.kind == "shape":
            out.add(
                ERROR,
                "draft-tensor-shape",
                f"{p.name} is {_dims(p.found)} in the checkpoint but SGLang's {build.architecture} allocates "
                f"{_dims(p.expected)} for it from the config: loading fails",
                "fix the draft config (hidden_size, heads, head_dim, intermediate_size, target_hidden_size, "
                "num_aux_hidden_states, draft_vocab_size) to match the weights it was trained with",
            )
        elif p.kind == "missing":
            why = f" ({p.detail})" if p.detail else ""
            out.add(
                ERROR,
                "draft-tensor-missing",
                f"{p.name} {_dims(p.expected)} is not in the draft's safetensors{why}: SGLang's "
                f"{build.architecture} allocates that parameter from the config, keeps it uninitialised (or at ones "
                "for a norm) and serves it",
                f"store {p.name} under that name"
                if "never loads" in p.detail
                else "export the draft with every trained tensor (or fix the config switch that asks for it)",
            )
        else:
            out.add(
                ERROR,
                "draft-tensor-ignored",
                f"{p.name} {_dims(p.found)} is in the checkpoint but SGLang's {build.architecture} builds no parameter "
                f"for it with this config ({p.detail} is off): its trained values are silently dropped",
                f"set {p.detail} in the draft config if the draft was trained with it",
            )


def check_vocab(out: Findings, draft: DraftInfo, target: CheckpointInfo) -> None:
    """``d2t`` / ``t2d`` / ``lm_head`` sizes and the map's values (``d2t + arange`` are SGLang's hot token ids)."""
    from ..interop.vocab import mapping_problems

    dvs = draft.draft_vocab_size if draft.draft_vocab_size is not None else draft.vocab_size
    dvs_src = "draft_vocab_size" if draft.draft_vocab_size is not None else "vocab_size (no draft_vocab_size)"
    if draft.d2t is not None and dvs is not None and draft.d2t.shape[:1] != (dvs,):
        out.add(
            ERROR,
            "d2t-size",
            f"d2t has shape {list(draft.d2t.shape)} but the draft config's {dvs_src} is {dvs}",
            f'set "draft_vocab_size": {draft.d2t.shape[0]} in the draft config.json if d2t is right, else '
            "regenerate d2t/t2d for this draft's vocab size",
        )
    if draft.lm_head is not None and dvs is not None and draft.lm_head.shape[:1] != (dvs,):
        out.add(
            ERROR,
            "lm-head-size",
            f"lm_head.weight has {draft.lm_head.shape[0]} rows but the draft config's {dvs_src} is {dvs}",
            f'set "draft_vocab_size": {draft.lm_head.shape[0]} in the draft config.json',
        )
    v = target.vocab_size
    if draft.d2t is None and draft.weight_files and dvs is not None and v is not None and dvs < v:
        out.add(
            ERROR,
            "d2t-missing",
            f"draft vocab {dvs} < target vocab {v} but the checkpoint has no d2t tensor: draft token indices would "
            "be read as target token ids",
            "add the d2t tensor (draft index -> target id offsets) the draft was trained with to its safetensors",
        )
    t2d_fits = draft.t2d is not None and (v is None or draft.t2d.shape[:1] == (v,))
    if draft.t2d is not None and not t2d_fits:
        out.add(
            WARNING,
            "t2d-size",
            f"t2d has shape {list(draft.t2d.shape)} but the target vocab is {v}",
            "regenerate the vocab map for this target's tokenizer",
        )
    if draft.d2t is None:
        return
    try:
        d2t = read_tensor_values(draft.path, draft.d2t)
        t2d = read_tensor_values(draft.path, draft.t2d) if t2d_fits and draft.t2d is not None else None
    except CheckpointError as e:
        out.add(WARNING, "d2t-unreadable", f"cannot check the vocab map's values: {e}", "check d2t/t2d by hand")
        return
    problems = mapping_problems(d2t, t2d, None, v)
    if problems:
        out.add(
            ERROR,
            "d2t-values",
            "the draft's vocab map is wrong: " + "; ".join(problems) + " (SGLang maps draft token i to target id "
            "d2t[i] + i and samples that token)",
            "regenerate d2t/t2d with the target's tokenizer (`eagle-io vocab-map`, or SpecForge's "
            "generate_vocab_mapping_file) and export them with the draft",
        )


def _rope(cfg: dict[str, Any]) -> tuple[Any, Any]:
    rp = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    theta = cfg.get("rope_theta", rp.get("rope_theta"))
    scaling = cfg.get("rope_scaling")
    if scaling is None and rp.get("rope_type") not in (None, "default"):
        scaling = {k: v for k, v in rp.items() if k != "rope_theta"}
    return theta, scaling or None


def check_positions(out: Findings, draft: DraftInfo, target: CheckpointInfo, served_context: int | None) -> None:
    """The context SGLang gives the draft (the target's: ``--context-length`` or the target's derived one) against
    the draft's derived context length (:func:`eagle_io.sglang.compat.context_length`), and RoPE."""
    served = served_context or context_length(target.text_config)
    own = context_length(draft.text_config)
    if served > own:
        dm = draft.max_position_embeddings
        out.add(
            ERROR,
            "draft-max-positions",
            f"SGLang gives the draft the target's context length {served}, but the draft's own is {own} "
            f"(max_position_embeddings {dm}, rope_scaling {draft.text_config.get('rope_scaling')}): SGLang refuses to "
            "start (ModelConfig._derive_context_length) unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1, and then "
            f"the draft runs past position {own}, where it was never trained, and acceptance drops on long prompts",
            f"launch with --context-length {own}, or use a draft trained (or rope-scaled) for {served} positions",
        )
    d_theta, d_scaling = _rope(draft.text_config)
    t_theta, t_scaling = _rope(target.text_config)
    if d_theta is not None and t_theta is not None and float(d_theta) != float(t_theta):
        out.add(
            WARNING,
            "draft-rope",
            f"draft rope_theta {d_theta} != target rope_theta {t_theta}: the draft reads the target's positions with "
            "another frequency base than the target's own (fine only if it was trained with exactly this value)",
            f"set the draft's rope_theta to the value it was trained with (usually the target's, {t_theta})",
        )
    if (d_scaling or t_scaling) and d_scaling != t_scaling:
        out.add(
            WARNING,
            "draft-rope",
            f"draft rope_scaling {d_scaling} != target rope_scaling {t_scaling}: past the unscaled range the draft "
            "encodes positions differently from the target",
            "set the draft's rope_scaling to the one it was trained with (usually the target's)",
        )
