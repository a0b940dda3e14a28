"""EAGLE-3 training-data capture inside SGLang's scheduler process (the SGLang counterpart of the HF path).

Scheduler side (installed by the plugin, :func:`eagle_io.serving.plugin.register`, unless
``EAGLE_IO_SGLANG_CAPTURE=0``): an AFTER hook on ``TpModelWorker.forward_batch_generation`` takes, for each
prefill forward, the concatenated aux states (``LogitsProcessorOutput.hidden_states``, ``[T, k*H]``, FULL capture)
and the final post-norm states (``.last_hidden_states``, ``[T, H]``) as tensors on the device, splits them per
request and puts them in eagle-io's capture ring (:class:`eagle_io.ring.RingSink`, asynchronous copies), which
feeds the shard writer. They never go through SGLang's float-list path. Only TP rank 0 (attention-TP rank 0) of
each DP rank writes, as shard-writer rank ``dp_rank`` of ``dp_size``.

Start/stop go through ``Engine.collective_rpc`` (``Scheduler.eagle_io_capture_start`` / ``..._expect`` /
``..._stop``, methods the plugin adds to SGLang's ``Scheduler``; ``collective_rpc`` calls
``getattr(scheduler, method)(**kwargs)`` in every scheduler process), so an existing engine can be used.

The engine must run SGLang's capture-only mode (0.5.23: ``enable_return_aux_hidden_states=True,
speculative_algorithm="EAGLE3"``; no draft is loaded), with chunked prefill (``chunked_prefill_size=-1``) and the
radix cache (``disable_radix_cache=True``) off: a request split over forwards or with a cached prefix is refused
(its stored length would differ from its input length).

Requests are mapped to samples by their ``rid``: ``eagleio-<sample id>``; other traffic is ignored.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from ..errors import InvalidArgumentError
from ..manifest import read_manifest
from ..metadata import eagle3_metadata
from ..ring import RingSink
from ..schema import eagle3_schema
from ..writer import ShardWriter
from . import sglang_compat as compat

__all__ = [
    "ENV_CAPTURE",
    "RID_PREFIX",
    "CaptureRefusedError",
    "SGLangCaptureSession",
    "capture_engine",
    "is_sglang_engine",
    "rid_for",
]

logger = logging.getLogger("eagle_io.serving")

ENV_CAPTURE = "EAGLE_IO_SGLANG_CAPTURE"
RID_PREFIX = "eagleio-"


class CaptureRefusedError(InvalidArgumentError):
    """A request the SGLang capture cannot store exactly (chunked, prefix-cached, or unknown loss mask)."""


def rid_for(sample_id: int) -> str:
    """The request id that maps a request to ``sample_id``."""
    return f"{RID_PREFIX}{int(sample_id)}"


# ---------------------------------------------------------------------------------------------- scheduler side


class _SchedulerCapture:
    """One capture in one scheduler process."""

    def __init__(self, scheduler: Any, out_dir: str, options: Mapping[str, Any]) -> None:
        v = compat.sglang_version()
        if not compat.capture_supported(v):
            raise InvalidArgumentError(
                f"eagle-io's SGLang capture needs SGLang >= {compat.CAPTURE_MIN_SGLANG} (capture-only mode), found {v}"
            )
        t = compat.capture_target(scheduler)
        if not t["capture_enabled"] or not t["layers"]:
            raise InvalidArgumentError(
                "the target captures no aux states: launch SGLang in capture-only mode "
                "(enable_return_aux_hidden_states=True, speculative_algorithm='EAGLE3')"
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
        self.writes = t["tp_rank"] == 0
        self.masks: dict[int, torch.Tensor] = {}
        self.lock = threading.Lock()
        self.counts = {"written": 0, "ignored": 0, "dropped": 0}
        self.sink: RingSink | None = None
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
            extra={"capture_backend": f"sglang {compat.sglang_version()}", **dict(options.get("metadata") or {})},
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
        self.sink = RingSink(
            writer,
            ring_bytes=int(options.get("ring_bytes", 256 << 20)),
            timeout_s=float(options.get("timeout_s", 600.0)),
        )

    def expect(self, masks: Mapping[int, Sequence[int]]) -> None:
        with self.lock:
            for sid, m in masks.items():
                self.masks[int(sid)] = torch.tensor(list(m), dtype=torch.uint8)

    def on_forward(self, batch: Any, result: Any) -> None:
        reqs = compat.batch_requests(batch)
        mine = [r for r in reqs if r["rid"].startswith(RID_PREFIX)]
        if not mine:
            return
        aux, final = compat.forward_states(result)
        if aux is None or final is None:
            raise CaptureRefusedError(
                "this forward carries no aux/final states (FULL capture is off): launch SGLang in capture-only mode"
            )
        offset = 0
        for r in reqs:
            n = r["extend_len"]
            lo, offset = offset, offset + n
            if not r["rid"].startswith(RID_PREFIX):
                continue
            sid = int(r["rid"][len(RID_PREFIX) :])
            if r["prefix_len"] != 0 or n != len(r["input_ids"]):
                raise CaptureRefusedError(
                    f"sample {sid}: forward covers tokens {r['prefix_len']}..{r['prefix_len'] + n} of "
                    f"{len(r['input_ids'])} (chunked prefill or a cached prefix); nothing of it was written"
                )
            if not self.writes or self.sink is None:
                continue
            with self.lock:
                mask = self.masks.pop(sid, None)
            if mask is None or mask.numel() != n:
                raise CaptureRefusedError(f"sample {sid}: no loss mask of {n} tokens was announced for it")
            tensors = {
                "input_ids": torch.tensor(r["input_ids"], dtype=torch.int64),
                "loss_mask": mask,
                "aux_hidden_states": aux[lo:offset].to(self.state_dtype),
                "hidden_states": final[lo:offset].to(self.state_dtype),
            }
            if self.sink.put(sid, tensors, key=""):
                self.counts["written"] += 1
            else:
                self.counts["dropped"] += 1
        if offset != aux.shape[0]:
            raise CaptureRefusedError(f"forward has {aux.shape[0]} state rows for {offset} extend tokens")

    def close(self) -> dict[str, Any] | None:
        return self.sink.close() if self.sink is not None else None


_ACTIVE: _SchedulerCapture | None = None


def _forward_hook(result: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``TpModelWorker.forward_batch_generation(self, batch, ...)``."""
    cap = _ACTIVE
    if cap is None:
        return None
    batch = kwargs.get("batch", args[1] if len(args) > 1 else None)
    if batch is not None and compat.is_prefill(batch):
        cap.on_forward(batch, result)
    return None


def _start(self: Any, out_dir: str, **options: Any) -> None:
    """``Scheduler.eagle_io_capture_start`` (through ``Engine.collective_rpc``)."""
    global _ACTIVE
    if _ACTIVE is not None:
        raise InvalidArgumentError("an eagle-io capture is already running in this scheduler")
    _ACTIVE = _SchedulerCapture(self, out_dir, options)


def _expect(self: Any, masks: Mapping[int, Sequence[int]]) -> None:
    """``Scheduler.eagle_io_capture_expect``: loss masks of the samples about to be submitted."""
    if _ACTIVE is None:
        raise InvalidArgumentError("no eagle-io capture is running")
    _ACTIVE.expect(masks)


def _stop(self: Any) -> None:
    """``Scheduler.eagle_io_capture_stop``: drains the ring and commits the manifest."""
    global _ACTIVE
    cap, _ACTIVE = _ACTIVE, None
    if cap is not None:
        cap.close()


SCHEDULER_METHODS = {
    "eagle_io_capture_start": _start,
    "eagle_io_capture_expect": _expect,
    "eagle_io_capture_stop": _stop,
}


def install() -> None:
    """Called by the plugin in scheduler processes: adds the RPC methods to ``Scheduler`` (new attributes, so not
    a HookRegistry hook) and registers the forward hook through ``HookRegistry``."""
    import pkgutil

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    sched_cls = pkgutil.resolve_name(compat.STARTUP_HOOK.rsplit(".", 1)[0])
    for name, fn in SCHEDULER_METHODS.items():
        if not hasattr(sched_cls, name):
            setattr(sched_cls, name, fn)
    HookRegistry.register(compat.TP_FORWARD_HOOK, _forward_hook, HookType.AFTER)


# ---------------------------------------------------------------------------------------------- engine side


class SGLangCaptureSession:
    """A capture through an ``sglang.Engine``, with :class:`eagle_io.CaptureSession`'s interface (``submit``,
    ``close``, context manager, ``counts``, ``manifest``), so ``eagle_io.capture`` can hand it out for an engine.

    Starts the scheduler-side capture (``Engine.collective_rpc("eagle_io_capture_start", ...)``); each
    :meth:`submit` announces the loss masks and runs one prefill per sample (``max_new_tokens=1``,
    ``rid = eagleio-<index>``); :meth:`close` drains the rings and commits the manifests.
    """

    def __init__(
        self,
        engine: Any,
        out_dir: str | os.PathLike[str],
        *,
        state_dtype: str = "bfloat16",
        metadata: Mapping[str, Any] | None = None,
        target_info: Mapping[str, Any] | None = None,
        tokenizer_identity: Mapping[str, Any] | None = None,
        max_length: int | None = None,
        ring_bytes: int = 256 << 20,
        **writer_options: Any,
    ) -> None:
        self.engine = engine
        self.out_dir = os.fspath(out_dir)
        self.counts = {"submitted": 0}
        self.manifest: dict[str, Any] | None = None
        engine.collective_rpc(
            "eagle_io_capture_start",
            out_dir=self.out_dir,
            state_dtype=str(state_dtype).removeprefix("torch."),
            metadata=dict(metadata or {}),
            target_info=dict(target_info or {}),
            tokenizer_identity=dict(tokenizer_identity) if tokenizer_identity else None,
            max_length=max_length,
            ring_bytes=ring_bytes,
            writer_options=writer_options,
        )

    def submit(self, samples: Sequence[Any]) -> None:
        """Each sample has ``index`` (sample id), ``input_ids [L]`` and ``loss_mask [L]``
        (e.g. :class:`eagle_io.data.TokenizedSample`)."""
        if not samples:
            return
        self.engine.collective_rpc(
            "eagle_io_capture_expect",
            masks={int(s.index): [int(v) for v in s.loss_mask.tolist()] for s in samples},
        )
        self.engine.generate(
            input_ids=[[int(t) for t in s.input_ids.tolist()] for s in samples],
            rid=[rid_for(s.index) for s in samples],
            sampling_params={"max_new_tokens": 1, "temperature": 0},
        )
        self.counts["submitted"] += len(samples)

    def close(self) -> dict[str, Any]:
        """Stops the capture in every scheduler; returns ``manifest.json`` (``{}`` when several DP ranks each
        wrote their ``manifest.rNNNNN.json``)."""
        if self.manifest is None:
            self.engine.collective_rpc("eagle_io_capture_stop")
            path = os.path.join(self.out_dir, "manifest.json")
            self.manifest = {}
            if os.path.exists(path):
                self.manifest = read_manifest(path)
        return self.manifest

    def __enter__(self) -> SGLangCaptureSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def is_sglang_engine(obj: Any) -> bool:
    """Whether ``obj`` is an ``sglang.Engine`` (checked by module, without importing SGLang)."""
    return any(c.__module__.startswith("sglang.") and c.__name__ == "Engine" for c in type(obj).__mro__)


def capture_engine(
    engine: Any, out_dir: str | os.PathLike[str], samples: Iterable[Any], *, batch: int = 16, **options: Any
) -> dict[str, Any]:
    """Captures all ``samples`` through ``engine`` in batches of ``batch``; returns the committed manifest.
    ``options`` as :class:`SGLangCaptureSession`."""
    with SGLangCaptureSession(engine, out_dir, **options) as session:
        chunk: list[Any] = []
        for s in samples:
            chunk.append(s)
            if len(chunk) == batch:
                session.submit(chunk)
                chunk = []
        session.submit(chunk)
    return session.manifest or {}
