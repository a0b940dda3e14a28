"""The SGLang functions eagle-io hooks (through ``sglang.srt.plugins.hook_registry.HookRegistry``), each with why
there, and the two checks that a hook is really in place.

SGLang only logs a hook it cannot place: ``HookRegistry.apply_hooks`` catches the error of a target that does not
resolve ("Failed to apply hooks to ..."), and ``load_plugins`` catches what a plugin's ``register()`` raises. A
renamed SGLang function would switch a guard off without a word, so each target is resolved by eagle-io before it
is registered (:func:`unresolved`), and checked after SGLang applied it (:func:`unapplied`); the serving plugin
turns either finding into an error that stops the launch (:mod:`eagle_io.serving.plugin`).

The runtime targets are not fixed paths: :func:`defining_target` hooks a method where the live worker's class
actually defines it (``EagleDraftWorker._draft_extend_for_prefill`` for EAGLE-3, ``MultiLayerEagleDraftWorker``'s
own for ``--enable-multi-layer-eagle``, ``BaseSpecWorker.on_verify_complete_cpu`` inherited by
``MultiLayerEagleWorkerV2``), so a subclass that overrides one is not missed. :data:`KNOWN_TARGETS` lists every
path this gives on the tested SGLang; a test resolves each against the installed SGLang, so a new pin that moves
one fails CI. Nothing here imports SGLang at module import time.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import InternalError, SGLangCompatError
from .compat import SUPPORTED_SGLANG, TESTED_SGLANG, sglang_version

__all__ = [
    "ACCEPT_HOOK",
    "DRAFT_EXTEND_DECODE_HOOK",
    "DRAFT_EXTEND_PREFILL_HOOK",
    "FINAL_STATE_HOOK",
    "GET_STATE_HOOK",
    "KNOWN_TARGETS",
    "REQUEST_HOOK",
    "RESULT_HOOK",
    "SCHEDULER_INIT_HOOK",
    "SET_STATE_HOOK",
    "STARTUP_HOOK",
    "TP_FORWARD_HOOK",
    "VERIFY_HOOK",
    "Placed",
    "defining_target",
    "forget",
    "hook_error",
    "placed",
    "register",
    "resolve",
    "unapplied",
    "unresolved",
    "verify",
]

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

RESULT_HOOK = "sglang.srt.managers.scheduler.Scheduler.process_batch_result"
"""``(self, batch: ScheduleBatch, result)``: after it, each request's ``output_ids`` and ``finished_reason`` are
up to date (the capture stores the requests that finished)."""

VERIFY_HOOK = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.verify"
"""``(self, batch: ScheduleBatch, ...) -> GenerationBatchResult`` (EAGLE3 with a draft): the verify forward's
``logits_output`` (``hidden_states`` with the accepted path at the front of each request's block,
``last_hidden_states``) and ``accept_index``, before the draft extend reads them and before a CUDA-graph replay
overwrites them (:func:`eagle_io.sglang.probe.verify_states`)."""

FINAL_STATE_HOOK = "sglang.srt.layers.logits_processor.LogitsProcessor._get_last_hidden_states_to_store"
"""``(self, hidden_states, aux_hidden_states, logits_metadata) -> Tensor | None``: the final post-norm states the
target hands its ``lm_head`` become ``LogitsProcessorOutput.last_hidden_states``; SGLang keeps them only in
capture-only mode (``keep_last_hidden_states``), not under EAGLE3 with a draft."""

REQUEST_HOOK = "sglang.srt.managers.scheduler.Scheduler._create_generation_req"
"""``(self, recv_req, *args, **kwargs) -> Req``, SGLang's "extension point for request-local state": every new
generate request passes here once, before it is queued and before its radix-cache prefix is matched."""

SET_STATE_HOOK = "sglang.srt.managers.scheduler.Scheduler.set_internal_state"
"""``(self, recv_req: SetInternalStateReq) -> SetInternalStateReqOutput``: what ``POST /set_internal_state`` reaches
on every DP rank (bound into the scheduler's request dispatcher in ``__init__``, after plugins are applied)."""

GET_STATE_HOOK = "sglang.srt.managers.scheduler.Scheduler.get_internal_state"
"""``(self, recv_req) -> GetInternalStateReqOutput``: one ``internal_states`` entry of ``GET /server_info`` per DP
rank."""

SCHEDULER_INIT_HOOK = "sglang.srt.managers.scheduler.Scheduler.__init__"
"""``run_scheduler_process`` calls ``load_plugins()`` (which registers and applies every plugin's hooks) and then
builds the ``Scheduler``: a BEFORE hook here runs once the hooks registered at plugin load are applied, before
the model loads, and an error it raises stops that scheduler's launch (``load_plugins`` would only log it)."""

SERVER_INFO_HOOK = "sglang.srt.entrypoints.http_server.redact_watermark_secrets"
"""``(value, *, in_watermark_config=False) -> value``: what ``GET /server_info`` (and ``/get_server_info``) passes
its whole answer through, in the HTTP server's process; SGLang 0.5.23 redacts only the watermark secrets there, so
``--api-key`` and ``--admin-api-key`` were readable by any caller (an AFTER hook redacts them)."""

PREFILL_METHOD = "_draft_extend_for_prefill"
DECODE_METHOD = "_draft_extend_for_decode"
ACCEPT_METHOD = "on_verify_complete_cpu"
"""The runtime hooks' method names, each placed with :func:`defining_target` on the live worker."""

KNOWN_TARGETS = (
    STARTUP_HOOK,
    SCHEDULER_INIT_HOOK,
    TP_FORWARD_HOOK,
    RESULT_HOOK,
    VERIFY_HOOK,
    REQUEST_HOOK,
    FINAL_STATE_HOOK,
    SET_STATE_HOOK,
    GET_STATE_HOOK,
    SERVER_INFO_HOOK,
    DRAFT_EXTEND_PREFILL_HOOK,
    DRAFT_EXTEND_DECODE_HOOK,
    ACCEPT_HOOK,
    f"sglang.srt.speculative.multi_layer_eagle_worker_v2.MultiLayerEagleDraftWorker.{PREFILL_METHOD}",
    f"sglang.srt.speculative.multi_layer_eagle_worker_v2.MultiLayerEagleDraftWorker.{DECODE_METHOD}",
    f"sglang.srt.speculative.base_spec_worker.BaseSpecWorker.{ACCEPT_METHOD}",
)
"""Every target eagle-io hooks on SGLang 0.5.23: the fixed ones, and what :func:`defining_target` gives for
``EAGLEWorkerV2`` (EAGLE / EAGLE3) and ``MultiLayerEagleWorkerV2`` (``--enable-multi-layer-eagle``, which inherits
``BaseSpecWorker.on_verify_complete_cpu``)."""


def resolve(target: str) -> Any:
    """The object at the dotted path ``target`` (``module.Class.attr``), as ``HookRegistry._apply_target``
    resolves it (``pkgutil.resolve_name`` of all but the last part, then ``getattr``).

    Raises:
        ImportError, AttributeError, ValueError: the path does not resolve (what SGLang would only log).
    """
    owner, attr = target.rsplit(".", 1)
    return getattr(pkgutil.resolve_name(owner), attr)


def unresolved(target: str) -> str | None:
    """Why ``target`` cannot be hooked on the installed SGLang (one sentence), or None when it resolves."""
    try:
        resolve(target)
    except (ImportError, AttributeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def unapplied(target: str, original: Any, registry: Any) -> str | None:
    """Why the hook on ``target`` is not in place after ``registry.apply_hooks()`` (``HookRegistry``), or None.

    In place = SGLang recorded the target as patched (``HookRegistry._patched``) and the attribute now is another
    object than ``original``, the function eagle-io resolved before registering."""
    if target not in getattr(registry, "_patched", ()):
        return "SGLang's HookRegistry did not apply it (its log names the error: 'Failed to apply hooks to ...')"
    why = unresolved(target)
    if why is not None:
        return why
    if resolve(target) is original:
        return "the attribute is still SGLang's own function after HookRegistry applied the hooks"
    return None


def defining_target(obj: Any, method: str) -> str | None:
    """The dotted path of ``method`` on the class that defines it for ``obj`` (the first class of
    ``type(obj).__mro__`` holding it in its ``__dict__``), or None when no class defines it."""
    for cls in type(obj).__mro__:
        if method in vars(cls):
            return f"{cls.__module__}.{cls.__qualname__}.{method}"
    return None


# --------------------------------------------------------------------------------------------------------------
# Placing hooks, checked
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Placed:
    """One target eagle-io registered: the function found there before (``original``), and the environment setting
    that runs SGLang without that hook, knowingly (``switch``, e.g. ``EAGLE_IO_DRAFT_WIDTH_CHECK=0``)."""

    original: Any
    switch: str


_PLACED: dict[str, Placed] = {}


def placed() -> dict[str, Placed]:
    """The targets registered in this process (a copy), by dotted path."""
    return dict(_PLACED)


def hook_error(target: str, why: str, switch: str) -> SGLangCompatError:
    """The error that stops a launch whose hook on ``target`` cannot be placed: the target, why, the SGLang
    version, and ``switch``, the setting that runs without that hook knowingly."""
    return SGLangCompatError(
        f"eagle-io cannot hook {target}: {why}. SGLang {sglang_version()} (eagle-io supports {SUPPORTED_SGLANG}, "
        f"tested {TESTED_SGLANG}) has moved or renamed it, and the check eagle-io places there would be off "
        f"without a word, so the launch is stopped. To run without that hook knowingly, set {switch}"
    )


def register(target: str, fn: Callable[..., Any], hook_type: str, *, switch: str) -> None:
    """Resolves ``target`` and registers ``fn`` there through SGLang's ``HookRegistry`` (``hook_type``:
    ``"BEFORE"``, ``"AFTER"``, ...); a target already registered by eagle-io in this process is registered again
    (several eagle-io hooks may share one) under the first original.

    Raises:
        SGLangCompatError: ``target`` does not resolve (:func:`hook_error`, naming ``switch``); nothing registered.
        InternalError: ``target`` was patched already (``HookRegistry.apply_hooks`` would never apply this hook).
    """
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    why = unresolved(target)
    if why is not None:
        raise hook_error(target, why, switch)
    if target in getattr(HookRegistry, "_patched", ()):
        # apply_hooks() skips a target it has patched: this hook would never run.
        raise InternalError(f"{target} is already patched: a hook registered on it now would never be applied")
    if target not in _PLACED:
        _PLACED[target] = Placed(resolve(target), switch)
    HookRegistry.register(target, fn, HookType[hook_type])


def verify(targets: Iterable[str]) -> None:
    """Checks, after ``HookRegistry.apply_hooks()``, that each of ``targets`` (registered with :func:`register`) is
    in place (:func:`unapplied`).

    Raises:
        SGLangCompatError: the first target not in place (:func:`hook_error`, naming its switch).
    """
    from sglang.srt.plugins.hook_registry import HookRegistry

    for target in targets:
        p = _PLACED[target]
        why = unapplied(target, p.original, HookRegistry)
        if why is not None:
            raise hook_error(target, why, p.switch)


def forget() -> None:
    """Drops this process' record of placed hooks (tests, after ``HookRegistry.reset()``)."""
    _PLACED.clear()
