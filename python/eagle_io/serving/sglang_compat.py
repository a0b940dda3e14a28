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

Nothing here imports SGLang at module import time: the pure rules (algorithm aliases, draft
``fc`` sizing, launch-argument parsing; SGLang's layer-id setters are in :mod:`eagle_io.capturing.layers`) work
without it, so ``eagle-io check-serving`` needs no SGLang install.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import SGLangCompatError

__all__ = [
    "ACCEPT_HOOK",
    "CAPTURE_MIN_SGLANG",
    "CONTEXT_LENGTH_KEYS",
    "DRAFT_EXTEND_DECODE_HOOK",
    "DRAFT_EXTEND_PREFILL_HOOK",
    "STARTUP_HOOK",
    "SUPPORTED_SGLANG",
    "TESTED_SGLANG",
    "LaunchArgs",
    "SGLangCompatError",
    "capture_supported",
    "context_length",
    "draft_num_aux_layers",
    "launch_args",
    "resolve_algorithm",
    "sglang_version",
    "version_supported",
]

SUPPORTED_SGLANG = ">=0.5.14,<0.6"
TESTED_SGLANG = "0.5.23"
CAPTURE_MIN_SGLANG = "0.5.23"
_MIN, _MAX_EXCL = (0, 5, 14), (0, 6, 0)


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
# Draft-side sizing
# --------------------------------------------------------------------------------------------------------------


def draft_num_aux_layers(config: Mapping[str, Any]) -> tuple[int, str]:
    """How many aux states SGLang sizes the draft's ``fc`` for, and where that number came from.

    ``srt/models/llama_eagle3.py``, ``LlamaModel.__init__``: explicit ``num_aux_hidden_states`` >
    ``len(eagle_config["eagle_aux_hidden_state_layer_ids"])`` > 3; ``fc`` is
    ``Linear(target_hidden_size * num_aux, hidden_size)``. ``kimi_k25_eagle3.py`` (``Eagle3DeepseekV2ForCausalLM``)
    counts ``eagle_config`` ids, then top-level ids, then 3 (:func:`eagle_io.serving.draft_build.draft_build`).
    """
    from .draft_build import draft_build

    b = draft_build(config)
    return b.num_aux, b.num_aux_source


CONTEXT_LENGTH_KEYS = (
    "max_sequence_length",
    "seq_length",
    "max_seq_len",
    "model_max_length",
    "max_position_embeddings",
)
"""``srt/utils/hf_transformers/common.py``: ``CONTEXT_LENGTH_KEYS``, the first present wins."""


def context_length(config: Mapping[str, Any]) -> int:
    """The context length SGLang derives from a (text) config: ``get_context_length`` in
    ``srt/utils/hf_transformers/common.py``: the first of :data:`CONTEXT_LENGTH_KEYS` times the ``rope_scaling``
    ``factor`` (1 when the scaling has ``original_max_position_embeddings`` or ``rope_type: llama3``); 2048 when no
    key is present. A draft is given the target's context length (``EAGLEWorkerV2``: ``TpModelWorker(...,
    context_length=target ... context_len)``) and ``ModelConfig._derive_context_length`` refuses one above this
    value unless ``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1``, which then overrides the draft's
    ``max_position_embeddings``."""
    rs = config.get("rope_scaling")
    factor: Any = 1
    if isinstance(rs, Mapping) and rs:
        factor = rs.get("factor", 1)
        if "original_max_position_embeddings" in rs or rs.get("rope_type") == "llama3":
            factor = 1
    for key in CONTEXT_LENGTH_KEYS:
        v = config.get(key)
        if v is not None:
            return int(float(factor) * int(v))
    return 2048


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
    num_steps: int | None = None  # --speculative-num-steps (resolved: SGLang picks one when it is not given)


def _launch_parser() -> argparse.ArgumentParser:
    # Flag spellings of sglang/srt/server_args.py (ServerArgs.add_cli_args); unknown flags are ignored.
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--model-path", "--model", dest="model_path")
    p.add_argument("--speculative-draft-model-path", "--speculative-draft-model", dest="draft_path")
    p.add_argument("--speculative-algorithm", dest="algorithm")
    p.add_argument("--context-length", dest="context_length", type=int)
    p.add_argument("--speculative-num-steps", dest="num_steps", type=int)
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
            ns.model_path, ns.draft_path, ns.algorithm, resolve_algorithm(ns.algorithm), ns.context_length, ns.num_steps
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
    ctx, steps = get("context_length"), get("speculative_num_steps")
    return LaunchArgs(
        model_path=get("model_path"),
        draft_path=get("speculative_draft_model_path"),
        algorithm=algo,
        resolved_algorithm=resolve_algorithm(algo),
        context_length=int(ctx) if isinstance(ctx, int) else None,
        num_steps=int(steps) if isinstance(steps, int) and not isinstance(steps, bool) else None,
    )


# --------------------------------------------------------------------------------------------------------------
# Hook targets (the startup guard, runtime checks and capture; the live-object probes are in sglang_probe.py)
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

TP_FORWARD_HOOK = "sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation"
"""``(self, batch: ScheduleBatch, forward_batch=None, ...) -> GenerationBatchResult``: its ``logits_output`` holds
``hidden_states`` (capture-only / EAGLE3 FULL mode: ``pack_aux_hidden_states``, ``[T, k*H]``) and
``last_hidden_states`` (post-norm final states, ``[T, H]``; ``LogitsProcessor._get_last_hidden_states_to_store``
keeps them when ``aux_hidden_state_capture`` is set)."""
