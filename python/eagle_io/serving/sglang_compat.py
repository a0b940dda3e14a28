"""Every SGLang-version-specific name and rule eagle-io relies on, in one module.

Supported SGLang: :data:`SUPPORTED_SGLANG` (``>=0.5.14,<0.6``) for the serving guard. Tested against
:data:`TESTED_SGLANG` (0.5.23: the tests in ``tests/test_serving_plugin.py`` run against it); the 0.5.14, 0.5.18
and 0.5.21 wheels were read for every hook target and signature used here (``Scheduler.init_all_cuda_graphs``,
``EagleDraftWorker._draft_extend_for_prefill(self, batch, target_hidden_states, ...)`` /
``_draft_extend_for_decode(self, batch, batch_result)``, ``EAGLEWorkerV2.on_verify_complete_cpu``,
``EAGLEWorkerV2._draft_worker``, ``EagleDraftWorker.draft_runner``, ``plugins/hook_registry.py``): identical; 0.5.14
keeps the spec-aux flags on ``ModelRunner`` itself (``eagle_use_aux_hidden_state``), read as a fallback. The SGLang
capture (:data:`CAPTURE_MIN_SGLANG`) needs 0.5.23: its capture-only mode and ``last_hidden_states`` are new there.
Outside the range the plugin logs a warning and still runs its lookups, each of which fails loudly
(:class:`SGLangCompatError`) instead of silently skipping a check.

Nothing here imports SGLang at module import time: the pure rules (algorithm aliases, layer-id setters, draft
``fc`` sizing, launch-argument parsing) work without it, so ``eagle-io check-serving`` needs no SGLang install.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ACCEPT_HOOK",
    "CAPTURE_MIN_SGLANG",
    "DEEPSEEK_STYLE_SETTERS",
    "DRAFT_EXTEND_DECODE_HOOK",
    "DRAFT_EXTEND_PREFILL_HOOK",
    "FINAL_BOUNDARY_SETTERS",
    "STARTUP_HOOK",
    "SUPPORTED_SGLANG",
    "TESTED_SGLANG",
    "LaunchArgs",
    "SGLangCompatError",
    "StartupFacts",
    "capture_supported",
    "draft_extend_width",
    "draft_num_aux_layers",
    "explicit_ids_for",
    "launch_args",
    "resolve_algorithm",
    "served_aux_layer_ids",
    "setter_rule",
    "sglang_version",
    "startup_facts",
    "version_supported",
]

SUPPORTED_SGLANG = ">=0.5.14,<0.6"
TESTED_SGLANG = "0.5.23"
CAPTURE_MIN_SGLANG = "0.5.23"
_MIN, _MAX_EXCL = (0, 5, 14), (0, 6, 0)


class SGLangCompatError(RuntimeError):
    """An SGLang object lacks an attribute this module expects: an SGLang version outside the supported range."""


def sglang_version() -> str | None:
    """The installed SGLang's version (from package metadata, without importing it), or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


def _version_tuple(v: str) -> tuple[int, ...]:
    parts: list[int] = []
    for p in v.split(".")[:3]:
        digits = "".join(c for c in p if c.isdigit()) if p[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts + [0] * (3 - len(parts)))


def version_supported(v: str | None) -> bool:
    """Whether ``v`` (e.g. ``"0.5.23"``, ``"0.5.23.post1"``) lies in :data:`SUPPORTED_SGLANG`."""
    return bool(v) and _MIN <= _version_tuple(str(v)) < _MAX_EXCL


def capture_supported(v: str | None) -> bool:
    """Whether ``v`` has the capture-only mode the SGLang capture needs (>= :data:`CAPTURE_MIN_SGLANG`)."""
    return bool(v) and _version_tuple(CAPTURE_MIN_SGLANG) <= _version_tuple(str(v)) < _MAX_EXCL


# --------------------------------------------------------------------------------------------------------------
# Speculative algorithm names
# --------------------------------------------------------------------------------------------------------------

_ALIASES = {"NEXTN": "EAGLE"}
"""``sglang/srt/speculative/spec_info.py``: ``SpeculativeAlgorithm.from_string`` maps the reserved alias
``NEXTN`` to ``EAGLE``; ``srt/arg_groups/speculative_hook.py`` (``handle_speculative_decoding`` /
``_resolve_speculative_algorithm_alias``) declares the resolved name. Nothing there inspects the draft."""


def resolve_algorithm(name: str | None) -> str | None:
    """The algorithm SGLang actually runs for ``--speculative-algorithm name``: upper-cased, ``NEXTN -> EAGLE``.

    (SGLang 0.5.23 also turns NEXTN/EAGLE into ``FROZEN_KV_MTP`` for Gemma-4 assistant drafts; irrelevant to
    EAGLE-3 drafts and not modelled here.)
    """
    if name is None:
        return None
    up = str(name).strip().upper()
    return _ALIASES.get(up, up)


# --------------------------------------------------------------------------------------------------------------
# Target-side aux layer ids: what each model's ``set_eagle3_layers_to_capture`` stores in ``layers_to_capture``
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


def served_aux_layer_ids(architecture: str, num_layers: int, explicit_ids: Sequence[int] | None) -> list[int]:
    """The ids SGLang puts in ``layers_to_capture`` (eagle-io convention: input of 0-based layer i).

    ``explicit_ids`` is what SGLang passes to ``set_eagle3_layers_to_capture``: the draft config's
    ``eagle_config["eagle_aux_hidden_state_layer_ids"]`` (``spec_aux_hidden_state.py``,
    ``_resolve_eagle_aux_hidden_state``), None when absent. Rules per setter:

    * None: ``[2, N//2, N-3]`` for every model (e.g. ``srt/models/llama.py``).
    * Llama and most models: ``[i + 1 for i in ids]`` (explicit ids mean "output of layer i").
    * :data:`DEEPSEEK_STYLE_SETTERS`: ``+1`` only if ``ids[0] == 1`` (SpecForge-style ids), else unchanged.
    * :data:`FINAL_BOUNDARY_SETTERS`: unchanged if ``max(ids) == N``, else ``+1``.
    """
    if explicit_ids is None:
        return [2, num_layers // 2, num_layers - 3]
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


def explicit_ids_for(architecture: str, num_layers: int, wanted: Sequence[int]) -> list[int] | None:
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


# --------------------------------------------------------------------------------------------------------------
# Draft-side sizing
# --------------------------------------------------------------------------------------------------------------


def draft_num_aux_layers(config: Mapping[str, Any]) -> tuple[int, str]:
    """How many aux states SGLang sizes the draft's ``fc`` for, and where that number came from.

    ``srt/models/llama_eagle3.py``, ``LlamaModel.__init__``: explicit ``num_aux_hidden_states`` >
    ``len(eagle_config["eagle_aux_hidden_state_layer_ids"])`` > 3; ``fc`` is
    ``Linear(target_hidden_size * num_aux, hidden_size)`` (``kimi_k25_eagle3.py`` sizes its
    ``ColumnParallelLinear`` the same way).
    """
    n = config.get("num_aux_hidden_states")
    if isinstance(n, int) and not isinstance(n, bool):
        return n, "num_aux_hidden_states"
    ec = config.get("eagle_config")
    ids = ec.get("eagle_aux_hidden_state_layer_ids") if isinstance(ec, dict) else None
    if isinstance(ids, list) and ids:
        return len(ids), "len(eagle_config.eagle_aux_hidden_state_layer_ids)"
    return 3, "SGLang's default of 3 aux layers"


# --------------------------------------------------------------------------------------------------------------
# Launch arguments
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LaunchArgs:
    """The launch arguments the serving checks read.

    ``algorithm`` is as given; ``resolved_algorithm`` is what SGLang runs (``NEXTN -> EAGLE``; read from
    ``sglang.srt.arg_groups.overrides.resolved_view`` when a resolved ``ServerArgs`` is given).
    """

    model_path: str | None = None
    draft_path: str | None = None
    algorithm: str | None = None
    resolved_algorithm: str | None = None
    context_length: int | None = None


def _launch_parser() -> argparse.ArgumentParser:
    # Flag spellings of sglang/srt/server_args.py (ServerArgs.add_cli_args); unknown flags are ignored.
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--model-path", "--model", dest="model_path")
    p.add_argument("--speculative-draft-model-path", "--speculative-draft-model", dest="draft_path")
    p.add_argument("--speculative-algorithm", dest="algorithm")
    p.add_argument("--context-length", dest="context_length", type=int)
    return p


def launch_args(server_args: Any) -> LaunchArgs:
    """Reads :class:`LaunchArgs` from raw SGLang launch arguments (``["--model-path", "m", ...]``, as given to
    ``python -m sglang.launch_server``), a mapping of ``ServerArgs`` field names, or a ``ServerArgs`` object.

    For a ``ServerArgs`` object the resolved view is used when resolution has run
    (``ServerArgs.resolve_once``; ``sglang.srt.arg_groups.overrides.resolved_view``), so ``NEXTN`` already reads
    ``EAGLE`` there; an unresolved object is resolved here by :func:`resolve_algorithm`'s rule.
    """
    if server_args is None:
        return LaunchArgs()
    if isinstance(server_args, (list, tuple)):
        ns, _ = _launch_parser().parse_known_args([str(a) for a in server_args])
        return LaunchArgs(
            ns.model_path, ns.draft_path, ns.algorithm, resolve_algorithm(ns.algorithm), ns.context_length
        )
    if isinstance(server_args, Mapping):
        get = server_args.get
    else:
        view = server_args
        if getattr(server_args, "_resolution_finished", False):
            try:
                from sglang.srt.arg_groups.overrides import resolved_view

                view = resolved_view(server_args)
            except ImportError:  # pragma: no cover - a ServerArgs without sglang cannot exist
                pass

        def get(key: str, default: Any = None) -> Any:
            return getattr(view, key, default)

    algo = get("speculative_algorithm")
    ctx = get("context_length")
    return LaunchArgs(
        model_path=get("model_path"),
        draft_path=get("speculative_draft_model_path"),
        algorithm=algo,
        resolved_algorithm=resolve_algorithm(algo),
        context_length=int(ctx) if isinstance(ctx, int) else None,
    )


# --------------------------------------------------------------------------------------------------------------
# Live objects in the scheduler process (the startup guard and runtime checks)
# --------------------------------------------------------------------------------------------------------------

STARTUP_HOOK = "sglang.srt.managers.scheduler.Scheduler.init_all_cuda_graphs"
"""``Scheduler.init_model_worker`` runs ``init_tp_model_worker``, ``maybe_init_draft_worker``,
``init_memory_pools``, ``init_all_attention_backends`` (which calls ``configure_aux_hidden_state_capture`` ->
``model.set_eagle3_layers_to_capture``) and then ``init_all_cuda_graphs``: a BEFORE hook here sees the final
capture settings before any graph is captured."""

DRAFT_EXTEND_PREFILL_HOOK = "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_prefill"
"""``(self, batch, target_hidden_states, next_token_ids, ...)``: the target prefill's states (FULL capture)
become ``EagleDraftExtendInput.hidden_states``; always eager."""

DRAFT_EXTEND_DECODE_HOOK = "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_decode"
"""``(self, batch, batch_result, *, kv_loc_plan)``: ``batch_result.logits_output.hidden_states`` (the verify
forward's states) becomes ``EagleDraftExtendInput.hidden_states``; may replay a CUDA graph afterwards, but this
Python entry runs on the host every step."""

ACCEPT_HOOK = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.on_verify_complete_cpu"
"""``(self, num_correct_drafts_per_req: list[int], batch_size=0)``, called by
``batch_result_processor._resolve_spec_v2_tokens`` with counts already on the CPU; accept length of a request
step = correct drafts + 1 (the bonus token)."""


@dataclass(frozen=True)
class StartupFacts:
    """What the startup guard decides on, read from a scheduler after attention-backend setup."""

    algorithm: str  # SpeculativeAlgorithm name, e.g. "EAGLE"
    is_eagle3: bool  # scheduler.spec_algorithm.is_eagle3()
    target_architecture: str
    target_hidden_size: int
    target_num_layers: int | None
    capture_enabled: bool  # capture_aux_hidden_states on the model that runs the layers
    layers_to_capture: tuple[int, ...]
    spec_aux_enabled: bool | None  # runner.spec_aux_config.eagle_use_aux_hidden_state (None if unknown)
    draft_present: bool  # False on non-last PP ranks (EAGLEWorkerV2._draft_worker is None)
    draft_architecture: str | None
    draft_config: dict[str, Any]  # the draft hf_config as a dict
    fc_in_width: int | None
    draft_embed_width: int | None


def _attr(obj: Any, *names: str) -> Any:
    """First present attribute among ``names`` (each may be dotted); raises SGLangCompatError if none is."""
    for name in names:
        cur = obj
        try:
            for part in name.split("."):
                cur = getattr(cur, part)
        except AttributeError:
            continue
        return cur
    raise SGLangCompatError(
        f"{type(obj).__name__} has none of {', '.join(names)} (SGLang {sglang_version()}; "
        f"eagle-io supports {SUPPORTED_SGLANG})"
    )


def _capture_model(model: Any) -> Any:
    """The module that owns ``capture_aux_hidden_states``: the model itself, or its ``language_model`` for
    wrappers (``KimiK25ForConditionalGeneration``, ``Mistral3``/``Llama4`` VLMs delegate the setter there)."""
    if hasattr(model, "capture_aux_hidden_states"):
        return model
    inner = getattr(model, "language_model", None)
    if inner is not None and hasattr(inner, "capture_aux_hidden_states"):
        return inner
    return model


def _hf_config_dict(cfg: Any) -> dict[str, Any]:
    if cfg is None:
        return {}
    if isinstance(cfg, Mapping):
        return dict(cfg)
    to_dict = getattr(cfg, "to_dict", None)
    return dict(to_dict()) if callable(to_dict) else dict(vars(cfg))


def _fc_in_width(draft_model: Any) -> int | None:
    """``model.fc.in_features`` (``llama_eagle3``: ``nn.Linear``) or ``model.fc.input_size``
    (``kimi_k25_eagle3``: ``ColumnParallelLinear``)."""
    inner = getattr(draft_model, "model", draft_model)
    fc = getattr(inner, "fc", None)
    if fc is None:
        return None
    for name in ("in_features", "input_size"):
        v = getattr(fc, name, None)
        if isinstance(v, int):
            return v
    w = getattr(fc, "weight", None)
    return int(w.shape[1]) if w is not None and getattr(w, "dim", lambda: 0)() == 2 else None


def _embed_width(draft_model: Any) -> int | None:
    inner = getattr(draft_model, "model", draft_model)
    emb = getattr(inner, "embed_tokens", None)
    dim = getattr(emb, "embedding_dim", None)
    if isinstance(dim, int):
        return dim
    w = getattr(emb, "weight", None)
    return int(w.shape[-1]) if w is not None else None


def startup_facts(scheduler: Any) -> StartupFacts:
    """Reads :class:`StartupFacts` from a ``Scheduler`` (``srt/managers/scheduler.py``).

    Paths: ``scheduler.spec_algorithm``; target ``scheduler.tp_worker.model_runner`` (``.model``,
    ``.model_config.hf_text_config``, ``.spec_aux_config`` (0.5.23) or the runner's own
    ``eagle_use_aux_hidden_state`` (0.5.14)); draft ``scheduler.draft_worker._draft_worker.draft_runner``
    (``EAGLEWorkerV2`` -> ``EagleDraftWorker``; ``_draft_worker`` is None on non-last PP ranks) with
    ``.model`` and ``.model_config.hf_config``.
    """
    algo = _attr(scheduler, "spec_algorithm")
    runner = _attr(scheduler, "tp_worker.model_runner", "tp_worker.worker.model_runner")
    model = _attr(runner, "model")
    cap = _capture_model(model)
    layer_owner = getattr(cap, "model", cap)
    layers = tuple(int(i) for i in (getattr(layer_owner, "layers_to_capture", None) or ()))
    text_cfg = _attr(runner, "model_config.hf_text_config", "model_config.hf_config")
    spec_aux = getattr(runner, "spec_aux_config", None)
    spec_aux_enabled = getattr(spec_aux, "eagle_use_aux_hidden_state", None) if spec_aux is not None else None
    if spec_aux_enabled is None:
        spec_aux_enabled = getattr(runner, "eagle_use_aux_hidden_state", None)
    dw = getattr(scheduler, "draft_worker", None)
    inner = getattr(dw, "_draft_worker", dw) if dw is not None else None
    draft_runner = getattr(inner, "draft_runner", None) if inner is not None else None
    draft_model = getattr(draft_runner, "model", None)
    draft_cfg = getattr(getattr(draft_runner, "model_config", None), "hf_config", None)
    draft_dict = _hf_config_dict(draft_cfg)
    archs = draft_dict.get("architectures") or []
    return StartupFacts(
        algorithm=str(getattr(algo, "name", algo)),
        is_eagle3=bool(algo.is_eagle3()),
        target_architecture=type(model).__name__,
        target_hidden_size=int(_attr(text_cfg, "hidden_size")),
        target_num_layers=getattr(text_cfg, "num_hidden_layers", None),
        capture_enabled=bool(getattr(cap, "capture_aux_hidden_states", False)),
        layers_to_capture=layers,
        spec_aux_enabled=None if spec_aux_enabled is None else bool(spec_aux_enabled),
        draft_present=draft_model is not None,
        draft_architecture=(archs[0] if archs else type(draft_model).__name__) if draft_model is not None else None,
        draft_config=draft_dict,
        fc_in_width=_fc_in_width(draft_model) if draft_model is not None else None,
        draft_embed_width=_embed_width(draft_model) if draft_model is not None else None,
    )


def draft_extend_width(hook: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> int | None:
    """Width of the states entering a draft extend, from the hooked call's arguments (host metadata only:
    ``Tensor.shape`` never synchronises the device). None when absent (idle batches)."""
    if hook == DRAFT_EXTEND_PREFILL_HOOK:
        states = kwargs.get("target_hidden_states", args[2] if len(args) > 2 else None)
    elif hook == DRAFT_EXTEND_DECODE_HOOK:
        result = kwargs.get("batch_result", args[2] if len(args) > 2 else None)
        states = getattr(getattr(result, "logits_output", None), "hidden_states", None)
    else:
        raise ValueError(hook)
    shape = getattr(states, "shape", None)
    return int(shape[-1]) if shape is not None and len(shape) >= 1 else None


# --------------------------------------------------------------------------------------------------------------
# Capture (eagle_io.serving.sglang_capture)
# --------------------------------------------------------------------------------------------------------------

TP_FORWARD_HOOK = "sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation"
"""``(self, batch: ScheduleBatch, forward_batch=None, ...) -> GenerationBatchResult``: its ``logits_output`` holds
``hidden_states`` (capture-only / EAGLE3 FULL mode: ``pack_aux_hidden_states``, ``[T, k*H]``) and
``last_hidden_states`` (post-norm final states, ``[T, H]``; ``LogitsProcessor._get_last_hidden_states_to_store``
keeps them when ``aux_hidden_state_capture`` is set)."""


def _parallel(name: str, default: int) -> int:
    try:
        from sglang.srt.runtime_context import get_parallel

        v = getattr(get_parallel(), name)
        return int(v) if v is not None else default
    except (ImportError, AttributeError, RuntimeError, ValueError):
        return default


def capture_target(scheduler: Any) -> dict[str, Any]:
    """Facts the SGLang capture needs from a scheduler: the target's sizes and capture layers (eagle-io ids: SGLang's
    ``layers_to_capture`` mean the input of layer i), ranks, and the chunked-prefill / radix-cache settings."""
    runner = _attr(scheduler, "tp_worker.model_runner", "tp_worker.worker.model_runner")
    model = _attr(runner, "model")
    cap = _capture_model(model)
    owner = getattr(cap, "model", cap)
    text = _attr(runner, "model_config.hf_text_config", "model_config.hf_config")
    sa = _attr(scheduler, "server_args")
    view = sa
    if getattr(sa, "_resolution_finished", False):
        from sglang.srt.arg_groups.overrides import resolved_view

        view = resolved_view(sa)
    dp_size = int(getattr(view, "dp_size", 1) or 1)
    return {
        "architecture": type(model).__name__,
        "hidden_size": int(_attr(text, "hidden_size")),
        "num_layers": int(_attr(text, "num_hidden_layers")),
        "vocab_size": int(_attr(text, "vocab_size")),
        "capture_enabled": bool(getattr(cap, "capture_aux_hidden_states", False)),
        "layers": [int(i) for i in (getattr(owner, "layers_to_capture", None) or ())],
        "chunked_prefill_size": getattr(view, "chunked_prefill_size", None),
        "radix_cache_disabled": bool(getattr(view, "disable_radix_cache", False)),
        "tp_rank": _parallel("attn_tp_rank", _parallel("tp_rank", 0)),
        "dp_rank": _parallel("dp_rank", 0) if dp_size > 1 else 0,
        "dp_size": dp_size,
    }


def is_prefill(batch: Any) -> bool:
    """``ScheduleBatch.forward_mode.is_extend()`` (a prefill; decode and idle batches are not captured)."""
    mode = getattr(batch, "forward_mode", None)
    return bool(mode is not None and mode.is_extend())


def batch_requests(batch: Any) -> list[dict[str, Any]]:
    """Per request of a ``ScheduleBatch``, in forward order: ``rid``, ``prefix_len`` (tokens served from cache or
    earlier chunks), ``extend_len`` (tokens in this forward: ``batch.extend_lens``), ``input_ids``
    (``Req.origin_input_ids``), ``custom_params`` (``Req.sampling_params.custom_params``, ``{}`` when unset)."""
    reqs = list(getattr(batch, "reqs", None) or ())
    lens = getattr(batch, "extend_lens", None) or [r.extend_len for r in reqs]
    return [
        {
            "rid": str(r.rid),
            "prefix_len": int(getattr(r, "prefix_len", 0)),
            "extend_len": int(n),
            "input_ids": [int(t) for t in r.origin_input_ids],
            "custom_params": getattr(getattr(r, "sampling_params", None), "custom_params", None) or {},
        }
        for r, n in zip(reqs, lens, strict=True)
    ]


def forward_states(result: Any) -> tuple[Any, Any]:
    """``(aux [T, k*H], final [T, H])`` from a ``GenerationBatchResult`` (either may be None)."""
    lo = getattr(result, "logits_output", None)
    return getattr(lo, "hidden_states", None), getattr(lo, "last_hidden_states", None)
