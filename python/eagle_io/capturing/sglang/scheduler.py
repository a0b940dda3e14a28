"""The scheduler side of the SGLang capture, the process: the hooks SGLang calls inside each scheduler process, the
control commands and status over HTTP, the start by environment (installed by the plugin,
:func:`eagle_io.sglang_plugin.register`, unless ``EAGLE_IO_SGLANG_CAPTURE=0``). One capture in one scheduler process
is :class:`.capture.SchedulerCapture`; the protocol it speaks with the client (request parameters, commands, status)
is :mod:`.protocol`.

Which requests: an AFTER hook on ``Scheduler._create_generation_req`` decides once per new request
(:class:`.live.Admission`: a client's sample request, or for a live capture the rate, the per-request flag and the
caps) and gives a sampled request a radix-cache namespace of its own, so its whole prompt is computed. Nothing of
another request is copied.

Its states: an AFTER hook on ``TpModelWorker.forward_batch_generation`` takes, for each extend (prefill, chunked or
not) and decode forward that holds a sampled request, the concatenated aux states
(``LogitsProcessorOutput.hidden_states``, ``[T, k*H]``, FULL capture) and the final post-norm states
(``.last_hidden_states``, ``[T, H]``); under EAGLE3 with a draft, an AFTER hook on ``EAGLEWorkerV2.verify`` takes the
verify forward's accepted-path rows (:func:`eagle_io.sglang.probe.verify_states`). Each sampled request's rows are
kept as device clones queued behind the forward, no host sync (:mod:`.assembly`). An AFTER hook on
``Scheduler.process_batch_result`` commits the rows of the tokens SGLang committed and turns each finished sampled
request into one sample, handed to a thread of eagle-io's own (:mod:`.handoff`) that checks its values and puts it
into the capture ring (:class:`eagle_io.capturing.store.SampleStore`), which copies it asynchronously to the shard
writer. States never go through SGLang's float-list path. A sampled request the capture cannot store is counted and
logged; a forward never fails for it. One process of each data-parallel rank (a replica, or an attention-DP group)
writes: its attention-TP rank 0, as shard-writer rank ``replica * attn_dp_size + attn_dp_rank`` of ``dp_size *
attn_dp_size`` (:mod:`eagle_io.sglang.ranks`).
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import signal
import threading
from collections.abc import Mapping
from typing import Any

from ..._native import __version__
from ...errors import InvalidArgumentError
from ...sglang import hooks, probe
from ..options import CaptureOptions
from .capture import SchedulerCapture
from .live import LivePolicy
from .operator import OperatorPolicy
from .protocol import (
    ENV_CAPTURE_DIR,
    ENV_CAPTURE_LIVE,
    ENV_CAPTURE_OPTIONS,
    ENV_CAPTURE_SECRET,
    STATUS_KEY,
    CaptureRefusedError,
    capture_id,
    parse_control,
)

logger = logging.getLogger("eagle_io.serving")


OPERATOR = OperatorPolicy.from_env()
"""What this server's operator allows remote captures (read once per scheduler process)."""
_HIDDEN_REFUSED = [0]  # requests that asked for hidden states, answered without them

_ACTIVE: SchedulerCapture | None = None
_STARTING: dict[str, Any] | None = None  # a start over HTTP in progress or failed: {"state", "id", "error"}
_LOCK = threading.Lock()


def _running() -> SchedulerCapture | None:
    """The capture the hooks feed, or None. Called on the scheduler's thread only: a stopped capture's held rows are
    forgotten here (device memory), where no hook is iterating them."""
    cap = _ACTIVE
    if cap is None or not cap.writes:
        return None
    if cap.stopping or cap.error is not None:
        if cap.stopping and (cap.admitted or len(cap.requests)):
            cap.admitted.clear()
            cap.requests.held.clear()
        return None
    return cap


def _guarded(cap: SchedulerCapture, step: Any, *args: Any) -> None:
    """Runs one of the capture's steps inside SGLang's loop: an error of eagle-io's own stops the capture (shown in
    its status) and never reaches SGLang, whose request goes on being served."""
    try:
        step(*args)
    except Exception as e:
        logger.exception("eagle-io capture: %s failed", getattr(step, "__name__", step))
        cap.fail(f"{type(e).__name__} in {getattr(step, '__name__', step)}: {e}")


def _request_hook(result: Any, *args: Any, **kwargs: Any) -> Any:
    """AFTER ``Scheduler._create_generation_req(self, recv_req, ...) -> Req``: every new request, once. A request
    asking for hidden states is answered without them (counted ``hidden_states_refused``) unless the operator allows
    it (``EAGLE_IO_ALLOW_CLIENT_HIDDEN_STATES=1``): the capture's launch flags must hand clients nothing new."""
    if result is not None and not OPERATOR.client_hidden_states:
        try:
            if probe.strip_hidden_states(result):
                _HIDDEN_REFUSED[0] += 1
        except Exception:  # never into SGLang's loop
            logger.exception("eagle-io: could not read a request's return_hidden_states")
    cap = _running()
    if cap is not None and result is not None:
        _guarded(cap, cap.on_request, result)
    return result


def _forward_hook(result: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``TpModelWorker.forward_batch_generation(self, batch, ...)``: extend and decode forwards (a verify
    forward comes with ``batch=None``: :func:`_verify_hook`)."""
    cap = _running()
    if cap is None or not (cap.admitted or len(cap.requests)):
        return None
    batch = kwargs.get("batch", args[1] if len(args) > 1 else None)
    if batch is not None and (probe.is_prefill(batch) or probe.is_decode(batch)):
        _guarded(cap, cap.on_forward, batch, result)
    return None


def _verify_hook(result: Any, *args: Any, **kwargs: Any) -> Any:
    """AFTER ``EAGLEWorkerV2.verify(self, batch, ...)``: EAGLE3 verify forwards."""
    cap = _running()
    if cap is None or not len(cap.requests):
        return result
    batch = kwargs.get("batch", args[1] if len(args) > 1 else None)
    if batch is not None:
        _guarded(cap, cap.on_verify, batch, result)
    return result


def _result_hook(result: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``Scheduler.process_batch_result(self, batch, result)``: committed rows, finished requests stored."""
    cap = _running()
    if cap is None or not (cap.admitted or len(cap.requests)):
        return None
    batch = kwargs.get("batch", args[1] if len(args) > 1 else None)
    if batch is not None:
        _guarded(cap, cap.on_result, batch)
    return None


def _final_state_hook(result: Any, processor: Any, hidden_states: Any, aux_hidden_states: Any, metadata: Any,
                      *args: Any, **kwargs: Any) -> Any:  # fmt: skip
    """AFTER ``LogitsProcessor._get_last_hidden_states_to_store(self, hidden_states, aux_hidden_states,
    logits_metadata)``: under EAGLE3 with a draft SGLang drops the final post-norm states the target hands its
    ``lm_head``; where it captures aux states in FULL mode (the target's prefill and verify forwards), they are kept as
    ``last_hidden_states`` too, as capture-only mode keeps them. A reference to a tensor the forward computed anyway:
    no copy, no sync; only while a capture runs (no result outlives its forward with it otherwise), and while a CUDA
    graph is captured (a graph's outputs are fixed then)."""
    mode = getattr(metadata, "capture_hidden_mode", None)
    if result is not None or aux_hidden_states is None or mode is None or not mode.is_full():
        return None
    if _running() is not None or _graph_capturing():
        return hidden_states
    return None


def _graph_capturing() -> bool:
    """Whether a CUDA graph is being captured now (SGLang captures its graphs at startup, before any capture runs:
    the states must be among each graph's outputs then)."""
    import torch

    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _start(self: Any, out_dir: str, options: Mapping[str, Any], token: str | None = None,
           live: Mapping[str, Any] | None = None, **writers: int) -> None:  # fmt: skip
    """Starts this scheduler's capture (over HTTP, or at startup by environment). A stopped capture stays active until
    the next start, so that requests reaching it are counted (``after_stop``)."""
    global _ACTIVE
    with _LOCK:
        if _ACTIVE is not None and _ACTIVE.writes and not _ACTIVE.stopped:
            raise InvalidArgumentError(
                f"an eagle-io capture into {_ACTIVE.url} is already running in this scheduler; stop it first"
            )
        _ACTIVE = SchedulerCapture(self, out_dir, options, token, live=live, **writers)


def _start_over_http(scheduler: Any, cmd: Mapping[str, Any]) -> None:
    """A client's start: held to the operator's bounds (:class:`.operator.OperatorPolicy`), then started. A refusal
    or failure is shown in the status under the capture's id, and audited."""
    global _STARTING
    out_dir, cid = str(cmd.get("out_dir")), capture_id(cmd["token"])
    try:
        live = cmd.get("live")
        out_dir, options, policy = OPERATOR.admit_start(
            out_dir, CaptureOptions.from_dict(cmd.get("options") or {}), LivePolicy.from_dict(live) if live else None
        )
        writers = {k: int(cmd[k]) for k in ("writer_offset", "all_writers") if cmd.get(k) is not None}
        _start(scheduler, out_dir, options.to_dict(), cmd["token"], policy.to_dict() if policy else None, **writers)
        _STARTING = None
        _audit(cmd, "started")
    except BaseException as e:  # shown in the status; also a Rust panic (pyo3's PanicException is no Exception)
        _STARTING = {"state": "failed", "id": cid, "error": f"{type(e).__name__}: {e}"}
        _audit(cmd, f"refused: {_STARTING['error']}")


def _audit(cmd: Mapping[str, Any], result: str) -> None:
    """One line in the server's log per control command: who (the host the client names itself, as SGLang gives a
    scheduler no address), the op, the capture id, the out_dir and the result; never a secret."""
    logger.warning("eagle-io AUDIT client=%r op=%r capture=%s out_dir=%r force=%s result=%s",  # %r: one line each
                   str(cmd.get("client"))[:100], cmd.get("op"), capture_id(cmd.get("token")), cmd.get("out_dir"),
                   cmd.get("force") is True, result)  # fmt: skip


def _same_secret(held: str | None, sent: str) -> bool:
    """Whether a command carries the running capture's secret (a constant-time comparison)."""
    return held is not None and hmac.compare_digest(held.encode(), sent.encode())


def _keys_of(scheduler: Any) -> str:
    """Which of SGLang's keys guard this server's control route (``--admin-api-key``, else ``--api-key``)."""
    args = getattr(scheduler, "server_args", None)
    if getattr(args, "admin_api_key", None):
        return "--admin-api-key"
    return "--api-key" if getattr(args, "api_key", None) else "no key"


def _control_hook(original: Any, scheduler: Any, recv_req: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``Scheduler.set_internal_state(self, recv_req)``: takes eagle-io's commands (:func:`.protocol
    .parse_control`) and answers ``updated=True`` when one was taken; starting and stopping run on a thread, so the
    scheduler loop never waits for them. Every other request is SGLang's."""
    global _STARTING
    try:
        cmd = parse_control(getattr(recv_req, "server_args", None))
    except CaptureRefusedError as e:
        logger.error("eagle-io capture: %s", e)
        cmd = {"op": "invalid"}
    if cmd is None:
        return original(scheduler, recv_req, *args, **kwargs)
    from sglang.srt.managers.io_struct import SetInternalStateReqOutput

    taken, why = False, "not taken"
    with _LOCK:
        cap = _ACTIVE
        if cmd["op"] == "stop" and _STARTING is not None and _STARTING["state"] == "failed":
            # that start's client was answered; its record would hide the capture this stop stops from the status
            _STARTING = None
        if cmd["op"] == "start":
            running = cap is not None and cap.writes and not cap.stopping
            if running and _same_secret(cap.token, cmd["token"]):
                taken, why = True, "already running (a retried start)"
            elif running:
                why = f"refused: capture {capture_id(cap.token)} is running"
            elif not (_STARTING and _STARTING["state"] == "starting"):
                _STARTING = {"state": "starting", "id": capture_id(cmd["token"]), "error": None}
                threading.Thread(target=_start_over_http, args=(scheduler, cmd), daemon=True).start()
                taken, why = True, "starting"
        elif cmd["op"] == "stop" and cap is not None and cap.writes:
            # only the capture's own client (its secret) stops it; a forced stop (its client is gone) only where
            # SGLang checked the caller's key, and it ends the capture incomplete
            mine = _same_secret(cap.token, cmd["token"])
            forced = cmd.get("force") is True and not mine
            keys = _keys_of(scheduler)
            if cap.token is None or mine or (forced and keys != "no key"):
                complete = cmd.get("complete") is not False and not (forced and cap.token is not None)
                threading.Thread(target=cap.stop, args=(cmd["token"], complete, forced), daemon=True).start()
                taken, why = True, "stopping" + (" (forced: incomplete)" if forced and cap.token else "")
            elif forced:
                why = "refused: a forced stop needs the server launched with --admin-api-key (or --api-key)"
            else:
                why = "refused: not this capture's secret"
        elif cmd["op"] == "stop" and cap is not None:
            taken, why = True, "no writer on this rank"
    _audit(cmd, why)
    return SetInternalStateReqOutput(updated=taken)


def _status_hook(result: Any, scheduler: Any, *args: Any, **kwargs: Any) -> Any:
    """AFTER ``Scheduler.get_internal_state(self, recv_req)``: adds this rank's capture status and target facts
    (:data:`.protocol.STATUS_KEY`) to its ``internal_states`` entry."""
    state = getattr(result, "internal_state", None)
    if isinstance(state, dict):
        try:
            state[STATUS_KEY] = status(scheduler)
        except Exception as e:  # never into SGLang's loop; the client names it
            logger.exception("eagle-io capture: the status could not be read")
            state[STATUS_KEY] = {"state": "unknown", "error": f"{type(e).__name__}: {e}"}
    return result


_FACTS: dict[str, Any] | None = None


def status(scheduler: Any) -> dict[str, Any]:
    """This scheduler's capture status: ``target`` (the facts a client checks before starting:
    :func:`eagle_io.sglang.probe.capture_target`, or ``error`` when they cannot be read), ``eagle_io`` (the
    version), then the capture's own (``state`` ``idle`` when none ran)."""
    global _FACTS
    if _FACTS is None:
        try:
            _FACTS = probe.capture_target(scheduler)
        except Exception as e:  # the client names it
            _FACTS = {"error": f"{type(e).__name__}: {e}"}
    out: dict[str, Any] = {"eagle_io": __version__, "target": _FACTS, "hidden_states_refused": _HIDDEN_REFUSED[0]}
    if _STARTING is not None:
        out.update(_STARTING)
    elif _ACTIVE is not None:
        out.update(_ACTIVE.status())
    else:
        out["state"] = "idle"
    return json.loads(json.dumps(out, default=str))  # msgpack-native for SGLang's IPC


def _start_from_env(scheduler: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE ``Scheduler.init_all_cuda_graphs``: logs the security posture (once per process), then starts the
    capture named by ``EAGLE_IO_CAPTURE_DIR``, resuming what this writer left there (a server restarted after a
    crash continues its capture). Serving comes first: a capture that cannot start (a directory of another capture,
    a full disk, a bad option) is logged and shown in the status (``failed``), and the server serves without it."""
    global _STARTING
    logger.warning("%s", OPERATOR.posture(_keys_of(scheduler)))
    out_dir = os.environ.get(ENV_CAPTURE_DIR)
    if out_dir:
        try:
            live = os.environ.get(ENV_CAPTURE_LIVE)
            options = json.loads(os.environ.get(ENV_CAPTURE_OPTIONS) or "{}")
            options["writer_options"] = {"resume": True, **(options.get("writer_options") or {})}
            _start(scheduler, out_dir, options, os.environ.get(ENV_CAPTURE_SECRET) or None,
                   live=json.loads(live) if live else None)  # fmt: skip
            logger.info("eagle-io capture started from %s=%s", ENV_CAPTURE_DIR, out_dir)
            _ignore_terminal_interrupt()
        except Exception as e:  # never a reason to stop serving
            _STARTING = {"state": "failed", "id": None, "error": f"{type(e).__name__}: {e}"}
            logger.error("eagle-io capture from %s=%s did not start; serving without it: %s", ENV_CAPTURE_DIR, out_dir,
                         _STARTING["error"])  # fmt: skip
    return None


def _ignore_terminal_interrupt() -> None:
    """A capturing scheduler ignores SIGINT: a terminal's Ctrl-C reaches every process of the group, and a scheduler
    it killed would lose its open shard and never answer the stop. A client stops the capture over HTTP (``eagle-io
    live stop``: committed), and SGLang's own shutdown still ends the process. Only in the process's main thread,
    where a handler can be set."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def install(*, switch: str) -> list[str]:
    """Called by the plugin in scheduler processes: registers, through ``HookRegistry``, the capture's hooks (the
    request, forward, verify, result and final-state hooks), the control and status hooks and the start by
    environment; returns the targets registered (each resolved first: :func:`eagle_io.sglang.hooks.register`).

    Raises:
        SGLangCompatError: a target does not resolve on the installed SGLang (naming ``switch``, the setting that
            runs without the capture knowingly).
    """
    hooks.register(hooks.TP_FORWARD_HOOK, _forward_hook, "AFTER", switch=switch)
    hooks.register(hooks.RESULT_HOOK, _result_hook, "AFTER", switch=switch)
    hooks.register(hooks.VERIFY_HOOK, _verify_hook, "AFTER", switch=switch)
    hooks.register(hooks.REQUEST_HOOK, _request_hook, "AFTER", switch=switch)
    hooks.register(hooks.FINAL_STATE_HOOK, _final_state_hook, "AFTER", switch=switch)
    hooks.register(hooks.STARTUP_HOOK, _start_from_env, "BEFORE", switch=switch)
    hooks.register(hooks.SET_STATE_HOOK, _control_hook, "AROUND", switch=switch)
    hooks.register(hooks.GET_STATE_HOOK, _status_hook, "AFTER", switch=switch)
    return [hooks.TP_FORWARD_HOOK, hooks.RESULT_HOOK, hooks.VERIFY_HOOK, hooks.REQUEST_HOOK, hooks.FINAL_STATE_HOOK,
            hooks.STARTUP_HOOK, hooks.SET_STATE_HOOK, hooks.GET_STATE_HOOK]  # fmt: skip
