"""The scheduler side of the SGLang capture: runs inside each SGLang scheduler process (installed by the plugin,
:func:`eagle_io.sglang_plugin.register`, unless ``EAGLE_IO_SGLANG_CAPTURE=0``). The protocol it speaks with the
client (request parameters, start by environment, stop file) is in :mod:`.protocol`.

An AFTER hook on ``TpModelWorker.forward_batch_generation`` takes, for each prefill forward, the concatenated aux
states (``LogitsProcessorOutput.hidden_states``, ``[T, k*H]``, FULL capture) and the final post-norm states
(``.last_hidden_states``, ``[T, H]``) as tensors on the device, splits them per request and hands them to the
capture core (:class:`eagle_io.capturing.store.SampleStore`), which copies them asynchronously into the capture
ring. They never go through SGLang's float-list path. One process of each data-parallel rank (a replica, or an
attention-DP group) writes: its attention-TP rank 0, as shard-writer rank ``replica * attn_dp_size + attn_dp_rank``
of ``dp_size * attn_dp_size`` (:mod:`eagle_io.sglang.ranks`).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Mapping
from typing import Any

from ...errors import InvalidArgumentError
from ...sglang import compat, hooks, probe
from ...store import layout
from ...store.upload import local_dir
from ..options import CaptureOptions
from ..store import ForwardSample, SampleStore, check_sample
from .client import refuse_writer_ranks
from .protocol import (
    ENV_CAPTURE_DIR,
    ENV_CAPTURE_OPTIONS,
    KEY_PARAM,
    MASK_PARAM,
    POLL_S,
    SAMPLE_PARAM,
    STOP_FILE,
    CaptureRefusedError,
    ack_path,
    read_stop,
    read_token,
)

logger = logging.getLogger("eagle_io.serving")


class _SchedulerCapture:
    """One capture in one scheduler process."""

    def __init__(self, scheduler: Any, out_dir: str, options: Mapping[str, Any]) -> None:
        opts = CaptureOptions.from_json(options)  # the client's options, JSON through the RPC or the environment
        refuse_writer_ranks(opts)
        v = compat.sglang_version()
        if not compat.capture_supported(v):
            raise InvalidArgumentError(
                f"eagle-io's SGLang capture needs SGLang >= {compat.CAPTURE_MIN_SGLANG} (capture-only mode), found {v}"
            )
        t = probe.capture_target(scheduler)
        if not t["capture_enabled"] or not t["layers"]:
            raise InvalidArgumentError(
                "the target captures no aux states: launch SGLang in capture-only mode "
                "(enable_return_aux_hidden_states=True, speculative_algorithm='EAGLE3')"
            )
        wanted = opts.aux_layer_ids
        if wanted is not None and list(wanted) != list(t["layers"]):
            raise InvalidArgumentError(
                f"aux_layer_ids {list(wanted)} were asked for, but this SGLang target captures {list(t['layers'])} "
                "(eagle-io ids: input of layer i); set them at launch (the draft config's eagle_config)"
            )
        if t["chunked_prefill_size"] is not None and t["chunked_prefill_size"] > 0:
            raise InvalidArgumentError(
                f"chunked prefill is on (chunked_prefill_size={t['chunked_prefill_size']}): a prompt would be split "
                "over forwards; launch with chunked_prefill_size=-1"
            )
        if not t["radix_cache_disabled"]:
            raise InvalidArgumentError(
                "the radix cache is on: shared prefixes would not be recomputed; launch with disable_radix_cache=True"
            )
        # An object-storage out_dir (s3://...) is staged locally: the stop and answer files live in the staging.
        staging = opts.writer_options.get("staging")
        self.out_dir, self.writer_rank = local_dir(out_dir, staging), t["writer_rank"]
        self.max_length = opts.max_length
        self.vocab_size = int(t["vocab_size"])
        self.writes = t["writes"]
        self.store: SampleStore | None = None
        self.outcome: dict[str, Any] | None = None
        if not self.writes:
            return
        info = {
            "num_layers": t["num_layers"],
            "hidden_size": t["hidden_size"],
            "vocab_size": t["vocab_size"],
            "architecture": t["architecture"],
            **opts.target_info,
        }
        launch = {"capture_backend": f"sglang {v}", "dp_size": t["dp_size"], "attn_dp_size": t["attn_dp_size"]}
        opts = opts.replace(
            metadata={**launch, **opts.metadata},
            writer_options={**opts.writer_options, "rank": t["writer_rank"], "world_size": t["writers"]},
        )
        self.store = SampleStore.create(out_dir, opts, aux_layer_ids=list(t["layers"]), target_info=info)
        # A stop file present now asks an earlier run to stop: only another token stops this one.
        self.stale_token = read_token(os.path.join(self.out_dir, STOP_FILE))
        self.answer_lock = threading.Lock()

    def on_forward(self, batch: Any, result: Any) -> None:
        reqs = probe.batch_requests(batch)
        if not any(SAMPLE_PARAM in r["custom_params"] for r in reqs):
            return
        aux, final = probe.forward_states(result)
        if aux is None or final is None:
            raise CaptureRefusedError(
                "this forward carries no aux/final states (FULL capture is off): launch SGLang in capture-only mode"
            )
        total = sum(r["extend_len"] for r in reqs)
        if total != aux.shape[0]:
            raise CaptureRefusedError(f"forward has {aux.shape[0]} state rows for {total} extend tokens")
        offset = 0
        todo: list[ForwardSample] = []
        for r in reqs:
            n, params = r["extend_len"], r["custom_params"]
            lo, offset = offset, offset + n
            if SAMPLE_PARAM not in params:
                continue
            sid, mask = params[SAMPLE_PARAM], params.get(MASK_PARAM)
            if r["prefix_len"] != 0 or n != len(r["input_ids"]):
                raise CaptureRefusedError(
                    f"sample {sid}: forward covers tokens {r['prefix_len']}..{r['prefix_len'] + n} of "
                    f"{len(r['input_ids'])} (chunked prefill or a cached prefix); nothing of it was written"
                )
            if not isinstance(mask, list):
                raise CaptureRefusedError(f"sample {sid}: custom_params[{MASK_PARAM!r}] is not a list of 0/1")
            check_sample(sid, r["input_ids"], mask, max_length=self.max_length, vocab_size=self.vocab_size)
            todo.append(ForwardSample(sid, r["input_ids"], mask, lo, n, str(params.get(KEY_PARAM, ""))))
        if self.store is not None:
            # The value checks of every request of this prefill forward: one host sync (not one per request).
            self.store.put_forward(aux, final, todo)

    def _watch_stop(self) -> None:
        """Stops on the first new stop token, then answers every later token (a retried or repeated stop) with
        the same outcome, until another capture starts in this process."""
        path, answered = os.path.join(self.out_dir, STOP_FILE), self.stale_token
        while _ACTIVE is self:
            time.sleep(POLL_S)
            token, complete = read_stop(path)
            if token is not None and token != answered:
                self.stop(token, complete=complete)
                answered = token

    @property
    def stopped(self) -> bool:
        """Whether a stop reached this capture (samples reaching it later are counted, not written)."""
        return self.outcome is not None

    def stop(self, token: Any, complete: bool = True) -> dict[str, Any]:
        """Drains the ring and commits the manifest (the first time; marked complete unless ``complete`` is False:
        an interrupted capture), then writes this rank's answer for
        ``token``: the outcome, the store's counts, the writer's statistics and, for an object-storage capture, what
        it uploaded (``SampleStore.upload_report``; None for a local one). Returns it."""
        assert self.store is not None, "only the writing rank stops"
        with self.answer_lock:
            if self.outcome is None:
                try:
                    self.store.close(complete=complete)
                    self.outcome = {"error": None, "stats": self.store.ring_stats(), "upload": self.store.upload_report}
                except Exception as e:  # reported to the client through the answer file
                    self.outcome = {"error": f"{type(e).__name__}: {e}"}
            answer = {
                "token": token,
                "writer_rank": self.writer_rank,
                **self.outcome,
                "counts": dict(self.store.counts),
            }
        layout.write_atomic(ack_path(self.out_dir, self.writer_rank), json.dumps(answer, default=str).encode())
        return answer


_ACTIVE: _SchedulerCapture | None = None


_LOCK = threading.Lock()


def _forward_hook(result: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``TpModelWorker.forward_batch_generation(self, batch, ...)``."""
    cap = _ACTIVE
    if cap is None:
        return None
    batch = kwargs.get("batch", args[1] if len(args) > 1 else None)
    if batch is not None and probe.is_prefill(batch):
        cap.on_forward(batch, result)
    return None


def _start(self: Any, out_dir: str, options: Mapping[str, Any]) -> None:
    """``Scheduler.eagle_io_capture_start`` (through ``Engine.collective_rpc``, or at startup by environment). A
    stopped capture stays active until the next start, so that requests reaching it are counted (``after_stop``)."""
    global _ACTIVE
    with _LOCK:
        if _ACTIVE is not None and _ACTIVE.writes and not _ACTIVE.stopped:
            raise InvalidArgumentError("an eagle-io capture is already running in this scheduler")
        _ACTIVE = _SchedulerCapture(self, out_dir, options)
        if _ACTIVE.writes:
            threading.Thread(target=_ACTIVE._watch_stop, name="eagle-io-capture-stop", daemon=True).start()


def _start_from_env(scheduler: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE ``Scheduler.init_all_cuda_graphs``: starts the capture named by ``EAGLE_IO_CAPTURE_DIR``."""
    out_dir = os.environ.get(ENV_CAPTURE_DIR)
    if out_dir:
        _start(scheduler, out_dir, json.loads(os.environ.get(ENV_CAPTURE_OPTIONS) or "{}"))
        logger.info("eagle-io capture started from %s=%s", ENV_CAPTURE_DIR, out_dir)
        _ignore_terminal_interrupt()
    return None


def _ignore_terminal_interrupt() -> None:
    """A capturing scheduler ignores SIGINT: a terminal's Ctrl-C reaches every process of the group, and a scheduler
    it killed would lose its open shard and never answer the stop. The process that launched the capture stops it
    through the stop file (``eagle-io generate`` interrupted: committed and left incomplete), and SGLang's own
    shutdown still ends the process. Only in the process's main thread, where a handler can be set."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def install(*, switch: str) -> list[str]:
    """Called by the plugin in scheduler processes: adds ``Scheduler.eagle_io_capture_start`` (a new attribute, so
    not a HookRegistry hook) and registers, through ``HookRegistry``, the forward hook and the start by
    environment; returns the targets registered (each resolved first: :func:`eagle_io.sglang.hooks.register`).

    Raises:
        SGLangCompatError: a target does not resolve on the installed SGLang (naming ``switch``, the setting that
            runs without the capture knowingly).
    """
    sched_cls = hooks.resolve(hooks.STARTUP_HOOK.rsplit(".", 1)[0])
    hooks.register(hooks.TP_FORWARD_HOOK, _forward_hook, "AFTER", switch=switch)
    hooks.register(hooks.STARTUP_HOOK, _start_from_env, "BEFORE", switch=switch)
    if not hasattr(sched_cls, "eagle_io_capture_start"):
        sched_cls.eagle_io_capture_start = _start
    return [hooks.TP_FORWARD_HOOK, hooks.STARTUP_HOOK]
