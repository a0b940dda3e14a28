"""Export a trained draft as an SGLang-loadable EAGLE-3 checkpoint: ``model.safetensors`` + ``config.json``.

What SGLang reads (``sglang/srt/models/llama_eagle3.py`` and
``sglang/srt/model_executor/model_runner_components/spec_aux_hidden_state.py``):

* ``architectures: ["LlamaForCausalLMEagle3"]``; ``hidden_size``, ``intermediate_size``, heads, ``rms_norm_eps``,
  ``rope_theta``, ``vocab_size`` (the target's), ``draft_vocab_size``, ``target_hidden_size`` (``fc`` input is
  ``3 * target_hidden_size``), ``num_hidden_layers: 1``, ``tie_word_embeddings: false`` (true would make the draft's
  ``lm_head`` its embedding).
* ``eagle_config.eagle_aux_hidden_state_layer_ids``: ids handed to the target's
  ``set_eagle3_layers_to_capture``, whose rule depends on the target's architecture
  (:data:`eagle_io.sglang.setters.SETTER_RULES`): the ids written are those that *that* setter turns into the
  trained eagle-io ids (:func:`eagle_io.sglang.setters.explicit_ids_for`). Llama's adds +1, so SmolLM2's
  ``[2, 15, 27]`` is written ``[1, 14, 26]``; DeepSeek-V3 / Kimi-K2.5 / GLM-4-MoE-Lite add +1 only when the first
  id is 1, so ``[3, 5, 7]`` is written ``[3, 5, 7]``; gpt-oss keeps ids reaching ``N``.
  ``eagle_config.use_aux_hidden_state: true``.
* ``eagle_io``: eagle-io's record of the training: ``aux_layer_ids`` (eagle-io ids), ``target`` (``model_id``,
  ``architecture``, ``num_layers``, ``hidden_size`` of the target the data came from), provenance. ``eagle-io
  check-serving`` compares it with the target it is served on.
* Weights: ``fc.weight``, ``midlayer.self_attn.{q,k,v,o}_proj.weight`` (q/k/v stacked into ``qkv_proj`` by the
  loader), ``midlayer.mlp.{gate,up,down}_proj.weight``, ``midlayer.{input_layernorm,hidden_norm,
  post_attention_layernorm}.weight``, ``norm.weight``, ``lm_head.weight`` (``[draft_vocab, H]``), ``d2t`` (int64,
  read as ``hot_token_id = d2t + arange``), ``t2d`` (bool; skipped by SGLang, used by SpecForge),
  ``embed_tokens.weight`` (the target's; SGLang's EAGLE-3 worker replaces it with the target's own).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError, InvalidArgumentError
from ..sglang.setters import explicit_ids_for, setter_rule
from ..store import layout
from .model import Eagle3Draft, Eagle3DraftConfig

__all__ = ["draft_config_json", "eagle_config_ids", "load_draft", "save_draft", "served_config"]


def eagle_config_ids(aux_layer_ids: Sequence[int], target: Mapping[str, Any] | None = None) -> list[int]:
    """The ``eagle_config.eagle_aux_hidden_state_layer_ids`` that SGLang's setter for ``target["architecture"]``
    (default ``LlamaForCausalLM``) turns into ``aux_layer_ids`` (eagle-io ids) on a ``target["num_layers"]``-layer
    target (:func:`eagle_io.sglang.setters.explicit_ids_for`).

    Raises:
        InvalidArgumentError: the ids are invalid for the target, or its setter cannot express them.
    """
    target = dict(target or {})
    arch = str(target.get("architecture") or "LlamaForCausalLM")
    n = target.get("num_layers")
    n = int(n) if isinstance(n, int) and not isinstance(n, bool) else None
    explicit = explicit_ids_for(arch, n, aux_layer_ids)
    if explicit is None:
        raise InvalidArgumentError(
            f"SGLang's {arch} setter cannot capture eagle-io ids {list(aux_layer_ids)} ({setter_rule(arch)}): a draft "
            "trained on them cannot be served by SGLang on this target"
        )
    return explicit


def draft_config_json(
    cfg: Eagle3DraftConfig,
    aux_layer_ids: Sequence[int],
    *,
    dtype: str = "bfloat16",
    bos_token_id: Any = None,
    eos_token_id: Any = None,
    provenance: Mapping[str, Any] | None = None,
    target: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``config.json`` dict.

    Args:
        aux_layer_ids: eagle-io ids (input of decoder layer i) the draft was trained on.
        target: the target the training data came from: ``architecture`` (default ``LlamaForCausalLM``: its setter
            rule is the one most SGLang models use), ``num_layers``, ``hidden_size``, ``model_id`` (a dataset's
            metadata has them). The ``eagle_config`` ids are written for that architecture's SGLang setter.

    Raises:
        InvalidArgumentError: ``aux_layer_ids`` are invalid for the target
            (:func:`eagle_io.store.eagle3.validate_aux_layer_ids`), or that target's SGLang setter cannot capture
            them (e.g. id ``N`` on a Llama target).
    """
    target = dict(target or {})
    arch = str(target.get("architecture") or "LlamaForCausalLM")
    explicit = eagle_config_ids(aux_layer_ids, target)
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_size,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": cfg.max_position_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "torch_dtype": dtype,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": explicit,
            "use_aux_hidden_state": True,
        },
        "eagle_io": {
            "aux_layer_ids": [int(i) for i in aux_layer_ids],
            "aux_layer_convention": "eagle-io ids (input of decoder layer i); eagle_config holds the explicit ids "
            f"that {setter_rule(arch)} turns into them",
            "target": {k: target[k] for k in ("model_id", "architecture", "num_layers", "hidden_size") if k in target},
            **dict(provenance or {}),
        },
    }


def save_draft(
    model: Eagle3Draft,
    out_dir: str | os.PathLike[str],
    aux_layer_ids: Sequence[int],
    *,
    dtype: torch.dtype = torch.bfloat16,
    bos_token_id: Any = None,
    eos_token_id: Any = None,
    provenance: Mapping[str, Any] | None = None,
    target: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """Writes ``out_dir/model.safetensors`` (float weights in ``dtype``, ``d2t`` int64, ``t2d`` bool) and
    ``out_dir/config.json`` (:func:`draft_config_json`, with ``target``), each atomically and with the mode a plain
    ``open`` gives (:func:`eagle_io.store.layout.atomic_file`). Returns both paths.

    Raises:
        InvalidArgumentError: (a ``ValueError``) ``len(aux_layer_ids)`` differs from the draft's ``num_aux_layers``,
            the ids do not fit the target (:func:`draft_config_json`), or d2t/t2d break the vocabulary invariants
            (:func:`eagle_io.interop.vocab.validate_mapping`).
        NonFiniteTrainingError: a weight holds NaN/Inf (also after the cast to ``dtype``); nothing is written.
        StorageError: a file cannot be written (naming it).
    """
    from safetensors.torch import save

    from ..errors import NonFiniteTrainingError
    from ..interop.vocab import validate_mapping

    cfg = model.config
    if len(aux_layer_ids) != cfg.num_aux_layers:
        raise InvalidArgumentError(
            f"{len(aux_layer_ids)} aux layer ids for a draft trained on {cfg.num_aux_layers} aux states"
        )
    validate_mapping(model.d2t, model.t2d, cfg.draft_vocab_size, cfg.vocab_size)
    config = draft_config_json(
        cfg,
        aux_layer_ids,
        dtype=str(dtype).removeprefix("torch."),
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        provenance=provenance,
        target=target,
    )  # before writing anything: ids the target's setter cannot express are refused here
    tensors = {}
    for name, t in model.state_dict().items():
        t = t.detach().cpu()
        tensors[name] = (t.to(dtype) if t.is_floating_point() else t).contiguous()
        if t.is_floating_point() and not bool(torch.isfinite(tensors[name]).all()):
            bad = int((~torch.isfinite(tensors[name])).sum())
            raise NonFiniteTrainingError(
                f"draft weight {name} holds {bad} NaN/Inf value(s) (in {str(dtype).removeprefix('torch.')}): "
                "not exported"
            )
    os.makedirs(out_dir, exist_ok=True)
    weights = os.path.join(os.fspath(out_dir), "model.safetensors")
    layout.write_atomic(weights, save(tensors, metadata={"format": "pt"}))  # mode 0o666 & ~umask, as the others
    cfg_path = os.path.join(os.fspath(out_dir), "config.json")
    layout.write_atomic(cfg_path, (json.dumps(config, indent=2)).encode())
    return {"weights": weights, "config": cfg_path}


def served_config(c: Mapping[str, Any], where: str | os.PathLike[str] = "config.json") -> Eagle3DraftConfig:
    """The shapes SGLang builds from a draft ``config.json`` dict ``c``: ``AutoConfig`` reads it as a
    ``LlamaConfig``, whose defaults fill what the file leaves out (``head_dim`` ``hidden_size //
    num_attention_heads``, ``num_key_value_heads`` ``num_attention_heads``, ``intermediate_size`` 11008,
    ``rms_norm_eps`` 1e-6, ``rope_theta`` 10000, ``max_position_embeddings`` 2048), and ``llama_eagle3.py`` sizes
    ``fc`` and ``lm_head`` as :func:`eagle_io.sglang.draft_build.draft_build` says (``target_hidden_size``, else
    ``hidden_size``; ``num_aux_hidden_states``, else the ``eagle_config`` ids, else 3; ``draft_vocab_size``, else
    ``vocab_size``). SpecForge's draft configs name neither ``head_dim``, ``target_hidden_size`` nor
    ``eagle_config``.

    Raises:
        CheckpointError: ``vocab_size``, ``hidden_size`` or ``num_attention_heads`` missing or not an integer, or
            another shape key that is not one (naming ``where`` and the key).
    """
    from ..sglang.draft_build import draft_build

    def num(key: str, default: Any = None, kind: type = int) -> Any:
        value = c.get(key)
        value = default if value is None else value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
            raise CheckpointError(f"{where}: {key} is {c.get(key)!r}: the draft config needs a number there", where)
        return kind(value)

    hidden, heads = num("hidden_size"), num("num_attention_heads")
    build = draft_build(c)
    rope = c.get("rope_theta") or (c.get("rope_parameters") or {}).get("rope_theta")
    return Eagle3DraftConfig(
        vocab_size=num("vocab_size"),
        draft_vocab_size=num("draft_vocab_size", build.lm_head_rows),
        hidden_size=hidden,
        target_hidden_size=num("target_hidden_size", build.hidden_size_in),
        num_aux_layers=build.num_aux,
        num_attention_heads=heads,
        num_key_value_heads=num("num_key_value_heads", heads),
        head_dim=num("head_dim", hidden // heads),
        intermediate_size=num("intermediate_size", 11008),
        rms_norm_eps=num("rms_norm_eps", 1e-6, float),
        rope_theta=float(rope or 10000.0),
        max_position_embeddings=num("max_position_embeddings", 2048),
    )


def _own_names(model: Eagle3Draft, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` under this draft's names, resolved as SGLang's ``LlamaForCausalLMEagle3.load_weights`` resolves a
    checkpoint's (:func:`eagle_io.sglang.draft_build.canonical_name`: ``midlayer.`` -> ``layers.0.``, a ``model.``
    prefix dropped; here ``layers.0.`` is ``midlayer.`` again); a fused ``qkv_proj`` / ``gate_up_proj`` is split into
    its parts; tensors the draft has no parameter or buffer for are skipped, as SGLang's loader skips them."""
    from ..sglang.draft_build import FUSED_TENSORS, canonical_name

    cfg = model.config
    own = set(model.state_dict())
    d, kv = cfg.head_size, cfg.num_key_value_heads
    rows = {  # the parts' rows, in FUSED_TENSORS order
        "self_attn.qkv_proj.weight": [cfg.num_attention_heads * d, kv * d, kv * d],
        "mlp.gate_up_proj.weight": [cfg.intermediate_size] * 2,
    }
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        c = name if name in ("d2t", "t2d") else canonical_name(name)
        c = "midlayer." + c[len("layers.0.") :] if c.startswith("layers.0.") else c
        for suffix, parts in FUSED_TENSORS.items():
            if c.endswith(suffix) and t.shape[0] == sum(rows[suffix]):
                stem = c[: -len(suffix)]
                out.update({stem + part: w for part, w in zip(parts, t.split(rows[suffix]), strict=True)})
                break
        else:
            if c in own:
                out[c] = t
    return out


def load_draft(out_dir: str | os.PathLike[str]) -> Eagle3Draft:
    """Reads back a :func:`save_draft` directory (or another SGLang-format EAGLE-3 draft of this layout) into a
    float32 :class:`Eagle3Draft` (for tests and evaluation).

    Tensors come from every ``*.safetensors`` file of the directory, as SGLang's loader reads them (``train-draft``'s
    ``vocab_map.safetensors`` holds ``d2t``/``t2d`` too), under any name that loader resolves (``layers.0.`` or
    ``midlayer.``, a ``model.`` prefix, fused ``qkv_proj`` / ``gate_up_proj``); tensors it skips are skipped. A draft
    whose vocabulary is the target's may lack ``d2t``/``t2d``: SGLang then maps draft index ``i`` to token ``i``
    (``hot_token_id`` None), and so does the identity map installed here. SGLang never reads ``t2d``: one that is absent
    or not ``[vocab_size]`` is rebuilt from ``d2t`` (True at ``d2t + arange``). A checkpoint without
    ``embed_tokens.weight`` (SpecForge drops the frozen embedding) keeps an uninitialised one: SGLang gives the draft
    the target's (:func:`eagle_io.spec.load_served_draft` does).
    Shapes the config leaves out take SGLang's defaults (:func:`served_config`).

    Raises:
        CheckpointError: ``config.json`` unreadable or not JSON, a shape key the draft cannot be built without
            (:func:`served_config`), a ``*.safetensors`` file that does not load (truncated data, a damaged header:
            names the file), or a weight holding NaN/Inf (names each tensor: SGLang would serve it, drafting garbage).
    """
    from safetensors.torch import load_file

    config_path = os.path.join(os.fspath(out_dir), "config.json")
    try:
        with open(config_path, encoding="utf-8") as f:
            c = json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointError(
            f"{config_path}: the draft's config does not read ({type(e).__name__}: {e})", config_path
        ) from e
    model = Eagle3Draft(served_config(c, config_path))
    cfg = model.config
    state: dict[str, torch.Tensor] = {}
    for path in sorted(Path(out_dir).glob("*.safetensors"), key=lambda p: p.name == "model.safetensors"):
        try:  # a header intact over truncated data passed the header checks and failed here, a traceback
            state.update(load_file(path))  # SGLang loads every *.safetensors of the directory; model.safetensors wins
        except Exception as e:  # safetensors raises SafetensorError, OSError, ...
            raise CheckpointError(
                f"{path}: the draft's weights do not load ({type(e).__name__}: {e}); the file is damaged or "
                "truncated: export the draft again",
                path,
            ) from e
    nonfinite = [
        f"{name} ({int((~torch.isfinite(t)).sum()):,} of {t.numel():,} values)"
        for name, t in state.items()
        if t.is_floating_point() and not bool(torch.isfinite(t).all())
    ]
    if nonfinite:
        raise CheckpointError(
            f"{out_dir}: the draft's weights hold NaN/Inf: {', '.join(nonfinite)}; it would draft garbage (SGLang "
            "serves it without a word): train it again (a lower --lr) or use another checkpoint",
            os.fspath(out_dir),
        )
    state = _own_names(model, state)
    if "d2t" not in state and cfg.draft_vocab_size == cfg.vocab_size:
        state["d2t"] = torch.zeros(cfg.draft_vocab_size, dtype=torch.int64)
        state["t2d"] = torch.ones(cfg.vocab_size, dtype=torch.bool)
    t2d = state.get("t2d")
    if "d2t" in state and (t2d is None or tuple(t2d.shape) != (cfg.vocab_size,)):  # SGLang never reads t2d
        ids = state["d2t"].to(torch.int64) + torch.arange(state["d2t"].shape[0])
        state["t2d"] = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        state["t2d"][ids[(ids >= 0) & (ids < cfg.vocab_size)]] = True
    if "embed_tokens.weight" not in state:  # SpecForge leaves the frozen embedding out; SGLang uses the target's
        state["embed_tokens.weight"] = model.embed_tokens.weight.detach().clone()
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    return model
