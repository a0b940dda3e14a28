"""The scheduler side of the SGLang capture (``eagle_io.capturing.sglang.scheduler``) on stand-ins of SGLang's
objects: which requests it samples and how a request's forwards become one sample (prefill chunks, decode, verify,
retraction), what it refuses and counts, its stop through SGLang's ``/set_internal_state`` control hook, and the live
capture's admission inside the scheduler. TEST-ONLY STAND-INS: the batches, requests and forward results
(``SimpleNamespace`` with the attribute paths SGLang 0.5.23 uses) and the capture ring (``_SlowSink``). The same code
runs inside real CPU SGLang servers in tests/test_capture_server.py and tests/test_live_capture.py."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers.control import route_to_scheduler
from test_serving_plugin import needs_sglang

import eagle_io
import eagle_io.errors
from eagle_io.capturing.sglang import capture as cc
from eagle_io.capturing.sglang.protocol import sample_proof


def test_a_request_the_capture_did_not_see_from_its_start_is_counted_never_written(tmp_path):
    """A forward that starts past what the capture holds for a request (its prefix served from the radix cache, or a
    capture started mid-request) cannot make a whole sample: counted ``incomplete``, nothing written, the forward
    untouched. A loss mask that is not a list over the prompt is refused and counted. Other traffic is ignored."""
    from eagle_io.capturing.sglang import scheduler as sc

    sink = _SlowSink(0)
    cap = _writing_capture(tmp_path, sink)
    cap.max_length = None
    try:
        _serve(cap, *_prefill(7, n=7, prefix=4))  # tokens 4..7 of 7: the first 4 came from a cache
        assert cap.request_counts["incomplete"] == 1 and sink.put_ids == [] and len(cap.requests) == 0
        batch, result = _prefill(9, n=3, rid="user")
        batch.reqs[0].sampling_params.custom_params = {"thinking_budget": 5}  # not ours
        _serve(cap, batch, result)
        batch, result = _prefill(8, n=3)
        batch.reqs[0].sampling_params.custom_params["eagle_io_loss_mask"] = "110"
        _serve(cap, batch, result)
        assert cap.request_counts["refused"] == 1 and "sample 8: custom_params['eagle_io_loss_mask'] is not" in (
            cap.refusal
        )
        assert sink.put_ids == [] and cap.store.counts["written"] == 0
    finally:
        sc._ACTIVE = None


def test_chunked_prefill_decode_and_retraction_assemble_one_sample_in_order(tmp_path):
    """A prompt of 7 in chunks [0, 3) and [3, 7), then 2 decode forwards, retracted after the first and prefilled
    again from its own cached prefix of 5 (SGLang's retraction), then decoding to the end: one sample of prompt +
    answer but its last token, each row from the last forward that computed it, the loss mask 1 over the answer."""
    from eagle_io.capturing.sglang import scheduler as sc

    sink = _SlowSink(0)
    sink.tensors = {}

    def put(sid, tensors, key="", shared_prefix=0, stored_prefix=None):
        sink.put_ids.append(sid)
        sink.tensors[sid] = tensors
        return True

    sink.put = put
    cap = _writing_capture(tmp_path, sink)
    cap.max_length, cap.vocab_size = None, 1000
    params = {
        "eagle_io_sample_id": 5,
        "eagle_io_loss_mask": [0, 0, 0, 1, 1, 1, 1],
        "eagle_io_proof": sample_proof(SECRET, 5),
    }
    req = SimpleNamespace(rid="q", origin_input_ids=list(range(10, 17)), sampling_params=SimpleNamespace(
        custom_params=params), finished=lambda: False, output_ids=[], finished_reason=None)  # fmt: skip
    req.output_ids_through_stop = req.output_ids
    extend = SimpleNamespace(is_extend=lambda: True, is_decode=lambda: False)
    decode = SimpleNamespace(is_extend=lambda: False, is_decode=lambda: True)
    rows = {}

    def forward(mode, positions, prefix=0, generated=None, last=False):
        """One forward over ``positions``, then SGLang's result processing: ``generated`` appended, ``last``
        finishes the request; then the capture's result hook."""
        aux = torch.stack([1.0 + p + 0.5 * forward.n + 0.125 * torch.arange(6.0) for p in positions])
        for p, a in zip(positions, aux, strict=True):
            rows[p] = a
        forward.n += 1
        out = SimpleNamespace(hidden_states=aux, last_hidden_states=aux[:, :2] + 1)
        batch = SimpleNamespace(forward_mode=mode, reqs=[req], extend_lens=[len(positions)], prefix_lens=[prefix])
        _arrive(cap, batch)
        cap.on_forward(batch, SimpleNamespace(logits_output=out))
        if generated is not None:
            req.output_ids.append(generated)
        if last:
            req.finished = lambda: True
        cap.on_result(batch)
        cap.handoff.wait_idle()

    forward.n = 0
    try:
        forward(extend, [0, 1, 2])  # chunk 1: not finished
        forward(extend, [3, 4, 5, 6], prefix=3, generated=100)  # chunk 2: generates token 100
        forward(decode, [7], generated=101)  # feeds 100, generates 101
        forward(extend, [5, 6, 7, 8], prefix=5, generated=102)  # retracted; prefilled again over 7 prompt + 2 generated
        forward(decode, [9], generated=103, last=True)  # feeds 102, generates 103: the end
        assert sink.put_ids == [5] and cap.request_counts == dict.fromkeys(cc.REQUEST_COUNTS, 0)
        t = sink.tensors[5]
        assert t["input_ids"].tolist() == [*range(10, 17), 100, 101, 102]  # 103's state: never computed
        assert t["loss_mask"].tolist() == [0, 0, 0, 1, 1, 1, 1, 1, 1, 1]
        want = torch.stack([rows[p] for p in range(10)])
        assert torch.equal(t["aux_hidden_states"].float(), want.to(torch.bfloat16).float())
        assert [float(r[0]) - 1 for r in want] == [0.0, 1.0, 2.0, 3.5, 4.5, 6.5, 7.5, 8.5, 9.5, 11.0]
    finally:
        sc._ACTIVE = None


class _SlowSink:
    """TEST-ONLY stand-in for the capture ring: ``close`` takes ``delay`` seconds; records what was put."""

    def __init__(self, delay: float) -> None:
        self.delay, self.put_ids, self.closed = delay, [], 0

    def put(self, sample_id, tensors, key="", shared_prefix=0, stored_prefix=None):
        self.put_ids.append(sample_id)
        return True

    def close(self):
        time.sleep(self.delay)
        self.closed += 1
        return {}

    def stats(self):
        return {"samples": len(self.put_ids)}


def _writing_capture(out: Path, sink: _SlowSink):
    """A writing ``_SchedulerCapture`` whose capture core writes to ``sink`` (no scheduler: the fields ``__init__``
    would set), made the active capture of this process, as ``_start`` does."""
    from eagle_io.capturing.sglang import scheduler as sc
    from eagle_io.capturing.store import SampleStore

    cap = object.__new__(cc.SchedulerCapture)
    cap.out_dir, cap.writer_rank, cap.writes, cap.max_length, cap.vocab_size = str(out), 0, True, 4, 100
    cap.store = SampleStore(sink, state_dtype=torch.bfloat16, max_length=4, vocab_size=100)
    cap.outcome = None
    cap.answer_lock, cap.requests, cap.refusal = threading.Lock(), cc.RequestStates(), None
    cap.token, cap.url = SECRET, out
    cap.request_counts = dict.fromkeys(cc.REQUEST_COUNTS, 0)
    cap.live, cap.admission, cap.admitted, cap.ready, cap.error = None, cc.Admission(None, 4), {}, None, None
    cap.prefixes, cap.prefix_counts = None, dict.fromkeys(cc.PREFIX_COUNTS, 0)
    cap.handoff = cc.Handoff(cap.store, slots=4, drop_when_full=False, stored=cap._stored, fail=cap.fail)
    sc._ACTIVE = cap
    return cap


_STATES = torch.Generator().manual_seed(0)


SECRET = "tok"  # the capture's secret in these tests
ADMIN_KEYED = SimpleNamespace(server_args=SimpleNamespace(api_key=None, admin_api_key="k"))
"""A scheduler of a server launched with --admin-api-key (SGLang checked the key of every control command)."""


def _prefill(sample_id, n=3, prefix=0, rid="r", secret=SECRET):
    """A prefill forward of one prompt-only request (``max_new_tokens`` 1) over tokens ``[prefix, n)``, finished
    once SGLang processed its result; an integer sample id comes with the proof of ``secret``'s capture."""
    params = {"eagle_io_sample_id": sample_id, "eagle_io_loss_mask": [1] * n}
    if isinstance(sample_id, int) and not isinstance(sample_id, bool) and secret is not None:
        params["eagle_io_proof"] = sample_proof(secret, sample_id)
    sp = SimpleNamespace(custom_params=params)
    req = SimpleNamespace(
        rid=rid, prefix_len=prefix, extend_len=n - prefix, origin_input_ids=list(range(n)), sampling_params=sp,
        finished=lambda: True, output_ids=[1], output_ids_through_stop=[1], finished_reason=None,
    )  # fmt: skip
    batch = SimpleNamespace(forward_mode=SimpleNamespace(is_extend=lambda: True), reqs=[req], extend_lens=[n - prefix])
    # states as a forward makes them: no two layers alike
    m = n - prefix
    out = SimpleNamespace(hidden_states=torch.randn(m, 6, generator=_STATES), last_hidden_states=torch.randn(m, 2))
    return batch, SimpleNamespace(logits_output=out)


def _arrive(cap, batch):
    """The scheduler's hook on each request of ``batch`` it has not seen yet (``Scheduler._create_generation_req``)."""
    for r in batch.reqs:
        if not getattr(r, "arrived", False):
            r.arrived = True
            cap.on_request(r)


def _serve(cap, batch, result):
    """The scheduler's hooks around one forward of ``batch``: a new request, after the forward, after its result;
    then waits for the hand-off thread."""
    _arrive(cap, batch)
    cap.on_forward(batch, result)
    cap.on_result(batch)
    cap.handoff.wait_idle()


def _client(url: str, out: Path):
    """A capture client (``ServerCapture``) of one writing rank at ``url`` that started a capture under the secret
    :data:`SECRET` (the fields its start sets; the dataset directory is not one this client reads)."""
    from eagle_io.capturing.sglang import client
    from eagle_io.sglang.gateway import Route
    from eagle_io.sglang.servers import ServerKeys

    cap = object.__new__(client.ServerCapture)
    facts = client.ServerFacts(Route.direct(url), "m", None, {"writers": 1, "layers": [2, 4, 5]}, ({},))
    cap.servers, cap._secret, cap.url, cap.writers, cap.manifest, cap.answers = [facts], SECRET, str(out), 1, None, []
    cap.counts, cap.keys = {"sent": 1}, ServerKeys()
    return cap


@needs_sglang
def test_a_stop_over_http_is_retried_answered_once_and_late_samples_are_counted(tmp_path, monkeypatch):
    """A stop through the control hook (SGLang's ``/set_internal_state``) drains and commits once: a client's stop
    that timed out can be retried and gets the same outcome, a repeated (forced) stop too; samples reaching a stopped
    capture are counted (``after_stop``), not written; a stop under another token is not taken."""
    from eagle_io.capturing.sglang import client
    from eagle_io.capturing.sglang import scheduler as sc
    from eagle_io.capturing.sglang.protocol import control_args
    from eagle_io.sglang import gateway

    sink = _SlowSink(delay=1.5)
    cap = _writing_capture(tmp_path, sink)
    url = route_to_scheduler(monkeypatch, ADMIN_KEYED)  # SGLang checked the forced stop's admin key
    try:
        _serve(cap, *_prefill(7))
        stranger = gateway.http_json(f"{url}/set_internal_state", {"server_args": control_args("stop", "x")})
        assert stranger == [False] and not cap.stopping, "only its client (or a forced stop) stops it"
        mine = _client(url, tmp_path / "not-read-here")
        with pytest.raises(eagle_io.errors.CaptureStopTimeoutError, match=rf"{url} DP rank 0 \(stopping\)"):
            mine.close(timeout_s=0.5)  # the close takes 1.5 s
        assert mine.close(timeout_s=10) == {}  # retried: answered once the close is done
        (first,) = mine.answers
        assert first["error"] is None and first["counts"]["written"] == 1 and first["stats"] == {"samples": 1}
        _serve(cap, *_prefill(8))
        (again,) = client.stop_server_capture(url, timeout_s=10, complete=True)
        assert again["counts"]["after_stop"] == 1 and again["stats"] == first["stats"]
        assert sink.put_ids == [7] and sink.closed == 1, "closed once; the late sample was not written"
    finally:
        sc._ACTIVE = None


@needs_sglang
def test_a_client_left_on_an_interrupt_stops_the_capture_incomplete(tmp_path, monkeypatch):
    """Ctrl-C (or any error) inside ``with eagle_io.capture(url, ...)``: the client's stop carries ``complete=False``
    to the scheduler, whose manifest is committed marked incomplete; the error is not hidden."""
    from eagle_io.capturing.sglang import scheduler as sc

    closed: list[bool] = []

    class _Sink(_SlowSink):
        def close(self, complete=True):
            closed.append(complete)
            return {}

    cap = _writing_capture(tmp_path, _Sink(0))
    url = route_to_scheduler(monkeypatch)
    try:
        with pytest.raises(KeyboardInterrupt), _client(url, tmp_path / "not-read-here"):
            raise KeyboardInterrupt
        assert closed == [False] and cap.stopped
    finally:
        sc._ACTIVE = None


def test_only_the_starting_client_or_a_forced_stop_stops_a_capture():
    """A stop over HTTP carrying another client's token is not taken (that client's samples would silently stop
    being stored); the starter's own token, or ``force`` (:func:`stop_server_capture`, its client gone), is."""
    import time as _time

    from eagle_io.capturing.sglang import scheduler as sc
    from eagle_io.capturing.sglang.protocol import control_args

    stops = []
    cap = SimpleNamespace(writes=True, stopping=False, token="A", stop=lambda *a: stops.append(a))
    sc._ACTIVE = cap
    try:

        def send(token, scheduler=ADMIN_KEYED, **kw):
            req = SimpleNamespace(server_args=control_args("stop", token, **kw))
            return sc._control_hook(None, scheduler, req).updated

        assert send("B") is False
        keyless = SimpleNamespace(server_args=SimpleNamespace(api_key=None, admin_api_key=None))
        assert send("D", keyless, force=True) is False, "a forced stop on a server no key guards is anyone's"
        _time.sleep(0.2)
        assert stops == [], "another client's stop stopped the capture"
        assert send("A") is True and send("C", complete=True, force=True) is True
        _time.sleep(0.2)
        assert sorted(stops) == [("A", True, False), ("C", False, True)], "a forced stop ends it incomplete"
    finally:
        sc._ACTIVE = None


def test_a_stop_after_a_refused_start_reaches_the_capture_that_ran_before():
    """A start over HTTP that the scheduler refused (e.g. ``live start`` into the directory of the capture just
    stopped) leaves its ``failed`` record for its client; a later stop clears it, so the status shows the capture the
    stop answers (measured on a real CPU server before: ``eagle-io live stop`` after such a start waited out its
    600 s stop timeout, every status showing the refused start's error and no ``stop_token``)."""
    from eagle_io.capturing.sglang import scheduler as sc
    from eagle_io.capturing.sglang.protocol import control_args

    stops = []
    stopped = SimpleNamespace(writes=True, stopping=True, stopped=True, token="A", stop_token=None,
                              stop=lambda token, *a: stops.append(token),
                              status=lambda: {"state": "stopped", "id": "x"})  # fmt: skip
    sc._ACTIVE, sc._FACTS = stopped, {}
    sc._STARTING = {"state": "failed", "id": "y", "error": "InvalidArgumentError: already holds data"}
    try:
        assert sc.status(None)["state"] == "failed"  # the refused start's client reads its error
        req = SimpleNamespace(server_args=control_args("stop", "C", complete=True, force=True))
        assert sc._control_hook(None, ADMIN_KEYED, req).updated is True
        assert sc._STARTING is None and sc.status(None)["state"] == "stopped"
    finally:
        sc._ACTIVE, sc._STARTING, sc._FACTS = None, None, None


def test_a_sample_longer_than_the_capture_max_length_is_refused_and_counted(tmp_path):
    """Refused in the scheduler, counted and named in the status; the forward and the request go on (serving
    first: a hook never raises into SGLang's loop)."""
    from eagle_io.capturing.sglang import scheduler as sc

    sink = _SlowSink(0)
    cap = _writing_capture(tmp_path, sink)  # max_length 4
    try:
        _serve(cap, *_prefill(1, n=4))
        _serve(cap, *_prefill(2, n=5))
        assert sink.put_ids == [1] and cap.request_counts["refused"] == 1
        assert cap.refusal == "sample 2: it has 5 tokens, more than this run's max_length 4; nothing of it was written"
    finally:
        sc._ACTIVE = None


def test_a_request_whose_loss_mask_is_all_zero_is_skipped_and_counted(tmp_path):
    """The SGLang path wrote a sample with no supervised token (the HF path's tokenizer refuses them earlier): the
    capture core skips it and counts it (unsupervised_skipped), for every backend; the others are written."""
    from eagle_io.capturing.sglang import scheduler as sc

    sink = _SlowSink(0)
    cap = _writing_capture(tmp_path, sink)  # max_length 4
    try:
        batch, result = _prefill(3, n=4)
        batch.reqs[0].sampling_params.custom_params["eagle_io_loss_mask"] = [0, 0, 0, 0]
        _serve(cap, batch, result)
        _serve(cap, *_prefill(4, n=2))
        assert sink.put_ids == [4] and cap.store.counts["unsupervised_skipped"] == 1
    finally:
        sc._ACTIVE = None


@pytest.mark.parametrize("bad", [-1, 1 << 64])
def test_a_sample_id_that_is_not_a_u64_integer_is_refused(tmp_path, bad):
    from eagle_io.capturing.sglang import scheduler as sc

    sink = _SlowSink(0)
    cap = _writing_capture(tmp_path, sink)
    try:
        _serve(cap, *_prefill(bad))
        assert cap.request_counts["refused"] == 1 and sink.put_ids == []
        assert cap.refusal == f"sample {bad}: sample ids are integers in [0, 2**64); nothing of it was written"
    finally:
        sc._ACTIVE = None


@pytest.mark.parametrize(
    ("sid", "secret"),
    [(4, None), (4, "another capture's secret"), (7.9, SECRET), ("12", SECRET), (True, SECRET), (None, SECRET)],
)
def test_a_request_with_eagle_ios_parameters_but_not_this_captures_proof_is_served_never_stored(tmp_path, sid, secret):
    """Before: during a capture, any plain /generate carrying eagle_io_sample_id 4 was stored as sample 4 (and the
    client's own sample 4 then skipped as already done). Now a sample request must carry this capture's proof (an
    HMAC of its id under the capture's secret): without it, or with another capture's, or with an id no client of
    eagle-io sends, the request is served, counted ``foreign_params``, never stored; the capture's own sample 4
    still is."""
    from eagle_io.capturing.sglang import scheduler as sc

    sink = _SlowSink(0)
    cap = _writing_capture(tmp_path, sink)
    try:
        _serve(cap, *_prefill(sid, rid="foreign", secret=secret))
        assert cap.request_counts["foreign_params"] == 1 and sink.put_ids == [] and not cap.admitted
        _serve(cap, *_prefill(4, rid="mine"))
        assert sink.put_ids == [4] and cap.request_counts["refused"] == 0
    finally:
        sc._ACTIVE = None


# ---------------------------------------------------------------------------------------------- captured states


def test_a_sampled_request_that_never_reaches_a_forward_is_forgotten_and_counted(tmp_path, monkeypatch):
    """SGLang aborts a queued request without a hook the capture sees: once it has waited past
    ``LIVE_ADMIT_TTL_S`` it is forgotten at the next arrival and counted ``never_started`` (else it would hold a
    place under the in-flight cap for good)."""
    from eagle_io import defaults
    from eagle_io.capturing.sglang import scheduler as sc

    cap = _writing_capture(tmp_path, _SlowSink(0))
    try:
        first, _ = _prefill(1, rid="queued")
        _arrive(cap, first)
        assert list(cap.admitted) == ["queued"] and cap.request_counts["never_started"] == 0
        monkeypatch.setattr(defaults, "LIVE_ADMIT_TTL_S", 0.0)
        second, _ = _prefill(2, rid="next")
        _arrive(cap, second)
        assert list(cap.admitted) == ["next"] and cap.request_counts["never_started"] == 1
    finally:
        sc._ACTIVE = None


@pytest.mark.parametrize(
    "custom_params",
    ["a string", [1, 2], {"eagle_io_loss_mask": ["a", 0, 0]}, {"eagle_io_loss_mask": [None, 0, 0]},
     {"eagle_io_loss_mask": [1, 1, 1]}],
)  # fmt: skip
def test_a_served_requests_custom_params_never_stop_a_live_capture_nor_shape_its_sample(tmp_path, custom_params):
    """SGLang serves a request whose ``custom_params`` is not a dict (it checks ``isinstance(..., dict)`` itself), or
    holds a loss mask of its own (malformed or not): a live capture samples it by its rate, runs on, and stores it
    with the live capture's own mask, never the user's (measured on a real CPU server before: a plain user's
    ``eagle_io_loss_mask`` of all ones made their own prompt supervised tokens). Here the prompt-only samples have no
    supervised token: each skipped and counted, none refused."""
    from eagle_io.capturing.sglang import scheduler as sc

    sink = _SlowSink(0)
    cap = _writing_capture(tmp_path, sink)
    cap.live = cc.LivePolicy(sample_rate=1.0)
    cap.admission, cap.next_live_id = cc.Admission(cap.live, 4), 1 << 62
    try:
        for rid in ("odd", "next"):
            batch, result = _prefill(None, rid=rid)
            batch.reqs[0].sampling_params.custom_params = custom_params
            _serve(cap, batch, result)
        assert cap.error is None and not cap.stopping, cap.error
        assert cap.admission.counts["sampled"] == 2 and sink.put_ids == []
        counts = cap.counts()
        assert (counts["unsupervised_skipped"], counts["refused"]) == (2, 0), counts
    finally:
        sc._ACTIVE = None


class FINISH_ABORT:  # TEST-ONLY stand-in: SGLang's class, matched by its name
    pass


def _live_capture(tmp_path, **policy):
    """:func:`_writing_capture` running a live capture under ``policy``."""

    cap = _writing_capture(tmp_path, _SlowSink(0))
    cap.live = cc.LivePolicy(**policy)
    cap.admission, cap.next_live_id = cc.Admission(cap.live, 4), 1 << 62
    return cap


def test_a_served_request_naming_its_own_sample_id_is_held_to_the_live_caps(tmp_path):
    """During a live capture any user of the server can send eagle-io's ``eagle_io_sample_id``: such a request is held
    to the caps like any other (measured on a real CPU server before: rate 0 and ``max_inflight`` 2, three such
    requests were all stored, uncounted by ``sampled``), and an id in the live range (from 2**62) is refused, counted
    (before: a user's id 2**62 took the next live sample's id, which was then dropped as ``already_done``)."""
    from eagle_io.capturing.sglang import scheduler as sc

    cap = _live_capture(tmp_path, sample_rate=0.0, max_inflight=1)
    try:
        for rid, sid in (("live-range", 1 << 62), ("not-an-int", "abc"), ("ok", 7), ("second", 8)):
            batch, _ = _prefill(sid, rid=rid)
            cap.on_request(batch.reqs[0])
        assert list(cap.admitted) == ["ok"]
        counts = cap.counts()
        assert (counts["refused"], counts["foreign_params"]) == (1, 1), counts
        assert (counts["sampled"], counts["capped_inflight"]) == (1, 1), counts
        assert "an integer in [0, 2**62)" in cap.refusal
    finally:
        sc._ACTIVE = None


def test_a_request_sglang_refuses_at_creation_frees_its_place_under_the_inflight_cap(tmp_path):
    """SGLang refuses some requests right after creating them, never queued (``return_sampling_mask`` under
    speculative decoding: HTTP 400): a sampled one is forgotten at the next arrival and counted ``aborted`` (measured
    on a real CPU server before: with ``max_inflight`` 1 it held the only place, and every later request was counted
    ``capped_inflight`` for LIVE_ADMIT_TTL_S, 600 s)."""
    from eagle_io.capturing.sglang import scheduler as sc

    cap = _live_capture(tmp_path, sample_rate=1.0, max_inflight=1)
    try:
        refused, _ = _prefill(None, rid="refused")
        refused.reqs[0].sampling_params.custom_params = {}
        cap.on_request(refused.reqs[0])
        refused.reqs[0].finished_reason = FINISH_ABORT()  # prepare_abort, after _create_generation_req
        nxt, _ = _prefill(None, rid="next")
        nxt.reqs[0].sampling_params.custom_params = {}
        cap.on_request(nxt.reqs[0])
        assert list(cap.admitted) == ["next"]
        counts = cap.counts()
        assert (counts["aborted"], counts["sampled"], counts["capped_inflight"]) == (1, 2, 0), counts
    finally:
        sc._ACTIVE = None
