"""One capture in one SGLang scheduler process (:class:`SchedulerCapture`): which requests it samples, how a
sampled request's forwards become one sample, what it refuses and counts, its status and its stop. The process
around it (the hooks SGLang calls, the control commands, the status route, the start by environment) is
:mod:`.scheduler`.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

from ... import defaults
from ...errors import CaptureRefusedError, IncompatibleDatasetError, InvalidArgumentError, SchemaError
from ...sglang import compat, hooks, probe
from ..options import CaptureOptions
from ..prefixes import SharedPrefixes
from ..store import ForwardSample, SampleStore, check_sample
from .assembly import Held, RequestStates
from .handoff import Finished, Handoff
from .live import LIVE_ID_BASE, Admission, LivePolicy
from .protocol import KEY_PARAM, MASK_PARAM, PROOF_PARAM, SAMPLE_PARAM, capture_id, sample_proof

__all__ = ["PREFIX_COUNTS", "REQUEST_COUNTS", "SchedulerCapture"]

logger = logging.getLogger("eagle_io.serving")


REQUEST_COUNTS = (
    "incomplete",
    "refused",
    "aborted",
    "unfinished_at_stop",
    "queue_full",
    "never_started",
    "foreign_params",
)
"""The scheduler's own counters, beside the store's (:data:`eagle_io.capturing.store.COUNTS`) and a live capture's
admission counters (:data:`eagle_io.capturing.sglang.live.LIVE_COUNTS`): sampled requests not stored because their
states were not all captured (a prefix from the radix cache, a capture started mid-request); refused as declared (a
bad loss mask, tokens past ``max_length``: the last reason is in the status' ``refusal``); aborted; still running
when the capture stopped; dropped because the hand-off queue was full (a live capture only); sampled but never in a
forward within :data:`eagle_io.defaults.LIVE_ADMIT_TTL_S` (aborted while queued: SGLang's abort of a waiting
request passes no hook of the capture's); carrying eagle-io's sample parameters without this capture's proof
(:func:`.protocol.sample_proof`: another client's, served and never stored)."""


PREFIX_COUNTS = ("after_stored_prefix", "prefix_tokens_from_cache")
"""A capture's shared-prefix counters (in its ``counts``; its status' ``prefixes`` holds ``records``, the prefix
records it may reference, None when its samples are stored whole): sampled requests admitted after a prefix record it
stored (served from SGLang's radix cache up to it, their rows stored after it), and the prompt tokens that spared
recomputing (at most: SGLang may hold fewer of them in its cache, and then recomputes the rest)."""


class _Admitted(NamedTuple):
    """A sampled request before its first forward: what will be held for it, since when, and the ``Req``."""

    held: Held
    since: float
    req: Any


class SchedulerCapture:
    """One capture in one scheduler process.

    Shared prefixes (``dedup_prefixes``, default :data:`eagle_io.defaults.DEDUP_PREFIXES`; local ``out_dir``): a
    sampled request stays in its radix-cache namespace, its match bounded (:func:`eagle_io.sglang.probe.
    cap_prefix_match`): when its prompt begins with a prefix record this capture stored, SGLang may serve it up to
    that prefix and its sample holds the rows after it with a reference (:mod:`eagle_io.capturing.prefixes`);
    otherwise its match is bounded to nothing, so its whole prompt is computed, and the longest prefix it shares with
    an earlier sampled prompt (whole blocks, before its first supervised token) is stored once, as a record for the
    requests after it. Either way its KV entries serve the requests after it, as any request's. Without shared
    prefixes a sampled request gets a namespace of its own (:func:`eagle_io.sglang.probe.isolate_from_radix_cache`).
    """

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
        self.admitted: dict[str, _Admitted] = {}  # no forward yet
        self.request_counts = dict.fromkeys(REQUEST_COUNTS, 0)
        self.refusal: str | None = None
        self.answer_lock = threading.Lock()
        self.handoff: Handoff | None = None
        self.ready: Any = None  # the CUDA event after the latest clone (None on a CPU)
        self.prefixes: SharedPrefixes | None = None
        self.prefix_counts = dict.fromkeys(PREFIX_COUNTS, 0)
        self.bigram_cache = probe.bigram_prefix_cache(scheduler)
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
        if token is not None:  # resuming needs the same secret: another capture's dataset is not this one's
            launch["capture_owner"] = hashlib.sha256(token.encode()).hexdigest()
        opts = opts.replace(
            metadata={**launch, **opts.metadata},
            writer_options={**opts.writer_options, "rank": self.writer_rank, "world_size": writers},
        )
        if self.live is not None:
            opts = opts.replace(drop_when_full=True)  # serving never waits for a full ring
        try:
            self.store = SampleStore.create(out_dir, opts, aux_layer_ids=list(t["layers"]), target_info=info)
        except IncompatibleDatasetError as e:
            if "capture_owner" not in str(e):
                raise
            raise CaptureRefusedError(
                f"{out_dir} was written by another capture (metadata capture_owner differs): only the client that "
                "started it resumes it (its secret); capture into a new directory"
            ) from e
        base = LIVE_ID_BASE + self.writer_rank * 2**40
        self.next_live_id = max([i + 1 for i in self.store.done if base <= i < base + 2**40] or [base])
        self.handoff = Handoff(self.store, slots=defaults.HANDOFF_SLOTS, drop_when_full=self.live is not None,
                               stored=self._stored, fail=self.fail)  # fmt: skip
        self.prefixes = self._shared_prefixes(opts)

    def _shared_prefixes(self, opts: CaptureOptions) -> SharedPrefixes | None:
        """The shared prefixes of this capture, or None when its samples are stored whole
        (:meth:`CaptureOptions.stores_prefixes_once`), as they are, unless asked for (then refused), on an SGLang
        whose radix-cache match this capture cannot bound."""
        assert self.store is not None
        if not opts.stores_prefixes_once(self.url):
            return None
        if not probe.can_cap_prefix_match():
            if opts.dedup_prefixes:
                raise InvalidArgumentError(
                    "dedup_prefixes=True: this SGLang's Req has no _compute_max_prefix_len to bound a request's "
                    "radix-cache match; store the samples whole (dedup_prefixes=False)"
                )
            return None
        return SharedPrefixes(self.store.known_prefixes)

    def _stored(self, sample: ForwardSample, nbytes: int) -> None:
        """The hand-off put ``sample`` (``nbytes`` of states) into the ring (on the hand-off thread): counted for
        ``max_bytes_per_hour``; its shared prefix, if any, is a prefix record the requests after it may start from."""
        self.admission.stored(nbytes)
        if sample.shared_prefix and self.prefixes is not None:
            self.prefixes.note_stored(sample.input_ids[: sample.shared_prefix])

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
        for gone, a in list(self.admitted.items()):
            if probe.is_aborted(a.req):
                self.request_counts["aborted"] += 1
            elif now - a.since >= defaults.LIVE_ADMIT_TTL_S:
                self.request_counts["never_started"] += 1
            else:
                continue
            del self.admitted[gone]
        if not self.admission.wants(rid, params, r["health_check"]):
            return
        given = SAMPLE_PARAM in params  # a client's sample request: its id, mask and key are given
        if given and not self._proven(params):  # anyone can send eagle-io's parameters: served, never stored
            self.request_counts["foreign_params"] += 1
            return
        if given and self.live is not None:  # any user of a served server can send it: held to the caps
            sid = params[SAMPLE_PARAM]
            if isinstance(sid, bool) or not isinstance(sid, int) or not 0 <= sid < LIVE_ID_BASE:
                self._refuse(sid, f"custom_params[{SAMPLE_PARAM!r}] of a request served during a live capture is "
                                  "an integer in [0, 2**62) (live samples are numbered from 2**62)")  # fmt: skip
                return
        inflight = len(self.admitted) + len(self.requests)
        if given and (self.live is None or self.admission.admit(r["prompt_len"], inflight) is None):
            held = Held(params[SAMPLE_PARAM], params)
        elif not given and self.admission.admit(r["prompt_len"], inflight) is None:
            sid, self.next_live_id = self.next_live_id, self.next_live_id + 1
            # a served user's own eagle-io parameters (a loss mask over their prompt...) are never the sample's
            held = Held(sid, {KEY_PARAM: rid})
        else:
            return
        self.admitted[rid] = _Admitted(held, now, req)
        if self.prefixes is None:
            probe.isolate_from_radix_cache(req)
        else:  # its whole prompt computed (or after a stored prefix), its KV left to serve the requests after it
            probe.cap_prefix_match(req, self._after_stored_prefix(req, held), bigram=self.bigram_cache)

    def _after_stored_prefix(self, req: Any, held: Held) -> int:
        """Shared prefixes (class docstring): the tokens of the prefix record this capture stored that ``req``'s
        prompt begins with (``held`` then starts after them; SGLang may serve them from its radix cache); 0 when none,
        after setting the prefix ``held`` shares with an earlier sampled prompt, to store once."""
        assert self.prefixes is not None
        if not probe.prompt_prefix_shareable(req):
            return 0
        ids = req.origin_input_ids
        limit = len(ids) - 1  # SGLang computes a prompt's last token at least; a prefix stops before supervision
        mask = held.params.get(MASK_PARAM)
        if isinstance(mask, list):
            limit = next((i for i, m in enumerate(mask) if m != 0 and i < limit), limit)
        start, digest, held.shared_prefix = self.prefixes.match(ids, limit)
        if not start:
            return 0
        held.start, held.stored_prefix = start, digest
        self.prefix_counts["after_stored_prefix"] += 1
        self.prefix_counts["prefix_tokens_from_cache"] += start
        return start

    def _proven(self, params: Mapping[str, Any]) -> bool:
        """Whether a request's sample parameters carry this capture's proof (:func:`.protocol.sample_proof`)."""
        sid, proof = params.get(SAMPLE_PARAM), params.get(PROOF_PARAM)
        if self.token is None or isinstance(sid, bool) or not isinstance(sid, int) or not isinstance(proof, str):
            return False
        return hmac.compare_digest(proof, sample_proof(self.token, sid))

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
                continue
            new = self.admitted.pop(rid, None)
            if rid in self.requests.held or (new is not None and r["prefix_len"] <= new.held.start):
                self.requests.extend(rid, r["prefix_len"], a, f, None if new is None else new.held)
            else:  # a request this capture never saw the start of (its prefix from the radix cache)
                self.request_counts["incomplete"] += 1

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
            k = held.start  # tokens of its stored prefix: its record holds them
            todo.append(ForwardSample(sid, tokens[k:], mask[k:], start, len(tokens) - k, str(params.get(KEY_PARAM, "")),
                                      held.shared_prefix, held.stored_prefix))  # fmt: skip
            auxes.append(aux)
            finals.append(fin)
            start += len(tokens) - k
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
        """Every counter: the store's, the scheduler's, the shared prefixes' and, for a live capture, the
        admission's."""
        store = dict(self.store.counts) if self.store else {}
        return {**store, **self.request_counts, **self.prefix_counts, **self.admission.counts}

    def status(self) -> dict[str, Any]:
        """This capture's entry in ``/server_info``'s ``internal_states`` (:data:`.protocol.STATUS_KEY`)."""
        state = "stopped" if self.outcome is not None else "stopping" if self.stopping else "capturing"
        if self.error is not None or (self.outcome is not None and self.outcome.get("error")):
            state = "failed"
        out = {
            "state": state,
            "id": capture_id(self.token),
            "stop_id": capture_id(self.stop_token),
            "out_dir": self.url,
            "writer_rank": self.writer_rank,
            "writes": self.writes,
            "held_requests": len(self.requests),
            "refusal": self.refusal,
            "counts": self.counts(),
            "live": self.live.to_dict() if self.live is not None else None,
            "prefixes": None if self.prefixes is None else {"records": len(self.prefixes.stored)},
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

    stop_token: str | None = None

    def stop(self, token: Any, complete: bool = True, forced: bool = False) -> dict[str, Any]:
        """Drains the ring, commits the manifest and releases the ring (the first time; marked complete unless
        ``complete`` is False: an interrupted or forced stop); requests still running are forgotten and counted
        (``unfinished_at_stop``). Returns this rank's answer for ``token`` (the stopping command's secret, whose id
        the status shows as ``stop_id``): the outcome (``stopped_by`` the first stop's id, ``forced``), the counts,
        the writer's statistics and, for an object-storage capture, what it uploaded (``SampleStore.upload_report``;
        None for a local one). A repeated stop gets the same outcome."""
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
                # a later stop (a retry, the starter after a forced stop) sees who stopped it
                self.outcome["stopped_by"], self.outcome["forced"] = capture_id(token), forced
            answer = {
                "stop_id": capture_id(token),
                "writer_rank": self.writer_rank,
                **self.outcome,
                "counts": self.counts(),
            }
        return answer


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
