"""Which live requests a serving capture samples (:mod:`eagle_io.capturing.sglang.live`): the rate on a hash of
the request id, the per-request flag and opt-out, the caps, each refusal counted; and that the flag reaches the
scheduler from SGLang's OpenAI routes (SGLang's own request models)."""

from __future__ import annotations

import pytest

from eagle_io.capturing.sglang import live
from eagle_io.capturing.sglang.live import Admission, LivePolicy, rid_fraction
from eagle_io.errors import InvalidArgumentError


def test_the_rate_samples_that_fraction_of_request_ids_the_same_everywhere():
    rids = [f"{i:032x}" for i in range(20000)]
    a = Admission(LivePolicy(sample_rate=0.25), max_length=None)
    picked = [r for r in rids if a.wants(r, {})]
    assert 0.23 < len(picked) / len(rids) < 0.27
    assert a.counts["not_sampled"] == len(rids) - len(picked)
    # a hash, not Python's salted hash(): the same ids again, in a fresh admission
    b = Admission(LivePolicy(sample_rate=0.25), max_length=None)
    assert [r for r in rids if b.wants(r, {})] == picked
    assert rid_fraction("0" * 32) == rid_fraction("0" * 32) != rid_fraction("1" * 32)
    assert not any(Admission(LivePolicy(sample_rate=0.0), None).wants(r, {}) for r in rids[:500])
    assert all(Admission(LivePolicy(sample_rate=1.0), None).wants(r, {}) for r in rids[:500])


def test_the_per_request_flag_and_opt_out_come_before_the_rate():
    a = Admission(LivePolicy(sample_rate=0.0), max_length=None)
    assert a.wants("x", {"eagle_io_capture": True})
    assert not Admission(LivePolicy(sample_rate=1.0), None).wants("x", {"eagle_io_capture": False})
    b = Admission(LivePolicy(sample_rate=1.0), None)
    b.wants("x", {"eagle_io_capture": False})
    assert b.counts["opted_out"] == 1
    # a client-driven capture (no policy) stores only eagle-io's own sample requests, and counts nothing else
    c = Admission(None, None)
    assert c.wants("x", {"eagle_io_sample_id": 3}) and not c.wants("y", {"eagle_io_capture": True}) and not c.counts


def test_sglangs_own_health_check_is_never_sampled_and_is_counted():
    """``GET /health`` runs a one-token request (rid ``HEALTH_CHECK_...``, input ``[0]``) on an idle SGLang: not
    traffic, so not sampled at any rate, counted ``health_checks``; recognised by SGLang's own test of the rid."""
    pytest.importorskip("sglang")
    from types import SimpleNamespace

    from sglang.srt.constants import HEALTH_CHECK_RID_PREFIX

    from eagle_io.sglang.probe import request_facts

    def req(rid):
        return SimpleNamespace(rid=rid, origin_input_ids=[0], sampling_params=SimpleNamespace(custom_params=None))

    probe, user = request_facts(req(f"{HEALTH_CHECK_RID_PREFIX}_0f3a")), request_facts(req("0f3a"))
    assert probe["health_check"] is True and user["health_check"] is False
    a = Admission(LivePolicy(sample_rate=1.0), max_length=None)
    assert not a.wants(probe["rid"], probe["custom_params"], probe["health_check"])
    assert a.wants(user["rid"], user["custom_params"], user["health_check"])
    assert (a.counts["health_checks"], a.counts["not_sampled"]) == (1, 0)


def test_each_cap_refuses_and_is_counted_under_its_name():
    a = Admission(LivePolicy(sample_rate=1.0, max_inflight=2), max_length=100)
    assert a.admit(101, 0) == "too_long"
    assert a.admit(10, 2) == "capped_inflight"
    assert a.admit(10, 1) is None
    # a rate below 1 per second still admits one, then the next after 1 / rate seconds (a bucket holding only
    # `rate` never reached 1: measured, --max-samples-per-s 0.5 sampled none of 3 requests 3 s apart)
    slow = Admission(LivePolicy(sample_rate=1.0, max_samples_per_s=0.5), None)
    assert [slow.admit(5, 0) for _ in range(2)] == [None, "capped_samples_per_s"]
    slow._samples.at -= 2.0  # two seconds later
    assert slow.admit(5, 0) is None
    s = Admission(LivePolicy(sample_rate=1.0, max_samples_per_s=2), None)
    assert [s.admit(5, 0) for _ in range(3)] == [None, None, "capped_samples_per_s"]
    t = Admission(LivePolicy(sample_rate=1.0, max_tokens_per_s=100), None)
    assert [t.admit(60, 0) for _ in range(2)] == [None, "capped_tokens_per_s"]
    b = Admission(LivePolicy(sample_rate=1.0, max_bytes_per_hour=1000), None)
    assert b.admit(5, 0) is None
    b.stored(1000)
    assert b.admit(5, 0) == "capped_bytes_per_hour"
    assert (a.counts["sampled"], a.counts["too_long"], a.counts["capped_inflight"]) == (1, 1, 1)
    assert set(a.counts) == set(live.LIVE_COUNTS)


@pytest.mark.parametrize(
    ("bad", "what"),
    [
        ({"sample_rate": 1.5}, "sample_rate 1.5: a fraction in [0, 1]"),
        ({"max_inflight": 0}, "max_inflight 0: a positive number"),
        ({"max_samples_per_s": True}, "max_samples_per_s True: a positive number"),
        # before: accepted here, then the server's start failed on "metadata is not JSON: Out of range float values"
        ({"max_tokens_per_s": float("inf")}, "max_tokens_per_s inf: a positive number"),
        ({"rate": 0.1}, "live capture options: unknown keyword argument 'rate'; the valid ones: max_bytes_per_hour"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_option(bad, what):
    with pytest.raises(InvalidArgumentError) as e:
        LivePolicy.from_dict(bad)
    assert str(e.value).startswith(what if what.startswith("live capture") else f"live capture {what}"), str(e.value)


def test_the_flag_reaches_the_scheduler_from_sglangs_openai_routes():
    """OpenAI clients send ``extra_body={"custom_params": {...}}``; SGLang's own request models carry it into the
    sampling parameters the scheduler's ``Req`` holds (``ChatCompletionRequest.to_sampling_params``)."""
    protocol = pytest.importorskip("sglang.srt.entrypoints.openai.protocol")
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "custom_params": {"eagle_io_capture": True}}  # fmt: skip
    req = protocol.ChatCompletionRequest.model_validate(body)
    assert req.to_sampling_params([], {})["custom_params"] == {"eagle_io_capture": True}
    comp = protocol.CompletionRequest.model_validate({"model": "m", "prompt": [1, 2], "custom_params": {"a": 1}})
    assert comp.custom_params == {"a": 1}
