"""EAGLE-3 training-data capture inside SGLang's scheduler processes (the SGLang counterpart of the HF path).

Scheduler side (installed by the plugin, :func:`eagle_io.serving.plugin.register`, unless
``EAGLE_IO_SGLANG_CAPTURE=0``): an AFTER hook on ``TpModelWorker.forward_batch_generation`` takes, for each
prefill forward, the concatenated aux states (``LogitsProcessorOutput.hidden_states``, ``[T, k*H]``, FULL capture)
and the final post-norm states (``.last_hidden_states``, ``[T, H]``) as tensors on the device, splits them per
request and puts them in eagle-io's capture ring (:class:`eagle_io.ring.RingSink`, asynchronous copies), which
feeds the shard writer. They never go through SGLang's float-list path. Only TP rank 0 (attention-TP rank 0) of
each DP rank writes, as shard-writer rank ``dp_rank`` of ``dp_size`` (``manifest.rNNNNN.json`` when ``dp_size > 1``;
``eagle-io merge`` joins them).

A request is a sample when its ``sampling_params.custom_params`` hold ``eagle_io_sample_id`` (int) and
``eagle_io_loss_mask`` (0/1 per input token; optional ``eagle_io_key``): the mapping travels with the request, so it
works through ``Engine.generate`` and a server's ``/generate`` alike, on any DP rank. Other traffic is ignored.

Starting, either:

* ``Engine.collective_rpc("eagle_io_capture_start", out_dir=..., **options)`` on an existing engine (a method the
  plugin adds to ``Scheduler``; SGLang 0.5.23's ``collective_rpc`` reaches the schedulers only when ``dp_size`` is
  1), which is what :class:`SGLangCaptureSession` does; or
* by environment, for any launch (an ``Engine``, ``python -m sglang.launch_server``, any ``dp_size``/``tp_size``):
  ``EAGLE_IO_CAPTURE_DIR=<out_dir>`` and optionally ``EAGLE_IO_CAPTURE_OPTIONS=<JSON of the same options>``; each
  scheduler starts its capture at startup (before CUDA graphs). ``eagle-io generate --backend sglang`` does this.

Stopping (drain the ring, commit the last shard, mark the manifest complete) goes through a file, because SGLang
kills its scheduler processes with SIGKILL on shutdown and ``collective_rpc`` does not reach DP ranks: writing
``<out_dir>/.eagle-io-stop`` (a JSON ``{"token": ...}``) makes every writing scheduler close and answer in
``<out_dir>/.eagle-io-stop.rNNNNN.json`` (``token``, ``error``, ``counts``, ``stats``).
:meth:`SGLangCaptureSession.close` / :func:`stop_capture` do both sides.

The engine must run SGLang's capture-only mode (0.5.23: ``enable_return_aux_hidden_states=True,
speculative_algorithm="EAGLE3"``; no draft is loaded), with chunked prefill (``chunked_prefill_size=-1``) and the
radix cache (``disable_radix_cache=True``) off: a request split over forwards or with a cached prefix is refused
(its stored length would differ from its input length).
"""

from __future__ import annotations

import glob
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..errors import InvalidArgumentError, StorageError
from ..manifest import read_manifest
from ..metadata import eagle3_metadata
from ..ring import RingSink
from ..schema import eagle3_schema
from ..writer import ShardWriter
from . import sglang_compat as compat

__all__ = [
    "ENV_CAPTURE",
    "ENV_CAPTURE_DIR",
    "ENV_CAPTURE_OPTIONS",
    "KEY_PARAM",
    "MASK_PARAM",
    "SAMPLE_PARAM",
    "STOP_FILE",
    "CaptureRefusedError",
    "SGLangCaptureSession",
    "committed_ids",
    "is_sglang_engine",
    "sample_params",
    "stop_capture",
]

logger = logging.getLogger("eagle_io.serving")

ENV_CAPTURE = "EAGLE_IO_SGLANG_CAPTURE"
ENV_CAPTURE_DIR = "EAGLE_IO_CAPTURE_DIR"
ENV_CAPTURE_OPTIONS = "EAGLE_IO_CAPTURE_OPTIONS"
SAMPLE_PARAM, MASK_PARAM, KEY_PARAM = "eagle_io_sample_id", "eagle_io_loss_mask", "eagle_io_key"
STOP_FILE = ".eagle-io-stop"
_POLL_S = 0.2


class CaptureRefusedError(InvalidArgumentError):
    """A request the SGLang capture cannot store exactly (chunked, prefix-cached, or without its loss mask)."""


def sample_params(sample: Any) -> dict[str, Any]:
    """The ``custom_params`` that make a request the sample ``sample`` (``index``, ``loss_mask [L]``, optional
    ``id`` stored as the key); put them in the request's ``sampling_params``."""
    params: dict[str, Any] = {SAMPLE_PARAM: int(sample.index), MASK_PARAM: [int(v) for v in sample.loss_mask.tolist()]}
    if getattr(sample, "id", None):
        params[KEY_PARAM] = str(sample.id)
    return params


def _read_token(stop_file: str) -> Any:
    """The token of a stop file, or None when there is none (or it is being written)."""
    try:
        with open(stop_file, encoding="utf-8") as f:
            return json.load(f).get("token")
    except (OSError, ValueError, AttributeError):
        return None


def _ack_path(out_dir: str, dp_rank: int) -> str:
    return os.path.join(out_dir, f"{STOP_FILE}.r{dp_rank:05d}.json")


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
        self.stale_token = _read_token(os.path.join(out_dir, STOP_FILE))
        self.outcome: dict[str, Any] = {"error": None}

    def on_forward(self, batch: Any, result: Any) -> None:
        reqs = compat.batch_requests(batch)
        if not any(SAMPLE_PARAM in r["custom_params"] for r in reqs):
            return
        aux, final = compat.forward_states(result)
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
            time.sleep(_POLL_S)
            token = _read_token(path)
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
        tmp = _ack_path(self.out_dir, self.dp_rank) + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(answer, f, default=str)
        os.replace(tmp, _ack_path(self.out_dir, self.dp_rank))
        return answer


_ACTIVE: _SchedulerCapture | None = None
_LOCK = threading.Lock()


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


# ---------------------------------------------------------------------------------------------- engine side


def _manifests(out_dir: str, dp_size: int) -> list[str]:
    if dp_size == 1:
        return [os.path.join(out_dir, "manifest.json")]
    return [os.path.join(out_dir, f"manifest.r{r:05d}.json") for r in range(dp_size)]


def committed_ids(out_dir: str | os.PathLike[str], dp_size: int = 1) -> set[int]:
    """Sample ids the writers of a capture into ``out_dir`` have committed (all DP ranks)."""
    from ..reader import Dataset

    ids: set[int] = set()
    for m in _manifests(os.fspath(out_dir), dp_size):
        if os.path.exists(m):
            ds = Dataset(m, threads=1)
            ids.update(ds.entry(p).sample_id for p in range(len(ds)))
    return ids


def stop_capture(out_dir: str | os.PathLike[str], dp_size: int = 1, timeout_s: float = 600.0) -> list[dict[str, Any]]:
    """Asks every writing scheduler of the capture into ``out_dir`` to drain, commit and answer (see the module
    docstring); waits for the ``dp_size`` answers and returns them, in DP rank order.

    Raises:
        StorageError: a writer failed while closing (the answer's error, naming the rank).
        TimeoutError: not every rank answered within ``timeout_s`` (a scheduler died, or no capture runs).
    """
    out_dir = os.fspath(out_dir)
    token = uuid.uuid4().hex
    for old in glob.glob(os.path.join(glob.escape(out_dir), f"{STOP_FILE}.r*.json")):
        os.remove(old)
    stop = os.path.join(out_dir, STOP_FILE)
    with open(stop + ".tmp", "w", encoding="utf-8") as f:
        json.dump({"token": token}, f)
    os.replace(stop + ".tmp", stop)
    deadline = time.monotonic() + timeout_s
    answers: dict[int, dict[str, Any]] = {}
    try:
        while len(answers) < dp_size:
            for r in range(dp_size):
                try:
                    with open(_ack_path(out_dir, r), encoding="utf-8") as f:
                        a = json.load(f)
                except (OSError, ValueError):
                    continue
                if a.get("token") == token:
                    answers[r] = a
            if len(answers) < dp_size:
                if time.monotonic() > deadline:
                    missing = [r for r in range(dp_size) if r not in answers]
                    raise TimeoutError(f"{out_dir}: DP ranks {missing} did not stop their capture in {timeout_s:.0f} s")
                time.sleep(_POLL_S)
    finally:
        os.remove(stop)
        for r in answers:
            os.remove(_ack_path(out_dir, r))
    bad = [f"DP rank {r}: {a['error']}" for r, a in sorted(answers.items()) if a.get("error")]
    if bad:
        raise StorageError(f"{out_dir}: the capture failed while closing: " + "; ".join(bad))
    return [answers[r] for r in range(dp_size)]


class SGLangCaptureSession:
    """A capture through an ``sglang.Engine``, with :class:`eagle_io.CaptureSession`'s interface (``submit``,
    ``close``, context manager, ``done``, ``counts``, ``stats``, ``manifest``), so ``eagle_io.capture`` can hand it
    out for an engine. ``aux_layer_ids`` are the captured layers, from the writers' manifests.

    With ``started=False`` (default) it starts the scheduler-side capture through
    ``Engine.collective_rpc("eagle_io_capture_start", ...)`` (``dp_size`` 1 only); with ``started=True`` it attaches
    to a capture the engine started at launch by environment (``EAGLE_IO_CAPTURE_DIR``; the options then come from
    ``EAGLE_IO_CAPTURE_OPTIONS``, not from these arguments). Each :meth:`submit` runs one prefill per sample
    (``max_new_tokens=1``) whose ``custom_params`` carry the sample id and loss mask; :meth:`close` stops every
    writing scheduler and waits for their manifests (:func:`stop_capture`).

    Args:
        engine: an ``sglang.Engine`` in capture-only mode.
        aux_layer_ids: when given, must equal the layers the target captures (SGLang sets them at launch).
        nonfinite: ``"raise"`` or ``"skip"`` (counted) for samples with NaN/Inf states, as :func:`eagle_io.capture`.
        resume: continue the dataset in ``out_dir``: ``done`` lists what is committed, :meth:`submit` skips it.
        writer_options: :class:`eagle_io.ShardWriter` options (``shard_bytes``, ``threads``...).

    Raises:
        InvalidArgumentError: ``started=False`` with ``dp_size > 1``; or, from the schedulers, a launch that is not
            capture-only mode, chunked prefill or the radix cache on, other aux layers than ``aux_layer_ids``.
    """

    def __init__(
        self,
        engine: Any,
        out_dir: str | os.PathLike[str],
        *,
        started: bool = False,
        state_dtype: str = "bfloat16",
        metadata: Mapping[str, Any] | None = None,
        target_info: Mapping[str, Any] | None = None,
        tokenizer_identity: Mapping[str, Any] | None = None,
        aux_layer_ids: Sequence[int] | None = None,
        max_length: int | None = None,
        nonfinite: str = "raise",
        ring_bytes: int = 256 << 20,
        timeout_s: float = 600.0,
        **writer_options: Any,
    ) -> None:
        self.engine = engine
        self.out_dir = os.fspath(out_dir)
        self.dp_size = int(getattr(engine.server_args, "dp_size", 1) or 1)
        self.manifest_path = _manifests(self.out_dir, self.dp_size)[0] if self.dp_size == 1 else self.out_dir
        self.counts = dict.fromkeys(("submitted", "already_done"), 0)
        self.answers: list[dict[str, Any]] = []
        self.manifest: dict[str, Any] | None = None
        if not started:
            if self.dp_size > 1:
                raise InvalidArgumentError(
                    f"dp_size={self.dp_size}: SGLang's collective_rpc does not reach DP schedulers; start the capture "
                    f"at launch by environment ({ENV_CAPTURE_DIR}, {ENV_CAPTURE_OPTIONS}) and pass started=True"
                )
            engine.collective_rpc(
                "eagle_io_capture_start",
                out_dir=self.out_dir,
                **capture_options(
                    state_dtype=state_dtype,
                    metadata=metadata,
                    target_info=target_info,
                    tokenizer_identity=tokenizer_identity,
                    aux_layer_ids=aux_layer_ids,
                    max_length=max_length,
                    nonfinite=nonfinite,
                    ring_bytes=ring_bytes,
                    timeout_s=timeout_s,
                    writer_options=writer_options,
                ),
            )
        self.done = committed_ids(self.out_dir, self.dp_size)
        first = _manifests(self.out_dir, self.dp_size)[0]
        self.aux_layer_ids = list(read_manifest(first)["metadata"]["aux_layer_ids"]) if os.path.exists(first) else []

    def submit(self, samples: Sequence[Any]) -> None:
        """Each sample has ``index`` (sample id), ``input_ids [L]``, ``loss_mask [L]`` and optionally ``id`` (the
        key), e.g. :class:`eagle_io.data.TokenizedSample`. Already committed samples are skipped and counted.

        Raises:
            InvalidArgumentError: the session is closed (the schedulers would count the samples, not write them).
        """
        if self.manifest is not None:
            raise InvalidArgumentError(f"the SGLang capture into {self.out_dir} is closed; start a new session")
        self.counts["submitted"] += len(samples)
        todo = [s for s in samples if int(s.index) not in self.done]
        self.counts["already_done"] += len(samples) - len(todo)
        if not todo:
            return
        self.engine.generate(
            input_ids=[[int(t) for t in s.input_ids.tolist()] for s in todo],
            sampling_params=[{"max_new_tokens": 1, "temperature": 0, "custom_params": sample_params(s)} for s in todo],
        )
        self.done.update(int(s.index) for s in todo)

    def stats(self) -> dict[str, Any]:
        """``counts``; after :meth:`close`, plus the writers' and rings' counters over the DP ranks: summed, except
        sizes and times per rank (``ring_capacity``, ``ring_high_water_bytes``, ``elapsed_seconds``: the largest);
        the schedulers' ``written``, ``dropped``, ``nonfinite_skipped``, ``already_done``, ``after_stop`` as
        ``scheduler_*``."""
        out: dict[str, Any] = dict(self.counts)
        per_rank = ("ring_capacity", "ring_high_water_bytes", "elapsed_seconds")
        for a in self.answers:
            for k, v in {**a.get("stats", {}), **{f"scheduler_{k}": v for k, v in a["counts"].items()}}.items():
                out[k] = max(out.get(k, 0), v) if k in per_rank else out.get(k, 0) + v
        return out

    def close(self, timeout_s: float = 600.0) -> dict[str, Any]:
        """Stops the capture in every writing scheduler (waiting up to ``timeout_s`` for them to commit); returns
        ``manifest.json`` (``{}`` when several DP ranks each wrote their ``manifest.rNNNNN.json``)."""
        if self.manifest is None:
            self.answers = stop_capture(self.out_dir, self.dp_size, timeout_s)
            path = os.path.join(self.out_dir, "manifest.json")
            self.manifest = read_manifest(path) if self.dp_size == 1 else {}
        return self.manifest

    def __enter__(self) -> SGLangCaptureSession:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            self.close()
            return
        try:  # commit what the schedulers hold, without hiding the error (a dead engine never answers)
            self.close(timeout_s=120.0)
        except Exception as e:
            logger.error("eagle-io: could not stop the SGLang capture after %s: %s", exc_type.__name__, e)


def capture_options(*, writer_options: Mapping[str, Any] | None = None, **options: Any) -> dict[str, Any]:
    """The scheduler-side options (``eagle_io_capture_start``'s keyword arguments, ``EAGLE_IO_CAPTURE_OPTIONS``'s
    JSON): ``state_dtype``, ``metadata``, ``target_info``, ``tokenizer_identity``, ``aux_layer_ids``,
    ``max_length``, ``nonfinite``, ``ring_bytes``, ``timeout_s``, ``writer_options``; None values are left out."""
    out = {k: v for k, v in options.items() if v is not None}
    if "state_dtype" in out:
        out["state_dtype"] = str(out["state_dtype"]).removeprefix("torch.")
    for k in ("metadata", "target_info", "tokenizer_identity"):
        if k in out:
            out[k] = dict(out[k])
    out["writer_options"] = dict(writer_options or {})
    return out


def is_sglang_engine(obj: Any) -> bool:
    """Whether ``obj`` is an ``sglang.Engine`` (checked by module, without importing SGLang)."""
    return any(c.__module__.startswith("sglang.") and c.__name__ == "Engine" for c in type(obj).__mro__)
