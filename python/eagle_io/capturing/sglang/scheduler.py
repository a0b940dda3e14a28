"""The scheduler side of the SGLang capture: runs inside each SGLang scheduler process (installed by the plugin,
:func:`eagle_io.serving.plugin.register`, unless ``EAGLE_IO_SGLANG_CAPTURE=0``). The protocol it speaks with the
client (request parameters, start by environment, stop file) is in :mod:`.protocol`.

An AFTER hook on ``TpModelWorker.forward_batch_generation`` takes, for each prefill forward, the concatenated aux
states (``LogitsProcessorOutput.hidden_states``, ``[T, k*H]``, FULL capture) and the final post-norm states
(``.last_hidden_states``, ``[T, H]``) as tensors on the device, splits them per request and hands them to the
capture core (:class:`eagle_io.capturing.store.SampleStore`), which copies them asynchronously into the capture
ring. They never go through SGLang's float-list path. Only TP rank 0 (attention-TP rank 0) of each DP rank writes,
as shard-writer rank ``dp_rank`` of ``dp_size``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

import torch

from ...errors import InvalidArgumentError
from ...serving import sglang_compat as compat
from ...serving import sglang_probe as probe
from ...store.metadata import eagle3_metadata
from ...store.schema import eagle3_schema
from ...store.writer import ShardWriter
from ..ring import RingSink
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
    read_token,
)

logger = logging.getLogger("eagle_io.serving")


class _SchedulerCapture:
    """One capture in one scheduler process."""

    def __init__(self, scheduler: Any, out_dir: str, options: Mapping[str, Any]) -> None:
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
        wanted = options.get("aux_layer_ids")
        if wanted is not None and [int(i) for i in wanted] != list(t["layers"]):
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
        self.nonfinite = str(options.get("nonfinite", "raise"))
        if self.nonfinite not in ("raise", "skip"):
            raise InvalidArgumentError(f"nonfinite must be 'raise' or 'skip', not {self.nonfinite!r}")
        self.out_dir, self.dp_rank, self.max_length = out_dir, t["dp_rank"], options.get("max_length")
        self.writes = t["tp_rank"] == 0
        self.lock = threading.Lock()
        self.counts = dict.fromkeys(("written", "already_done", "dropped", "nonfinite_skipped", "after_stop"), 0)
        self.sink: RingSink | None = None
        self.stopped = False
        self.done: set[int] = set()
        if not self.writes:
            return
        dtype = str(options.get("state_dtype", "bfloat16"))
        info = {
            "num_layers": t["num_layers"],
            "hidden_size": t["hidden_size"],
            "vocab_size": t["vocab_size"],
            "architecture": t["architecture"],
            **dict(options.get("target_info") or {}),
        }
        meta = eagle3_metadata(
            target_info=info,
            aux_layer_ids=list(t["layers"]),
            dtype=dtype,
            tokenizer_identity=options.get("tokenizer_identity"),
            max_length=options.get("max_length"),
            extra={"capture_backend": f"sglang {v}", "dp_size": t["dp_size"], **dict(options.get("metadata") or {})},
        )
        self.state_dtype = getattr(torch, dtype)
        writer = ShardWriter(
            out_dir,
            eagle3_schema(t["hidden_size"], len(t["layers"]), dtype),
            meta,
            rank=t["dp_rank"],
            world_size=t["dp_size"],
            **dict(options.get("writer_options") or {}),
        )
        self.done = set(writer.sample_ids())
        self.sink = RingSink(
            writer,
            ring_bytes=int(options.get("ring_bytes", 256 << 20)),
            timeout_s=float(options.get("timeout_s", 600.0)),
        )
        # A stop file present now asks an earlier run to stop: only another token stops this one.
        self.stale_token = read_token(os.path.join(out_dir, STOP_FILE))
        self.outcome: dict[str, Any] = {"error": None}

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
        # One host sync per prefill forward (not per request): the NaN/Inf policy needs to know before writing.
        finite = not self.writes or bool(torch.isfinite(aux).all() and torch.isfinite(final).all())
        offset = 0
        for r in reqs:
            n, params = r["extend_len"], r["custom_params"]
            lo, offset = offset, offset + n
            if SAMPLE_PARAM not in params:
                continue
            sid = params[SAMPLE_PARAM]
            if type(sid) is not int or not 0 <= sid < 1 << 64:
                raise CaptureRefusedError(f"custom_params[{SAMPLE_PARAM!r}] is {sid!r}, not an integer in [0, 2**64)")
            if r["prefix_len"] != 0 or n != len(r["input_ids"]):
                raise CaptureRefusedError(
                    f"sample {sid}: forward covers tokens {r['prefix_len']}..{r['prefix_len'] + n} of "
                    f"{len(r['input_ids'])} (chunked prefill or a cached prefix); nothing of it was written"
                )
            mask = params.get(MASK_PARAM)
            if not isinstance(mask, list) or len(mask) != n or any(m not in (0, 1) for m in mask):
                raise CaptureRefusedError(f"sample {sid}: custom_params[{MASK_PARAM!r}] is not {n} values of 0/1")
            if self.max_length is not None and n > self.max_length:
                raise CaptureRefusedError(f"sample {sid}: {n} tokens, more than this capture's max_length")
            if self.writes:
                self._store(sid, r["input_ids"], mask, aux[lo:offset], final[lo:offset], finite, params)

    def _store(self, sid: int, ids: list[int], mask: list[int], aux, final, finite: bool, params) -> None:
        if not finite:
            bad = ~(torch.isfinite(aux).all(dim=-1) & torch.isfinite(final).all(dim=-1))
            if bool(bad.any()):
                if self.nonfinite == "raise":
                    row = int(bad.nonzero()[0, 0])
                    raise CaptureRefusedError(f"sample {sid}: NaN/Inf in captured states at token row {row}")
                self.counts["nonfinite_skipped"] += 1
                return
        tensors = {
            "input_ids": torch.tensor(ids, dtype=torch.int64),
            "loss_mask": torch.tensor(mask, dtype=torch.uint8),
            "aux_hidden_states": aux.to(self.state_dtype),
            "hidden_states": final.to(self.state_dtype),
        }
        with self.lock:
            if self.stopped:
                self.counts["after_stop"] += 1
                logger.warning("eagle-io capture: sample %d arrived after the capture stopped; not written", sid)
            elif sid in self.done:
                self.counts["already_done"] += 1
            elif self.sink.put(sid, tensors, key=str(params.get(KEY_PARAM, ""))):
                self.done.add(sid)
                self.counts["written"] += 1
            else:
                self.counts["dropped"] += 1

    def _watch_stop(self) -> None:
        """Stops on the first new stop token, then answers every later token (a retried or repeated stop) with
        the same outcome, until another capture starts in this process."""
        path, answered = os.path.join(self.out_dir, STOP_FILE), self.stale_token
        while _ACTIVE is self:
            time.sleep(POLL_S)
            token = read_token(path)
            if token is not None and token != answered:
                self.stop(token)
                answered = token

    def stop(self, token: Any) -> dict[str, Any]:
        """Drains the ring and commits the manifest (the first time), then writes this rank's answer for
        ``token``: the outcome, the counts so far and the writer's statistics. Returns it."""
        with self.lock:
            sink, self.sink, self.stopped = self.sink, None, True
            if sink is not None:
                try:
                    sink.close()
                    self.outcome = {"error": None, "stats": sink.stats()}
                except Exception as e:  # reported to the client through the answer file
                    self.outcome = {"error": f"{type(e).__name__}: {e}"}
            answer = {"token": token, "dp_rank": self.dp_rank, **self.outcome, "counts": dict(self.counts)}
        tmp = ack_path(self.out_dir, self.dp_rank) + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(answer, f, default=str)
        os.replace(tmp, ack_path(self.out_dir, self.dp_rank))
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


def _start(self: Any, out_dir: str, **options: Any) -> None:
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
        _start(scheduler, out_dir, **json.loads(os.environ.get(ENV_CAPTURE_OPTIONS) or "{}"))
        logger.info("eagle-io capture started from %s=%s", ENV_CAPTURE_DIR, out_dir)
    return None


def install() -> None:
    """Called by the plugin in scheduler processes: adds ``Scheduler.eagle_io_capture_start`` (a new attribute, so
    not a HookRegistry hook) and registers, through ``HookRegistry``, the forward hook and the start by
    environment."""
    import pkgutil

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    sched_cls = pkgutil.resolve_name(compat.STARTUP_HOOK.rsplit(".", 1)[0])
    if not hasattr(sched_cls, "eagle_io_capture_start"):
        sched_cls.eagle_io_capture_start = _start
    HookRegistry.register(compat.TP_FORWARD_HOOK, _forward_hook, HookType.AFTER)
    HookRegistry.register(compat.STARTUP_HOOK, _start_from_env, HookType.BEFORE)
