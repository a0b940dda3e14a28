"""The scheduler side of the SGLang capture: runs inside each SGLang scheduler process (installed by the plugin,
:func:`eagle_io.sglang_plugin.register`, unless ``EAGLE_IO_SGLANG_CAPTURE=0``). The protocol it speaks with the
client (request parameters, start and stop over HTTP or a start by environment, status) is in :mod:`.protocol`.

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

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Mapping
from typing import Any

from ... import defaults
from ..._native import __version__
from ...errors import InvalidArgumentError, SchemaError
from ...sglang import compat, hooks, probe
from ..options import CaptureOptions
from ..store import ForwardSample, SampleStore, check_sample
from .assembly import RequestStates
from .handoff import Finished, Handoff
from .live import LIVE_ID_BASE, Admission, LivePolicy
from .protocol import (
    ENV_CAPTURE_DIR,
    ENV_CAPTURE_LIVE,
    ENV_CAPTURE_OPTIONS,
    KEY_PARAM,
    MASK_PARAM,
    SAMPLE_PARAM,
    STATUS_KEY,
    CaptureRefusedError,
    parse_control,
)

logger = logging.getLogger("eagle_io.serving")


REQUEST_COUNTS = ("incomplete", "refused", "aborted", "unfinished_at_stop", "queue_full", "never_started")
"""The scheduler's own counters, beside the store's (:data:`eagle_io.capturing.store.COUNTS`) and a live capture's
admission counters (:data:`eagle_io.capturing.sglang.live.LIVE_COUNTS`): sampled requests not stored because their
states were not all captured (a prefix from the radix cache, a capture started mid-request); refused as declared (a
bad loss mask, tokens past ``max_length``: the last reason is in the status' ``refusal``); aborted; still running
when the capture stopped; dropped because the hand-off queue was full (a live capture only); sampled but never in a
forward within :data:`eagle_io.defaults.LIVE_ADMIT_TTL_S` (aborted while queued: SGLang's abort of a waiting
request passes no hook of the capture's)."""


class _SchedulerCapture:
    """One capture in one scheduler process."""

    def __init__(
        self,
        scheduler: Any,
        out_dir: str,
        options: Mapping[str, Any],
        token: str | None = None,
        writer_offset: int = 0,
        all_writers: int | None = None,
        live: Mapping[str, Any] | None = None,
    ) -> None:
        """``writer_offset`` / ``all_writers``: this server's first shard-writer rank and the writers of every server
        of the capture (a client driving several servers numbers them one after the other); default: this server's
        own data-parallel layout. ``live``: a :class:`~.live.LivePolicy` as JSON, for a capture of served traffic
        (its samples may be dropped, never waited for); None: a client-driven capture of sample requests."""
        opts = CaptureOptions.from_dict(options)  # the client's options, JSON through HTTP or the environment
        opts.refuse_writer_ranks()
        v = compat.sglang_version()
        if not compat.capture_supported(v):
            raise InvalidArgumentError(
                f"eagle-io's SGLang capture needs SGLang >= {compat.CAPTURE_MIN_SGLANG} (capture-only mode), found {v}"
            )
        self.live = LivePolicy.from_dict(live) if live is not None else None
        t = probe.capture_target(scheduler)
        algo = t["speculative_algorithm"]
        if algo not in (None, "EAGLE3"):
            raise InvalidArgumentError(
                f"this server runs --speculative-algorithm {algo}: its target captures no aux hidden states for an "
                "EAGLE-3 draft; launch it with --speculative-algorithm EAGLE3 (with its EAGLE-3 draft, or "
                "--enable-return-aux-hidden-states and no draft)"
            )
        if not t["capture_enabled"] or not t["layers"]:
            raise InvalidArgumentError(
                "the target captures no aux states: launch SGLang with --speculative-algorithm EAGLE3 (an EAGLE-3 "
                "draft, or capture-only mode: --enable-return-aux-hidden-states and no draft)"
            )
        outer, _ = probe.draft_workers(scheduler)
        if outer is not None and not _verify_hooked(outer):
            raise InvalidArgumentError(
                f"this server's speculative worker {type(outer).__name__} verifies with its own code, which this "
                f"capture does not read (it reads {hooks.VERIFY_HOOK})"
            )
        wanted = opts.aux_layer_ids
        if wanted is not None and list(wanted) != list(t["layers"]):
            raise InvalidArgumentError(
                f"aux_layer_ids {list(wanted)} were asked for, but this SGLang target captures {list(t['layers'])} "
                "(eagle-io ids: input of layer i); set them at launch (--return-aux-hidden-state-layer-ids)"
            )
        self.writer_rank = writer_offset + t["writer_rank"]
        writers = all_writers or t["writers"]
        self.url, self.token, self.error = out_dir, token, None
        self.max_length = opts.max_length
        self.vocab_size = int(t["vocab_size"])
        self.writes = t["writes"]
        self.store: SampleStore | None = None
        self.outcome: dict[str, Any] | None = None
        self.requests = RequestStates()
        self.admission = Admission(self.live, self.max_length)
        # no forward yet: rid -> (id, params, since, the Req)
        self.admitted: dict[str, tuple[int, dict[str, Any], float, Any]] = {}
        self.request_counts = dict.fromkeys(REQUEST_COUNTS, 0)
        self.refusal: str | None = None
        self.answer_lock = threading.Lock()
        self.handoff: Handoff | None = None
        self.ready: Any = None  # the CUDA event after the latest clone (None on a CPU)
        if not self.writes:
            return
        info = {
            "num_layers": t["num_layers"],
            "hidden_size": t["hidden_size"],
            "vocab_size": t["vocab_size"],
            "architecture": t["architecture"],
            **opts.target_info,
        }
        launch = {"capture_backend": f"sglang {v}", "dp_size": t["dp_size"], "attn_dp_size": t["attn_dp_size"],
                  "speculative_algorithm": algo}  # fmt: skip
        if self.live is not None:
            launch["live_capture"] = self.live.to_dict()
        opts = opts.replace(
            metadata={**launch, **opts.metadata},
            writer_options={**opts.writer_options, "rank": self.writer_rank, "world_size": writers},
        )
        if self.live is not None:
            opts = opts.replace(drop_when_full=True)  # serving never waits for a full ring
        self.store = SampleStore.create(out_dir, opts, aux_layer_ids=list(t["layers"]), target_info=info)
        base = LIVE_ID_BASE + self.writer_rank * 2**40
        self.next_live_id = max([i + 1 for i in self.store.done if base <= i < base + 2**40] or [base])
        self.handoff = Handoff(self.store, slots=defaults.HANDOFF_SLOTS, drop_when_full=self.live is not None,
                               stored=self.admission.stored, fail=self.fail)  # fmt: skip

    def _refuse(self, sid: Any, why: str) -> None:
        """Counts a sampled request this capture cannot store (serving goes on: a forward never fails for it)."""
        self.request_counts["refused"] += 1
        self.refusal = f"sample {sid}: {why}; nothing of it was written"
        logger.error("eagle-io capture: %s", self.refusal)

    def on_request(self, req: Any) -> None:
        """A new request: decides whether it is sampled (:class:`.live.Admission`); a live sample gets its id (the
        request id becomes its key) and a radix-cache namespace of its own."""
        r = probe.request_facts(req)
        rid, params = r["rid"], r["custom_params"]
        now = time.monotonic()
        # Admitted requests that will never reach a forward give their place under the in-flight cap back: one
        # SGLang refused right after creating it (an abort answered at once, never queued), and one aborted while
        # queued (no hook sees that) once it has waited LIVE_ADMIT_TTL_S.
        for gone, (*_, since, q) in list(self.admitted.items()):
            if probe.is_aborted(q):
                self.request_counts["aborted"] += 1
            elif now - since >= defaults.LIVE_ADMIT_TTL_S:
                self.request_counts["never_started"] += 1
            else:
                continue
            del self.admitted[gone]
        if not self.admission.wants(rid, params, r["health_check"]):
            return
        given = SAMPLE_PARAM in params  # a client's sample request: its id, mask and key are given
        if given and self.live is not None:  # any user of a served server can send it: held to the caps
            sid = params[SAMPLE_PARAM]
            if isinstance(sid, bool) or not isinstance(sid, int) or not 0 <= sid < LIVE_ID_BASE:
                self._refuse(sid, f"custom_params[{SAMPLE_PARAM!r}] of a request served during a live capture is "
                                  "an integer in [0, 2**62) (live samples are numbered from 2**62)")  # fmt: skip
                return
        inflight = len(self.admitted) + len(self.requests)
        if given and (self.live is None or self.admission.admit(r["prompt_len"], inflight) is None):
            self.admitted[rid] = (params[SAMPLE_PARAM], params, now, req)
        elif not given and self.admission.admit(r["prompt_len"], inflight) is None:
            sid, self.next_live_id = self.next_live_id, self.next_live_id + 1
            self.admitted[rid] = (sid, {**params, KEY_PARAM: rid}, now, req)
        else:
            return
        probe.isolate_from_radix_cache(req)

    def _sampled(self, rid: str) -> bool:
        return rid in self.admitted or rid in self.requests.held

    def on_forward(self, batch: Any, result: Any) -> None:
        """After a target forward (extend or decode): clones the sampled requests' rows, behind the forward on the
        device (:mod:`.assembly`). Other traffic is not touched."""
        reqs = probe.batch_requests(batch)
        if not any(self._sampled(r["rid"]) for r in reqs):
            return
        aux, final = probe.forward_states(result)
        decode = not probe.is_prefill(batch)
        total = len(reqs) if decode else sum(r["extend_len"] for r in reqs)
        if aux is None or final is None or aux.shape[0] != total or final.shape[0] != total:
            got = None if aux is None else tuple(aux.shape)
            self._lose([r["rid"] for r in reqs], f"a forward brought aux states {got} for {total} tokens "
                       "(FULL capture off?)")  # fmt: skip
            return
        whole = all(self._sampled(r["rid"]) for r in reqs)
        if whole:  # one copy for the forward, each request a view of it
            aux, final = aux.clone(), final.clone()
        self.ready = _record_event(aux)
        offset = 0
        for r in reqs:
            n = 1 if decode else r["extend_len"]
            lo, offset = offset, offset + n
            rid = r["rid"]
            if not self._sampled(rid):
                continue
            a, f = aux[lo : lo + n], final[lo : lo + n]
            if not whole:
                a, f = a.clone(), f.clone()
            if decode:
                self.requests.propose(rid, a, f)
            elif rid in self.requests.held or r["prefix_len"] == 0:
                sid, params, *_ = self.admitted.pop(rid, None) or (None, None)
                self.requests.extend(rid, sid, params, r["prefix_len"], a, f)
            else:  # a request this capture never saw the start of (its prefix from the radix cache)
                self.admitted.pop(rid, None)
                self.request_counts["incomplete"] += 1
                continue

    def on_verify(self, batch: Any, result: Any) -> None:
        """After an EAGLE verify forward: proposes each sampled request's accepted-path rows
        (:func:`eagle_io.sglang.probe.verify_states`), cloned behind the forward; :meth:`on_result` commits as many
        as SGLang committed tokens."""
        reqs = [str(r.rid) for r in getattr(batch, "reqs", None) or ()]
        mine = [i for i, rid in enumerate(reqs) if rid in self.requests.held]
        if not mine:
            return
        states = probe.verify_states(result)
        if states is None or int(states[0].shape[0]) != len(reqs):
            got = None if states is None else tuple(states[0].shape)
            self._lose([reqs[i] for i in mine], f"a verify forward brought states {got} for {len(reqs)} requests")
            return
        front, picked = states
        if len(mine) == len(reqs):
            front, picked = front.clone(), picked.clone()
            rows = [(front[i], picked[i]) for i in mine]
        else:
            rows = [(front[i].clone(), picked[i].clone()) for i in mine]
        self.ready = _record_event(front)
        for i, (a, f) in zip(mine, rows, strict=True):
            self.requests.propose(reqs[i], a, f)

    def _lose(self, rids: list[str], why: str) -> None:
        """Forgets sampled requests whose states a forward did not bring (counted ``incomplete``)."""
        for rid in rids:
            if self.admitted.pop(rid, None) is not None or self.requests.forget(rid) is not None:
                self.request_counts["incomplete"] += 1
        self.refusal = why
        logger.error("eagle-io capture: %s", why)

    def on_result(self, batch: Any) -> None:
        """After SGLang processed a forward's result: commits each sampled request's proposed rows up to its
        committed length, then every finished sampled request becomes one sample (its held rows joined), all of
        them handed to the hand-off thread together (:mod:`.handoff`)."""
        decode = not probe.is_prefill(batch)  # an extend's rows are held already; decode/verify forwards propose
        for r in getattr(batch, "reqs", None) or ():
            rid = str(r.rid)
            if rid in self.requests.held and decode:
                self.requests.commit(rid, probe.committed_rows(r))
            elif r.finished() and self.admitted.pop(rid, None) is not None:  # aborted before its first forward
                self.request_counts["aborted"] += 1
        todo: list[ForwardSample] = []
        auxes: list[Any] = []
        finals: list[Any] = []
        start = 0
        for req in probe.finished_requests(batch):
            if req["rid"] not in self.requests.held:
                continue
            if req["aborted"]:
                self.requests.forget(req["rid"])
                self.request_counts["aborted"] += 1
                continue
            prompt, output = req["input_ids"], req["output_ids"]
            tokens = prompt + output[:-1]  # the last generated token's state is never computed
            held, aux, fin = self.requests.take(req["rid"], len(tokens))
            sid, params = held.sample_id, held.params
            if aux is None:
                self.request_counts["incomplete"] += 1
                logger.warning("eagle-io capture: sample %s not stored: %s", sid, held.broken)
                continue
            mask = params.get(MASK_PARAM)
            if self.live is not None and mask is None:  # served traffic: the answer is what a draft learns
                mask = [0] * len(prompt)
            if (
                not isinstance(mask, list)
                or len(mask) != len(prompt)
                or not all(isinstance(m, (int, float)) and m in (0, 1) for m in mask)
            ):
                self._refuse(sid, f"custom_params[{MASK_PARAM!r}] is not a list of 0/1 over its {len(prompt)} "
                                  "prompt tokens")  # fmt: skip
                continue
            mask = [int(m) for m in mask] + [1] * (len(tokens) - len(prompt))
            try:
                check_sample(sid, tokens, mask, max_length=self.max_length, vocab_size=self.vocab_size)
            except SchemaError as e:
                self._refuse(sid, str(e).removeprefix(f"sample {sid}: ").removesuffix("; nothing of it was written"))
                continue
            todo.append(ForwardSample(sid, tokens, mask, start, len(tokens), str(params.get(KEY_PARAM, ""))))
            auxes.append(aux)
            finals.append(fin)
            start += len(tokens)
        if todo and self.handoff is not None and not self.handoff.put(Finished(todo, auxes, finals, self.ready)):
            self.request_counts["queue_full"] += len(todo)

    def fail(self, error: str) -> None:
        """Stops this capture on an error (shown in the status, ``state`` ``failed``), committing what it wrote and
        leaving the manifest incomplete; requests go on being served."""
        if self.error is None:
            self.error = error
            logger.error("eagle-io capture stopped: %s", error)
            # under the start's token: a client stopping this capture over HTTP (same token) reads the error
            threading.Thread(target=self.stop, args=(self.token, False), daemon=True).start()

    def counts(self) -> dict[str, int]:
        """Every counter: the store's, the scheduler's and, for a live capture, the admission's."""
        return {**(dict(self.store.counts) if self.store else {}), **self.request_counts, **self.admission.counts}

    def status(self) -> dict[str, Any]:
        """This capture's entry in ``/server_info``'s ``internal_states`` (:data:`.protocol.STATUS_KEY`)."""
        state = "stopped" if self.outcome is not None else "stopping" if self.stopping else "capturing"
        if self.error is not None or (self.outcome is not None and self.outcome.get("error")):
            state = "failed"
        out = {
            "state": state,
            "token": self.token,
            "out_dir": self.url,
            "writer_rank": self.writer_rank,
            "writes": self.writes,
            "held_requests": len(self.requests),
            "refusal": self.refusal,
            "counts": self.counts(),
            "live": self.live.to_dict() if self.live is not None else None,
        }
        # the ring is read only when no stop holds it (never waiting: this runs on the scheduler's thread)
        if self.store is not None and not self.stopping and self.answer_lock.acquire(blocking=False):
            try:
                ring = self.store.stats()
            finally:
                self.answer_lock.release()
            out["ring"] = {k: ring.get(k) for k in ("ring_capacity", "ring_high_water_bytes", "ring_bytes_in_use",
                                                     "committed_bytes")}  # fmt: skip
        if self.outcome is not None:
            out.update(self.outcome)
        if self.error is not None:
            out["error"] = self.error if not out.get("error") else f"{self.error}; then {out['error']}"
        return out

    stopping = False

    @property
    def stopped(self) -> bool:
        """Whether a stop reached this capture (samples reaching it later are counted, not written)."""
        return self.outcome is not None

    error: str | None = None

    def stop(self, token: Any, complete: bool = True) -> dict[str, Any]:
        """Drains the ring and commits the manifest (the first time; marked complete unless ``complete`` is False:
        an interrupted capture); requests still running are forgotten and counted (``unfinished_at_stop``). Returns
        this rank's answer for ``token``, which its status shows (``stop_token``): the outcome, the counts, the
        writer's statistics and, for an object-storage capture, what it uploaded (``SampleStore.upload_report``; None
        for a local one). A repeated stop gets the same outcome."""
        assert self.store is not None, "only the writing rank stops"
        with self.answer_lock:
            self.stopping, self.stop_token = True, token
            if self.outcome is None:
                # counted here; forgotten by the scheduler's own thread (_running), which may be iterating them now
                self.request_counts["unfinished_at_stop"] += len(self.requests) + len(self.admitted)
                try:
                    if self.handoff is not None:
                        self.handoff.close()  # what finished before the stop is put first
                    self.store.close(complete=complete)
                    self.outcome = {"error": None, "stats": self.store.stats(), "upload": self.store.upload_report}
                except Exception as e:  # reported to the client through the status
                    self.outcome = {"error": f"{type(e).__name__}: {e}"}
                self.outcome["stopped_by"] = token  # a later stop (a retry, the starter after a forced stop) sees it
            answer = {
                "token": token,
                "writer_rank": self.writer_rank,
                **self.outcome,
                "counts": self.counts(),
            }
        return answer


_ACTIVE: _SchedulerCapture | None = None
_STARTING: dict[str, Any] | None = None  # a start over HTTP in progress or failed: {"state", "token", "error"}
_LOCK = threading.Lock()


def _running() -> _SchedulerCapture | None:
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


def _guarded(cap: _SchedulerCapture, step: Any, *args: Any) -> None:
    """Runs one of the capture's steps inside SGLang's loop: an error of eagle-io's own stops the capture (shown in
    its status) and never reaches SGLang, whose request goes on being served."""
    try:
        step(*args)
    except Exception as e:
        logger.exception("eagle-io capture: %s failed", getattr(step, "__name__", step))
        cap.fail(f"{type(e).__name__} in {getattr(step, '__name__', step)}: {e}")


def _request_hook(result: Any, *args: Any, **kwargs: Any) -> Any:
    """AFTER ``Scheduler._create_generation_req(self, recv_req, ...) -> Req``: every new request, once."""
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


def _verify_hooked(worker: Any) -> bool:
    """Whether ``worker`` (the scheduler's speculative worker) verifies through :data:`hooks.VERIFY_HOOK`."""
    cls = hooks.resolve(hooks.VERIFY_HOOK.rsplit(".", 1)[0])
    return isinstance(worker, cls) and type(worker).verify is cls.verify


def _record_event(t: Any) -> Any:
    """A CUDA event recorded now on the current stream, when ``t`` is on a CUDA device (the hand-off waits for it);
    None on a CPU."""
    if not t.is_cuda:
        return None
    import torch

    ev = torch.cuda.Event()
    ev.record()
    return ev


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
        _ACTIVE = _SchedulerCapture(self, out_dir, options, token, live=live, **writers)


def _start_over_http(scheduler: Any, cmd: Mapping[str, Any]) -> None:
    global _STARTING
    try:
        writers = {k: int(cmd[k]) for k in ("writer_offset", "all_writers") if cmd.get(k) is not None}
        _start(scheduler, str(cmd["out_dir"]), cmd.get("options") or {}, cmd["token"], cmd.get("live"), **writers)
        _STARTING = None
        logger.info("eagle-io capture started over HTTP into %s", cmd["out_dir"])
    except Exception as e:  # shown in the status: the client names it
        _STARTING = {"state": "failed", "token": cmd["token"], "error": f"{type(e).__name__}: {e}"}
        logger.error("eagle-io capture: the start over HTTP failed: %s", _STARTING["error"])


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

    taken = False
    with _LOCK:
        cap = _ACTIVE
        if cmd["op"] == "stop" and _STARTING is not None and _STARTING["state"] == "failed":
            # that start's client was answered; its record would hide the capture this stop stops from the status
            _STARTING = None
        if cmd["op"] == "start":
            running = cap is not None and cap.writes and not cap.stopping
            if running and cap.token == cmd["token"]:
                taken = True  # a retried start: already running
            elif not running and not (_STARTING and _STARTING["state"] == "starting"):
                _STARTING = {"state": "starting", "token": cmd["token"], "error": None}
                threading.Thread(target=_start_over_http, args=(scheduler, cmd), daemon=True).start()
                taken = True
        elif cmd["op"] == "stop" and cap is not None and cap.writes:
            # only the client that started it stops a capture, unless forced (its client is gone)
            if cap.token is None or cmd["token"] == cap.token or cmd.get("force") is True:
                complete = cmd.get("complete") is not False
                threading.Thread(target=cap.stop, args=(cmd["token"], complete), daemon=True).start()
                taken = True
        elif cmd["op"] == "stop" and cap is not None:
            taken = True  # a rank that does not write has nothing to stop
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
    out: dict[str, Any] = {"eagle_io": __version__, "target": _FACTS}
    if _STARTING is not None:
        out.update(_STARTING)
    elif _ACTIVE is not None:
        out.update(_ACTIVE.status())
        out["stop_token"] = getattr(_ACTIVE, "stop_token", None)
    else:
        out["state"] = "idle"
    return json.loads(json.dumps(out, default=str))  # msgpack-native for SGLang's IPC


def _start_from_env(scheduler: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE ``Scheduler.init_all_cuda_graphs``: starts the capture named by ``EAGLE_IO_CAPTURE_DIR``."""
    out_dir = os.environ.get(ENV_CAPTURE_DIR)
    if out_dir:
        live = os.environ.get(ENV_CAPTURE_LIVE)
        _start(scheduler, out_dir, json.loads(os.environ.get(ENV_CAPTURE_OPTIONS) or "{}"),
               live=json.loads(live) if live else None)  # fmt: skip
        logger.info("eagle-io capture started from %s=%s", ENV_CAPTURE_DIR, out_dir)
        _ignore_terminal_interrupt()
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
