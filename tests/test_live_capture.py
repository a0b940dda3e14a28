"""Live capture of served traffic on a real CPU ``sglang.launch_server`` serving an EAGLE-3 draft under EAGLE3
(chain, and tree for the states): the tiny float32 target and the draft trained on its own answers
(:func:`helpers.spec_fixture.shared_spec_fixture`, shared with test_sglang_spec.py), eagle-io's plugin on, SGLang's
radix cache on. What a sampled request stores is held to what the server answered (``output_ids``), to the Hugging
Face float32 forward over the same final sequence (bf16 storage: max |difference| <= 1% of max |reference|; measured
0.2-0.3%) and to what eagle-io stores for that sequence sent as a prompt (the prefill path). The server keeps
serving through a full ring and a full disk (the test-only LD_PRELOAD fault injector, tests/helpers/fault_inject.c,
armed for one output directory only)."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
import torch
from helpers.forkserver import build_fault_injector
from helpers.sglang_cpu import SPEC_ENGINE_ARGS
from helpers.spec_fixture import STEPS, shared_spec_fixture
from test_capture_server import rel
from test_serving_plugin import needs_sglang
from test_sglang_spec import launch_spec_server

import eagle_io
from eagle_io.capturing.options import CaptureOptions
from eagle_io.capturing.prefixes import token_digest
from eagle_io.capturing.sglang.client import ServerCapture, capture_status
from eagle_io.capturing.sglang.live import LivePolicy
from eagle_io.errors import StorageError
from eagle_io.sglang.servers import http_json, stop_server
from eagle_io.spec.served import engine_args

pytestmark = [needs_sglang, pytest.mark.slow]

ANSWER = 16
DISK_FULL = "diskfull-live"  # the one output directory whose shard writes fail (ENOSPC, sticky) in the chain server


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    torch.set_num_threads(1)
    return shared_spec_fixture(tmp_path_factory)


def _launch(trained, tmp_path_factory, topk: int, env: dict[str, str] | None = None) -> tuple[str, object]:
    """A server whose operator lets clients capture under this run's temporary directory."""
    target, _, draft, _, _ = trained
    args = engine_args(target, draft, algorithm="EAGLE3", num_steps=STEPS, topk=topk, extra=SPEC_ENGINE_ARGS)
    env = {**(env or {}), "EAGLE_IO_CAPTURE_ROOT": str(tmp_path_factory.getbasetemp())}
    return launch_spec_server(args, tmp_path_factory.mktemp(f"live{topk}") / "server.log", env=env)


@pytest.fixture(scope="module")
def chain(trained, tmp_path_factory):
    """The chain server (topk 1), with the fault injector armed for :data:`DISK_FULL` when a C compiler exists."""
    so = build_fault_injector(tmp_path_factory.mktemp("injector"))
    env = {"LD_PRELOAD": so, "EIO_FAULT": f"ENOSPC:write:/{DISK_FULL}/shards/:3"} if so else None
    url, proc = _launch(trained, tmp_path_factory, topk=1, env=env)
    try:
        yield url, so is not None
    finally:
        stop_server(proc)


@pytest.fixture(scope="module")
def hf(trained):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(trained[0], dtype=torch.float32).eval()


def _generate(url: str, prompt: list[int], rid: str, **params) -> list[int]:
    body = {
        "input_ids": prompt,
        "rid": rid,
        "sampling_params": {"max_new_tokens": ANSWER, "temperature": 0.0, **params},
    }
    return http_json(f"{url}/generate", body, timeout_s=300)["output_ids"]


def _serve_all(url: str, prompts: list[list[int]], **params) -> dict[str, tuple[list[int], list[int]]]:
    """Sends every prompt at once (its own rid); ``{rid: (prompt, output_ids)}``."""
    out: dict[str, tuple[list[int], list[int]]] = {}
    rids = [f"t-{uuid.uuid4().hex[:12]}" for _ in prompts]

    def one(rid: str, p: list[int]) -> None:
        out[rid] = (p, _generate(url, p, rid, **params))

    threads = [threading.Thread(target=one, args=(r, p)) for r, p in zip(rids, prompts, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(out) == len(prompts)
    return {r: out[r] for r in rids}


def _stored(out: Path) -> dict[str, dict]:
    """The dataset's samples by key (a live sample's key is its request id)."""
    ds = eagle_io.Dataset(out)
    return {ds.entry(i).key: ds[i] for i in range(len(ds))}


def _held_to_hf(item: dict, model) -> None:
    with torch.no_grad():
        hs = model(item["input_ids"][None], output_hidden_states=True).hidden_states
    assert rel(item["aux_hidden_states"], torch.cat([hs[j][0] for j in (2, 4, 5)], -1)) <= 0.01
    assert rel(item["hidden_states"], hs[-1][0]) <= 0.01


@pytest.mark.parametrize("topk", [1, 4], ids=["chain", "tree"])
def test_a_sampled_request_stores_its_prompt_and_answer_as_served(topk, trained, chain, hf, tmp_path,
                                                                   tmp_path_factory):  # fmt: skip
    """Rate 1, four prompts served at once: each stored sample is prompt + the served answer but its last token (the
    bonus token's state no forward computed), key = rid, loss mask 0 over the prompt and 1 over the answer; its
    states (prefill, then each verify step's accepted rows in commit order, no row twice) equal the HF forward over
    the final sequence, and equal what eagle-io stores for that sequence sent as a prompt (the prefill path)."""
    prompts = trained[3][:4]
    proc = None
    if topk == 1:
        url = chain[0]
    else:
        url, proc = _launch(trained, tmp_path_factory, topk=topk)
    try:
        with ServerCapture(url, tmp_path / "live", CaptureOptions(), live=LivePolicy(sample_rate=1.0)) as cap:
            served = _serve_all(url, prompts)
        st = cap.stats()
        assert st["scheduler_sampled"] == st["scheduler_written"] == 4 and st["scheduler_incomplete"] == 0
        assert eagle_io.Dataset.verify(tmp_path / "live") == []
        stored = _stored(tmp_path / "live")
        assert sorted(stored) == sorted(served)
        sequences = []
        for rid, (prompt, output) in served.items():
            item = stored[rid]
            assert len(output) == ANSWER and item["input_ids"].tolist() == prompt + output[:-1]
            assert item["loss_mask"].tolist() == [0] * len(prompt) + [1] * (ANSWER - 1)
            _held_to_hf(item, hf)
            sequences.append(item["input_ids"])
        # the same final sequences sent as prompts: the prefill path's states, request for request
        from types import SimpleNamespace

        samples = [SimpleNamespace(index=i, input_ids=s, loss_mask=torch.ones_like(s)) for i, s in enumerate(sequences)]
        with eagle_io.capture(url, tmp_path / "prefill") as cap:
            cap.submit(samples)
        ds = eagle_io.Dataset(tmp_path / "prefill")
        for i, seq in enumerate(sequences):
            item = ds[[ds.entry(j).sample_id for j in range(len(ds))].index(i)]
            live = stored[list(served)[i]]
            assert torch.equal(item["input_ids"], seq)
            assert rel(live["aux_hidden_states"], item["aux_hidden_states"].float()) <= 0.01
            assert rel(live["hidden_states"], item["hidden_states"].float()) <= 0.01
    finally:
        if proc is not None:
            stop_server(proc)


def test_a_shared_system_prompt_is_computed_and_stored_once_and_reads_back_whole(trained, chain, hf, tmp_path):
    """Rate 1, shared prefixes stored once (the default): 8 prompts, each a 128-token system prompt, 5 common tokens
    and a question of its own, sent one at a time. The first two are computed whole, their radix-cache match bounded
    to nothing (the second shares the system prompt with the first: its first 128 tokens become a prefix record);
    each later one is served by SGLang from its cache for exactly the 128 tokens of the record (SGLang's own
    ``cached_tokens``: the cap, although its cache holds 133 of them from the first two) and stores only the rows it
    computed. Every sample reads back whole: prompt plus answer as served, held to the HF forward; the dataset holds
    one prefix record and verifies."""
    url, _ = chain
    g = torch.Generator().manual_seed(44)
    system = torch.randint(10, 1000, (128,), generator=g).tolist()
    common = torch.randint(10, 1000, (5,), generator=g).tolist()
    prompts = [system + common + torch.randint(10, 1000, (20,), generator=g).tolist() for _ in range(8)]

    def records() -> int:
        return (capture_status(url)[0]["prefixes"] or {}).get("records", 0)

    served, cached = {}, []
    with ServerCapture(url, tmp_path / "dd", CaptureOptions(), live=LivePolicy(sample_rate=1.0)) as cap:
        for i, p in enumerate(prompts):
            rid = f"t-{uuid.uuid4().hex[:12]}"
            body = {"input_ids": p, "rid": rid, "sampling_params": {"max_new_tokens": ANSWER, "temperature": 0.0}}
            out = http_json(f"{url}/generate", body, timeout_s=300)
            served[rid] = (p, out["output_ids"])
            cached.append(out["meta_info"]["cached_tokens"])
            deadline = time.monotonic() + 60  # the hand-off puts a sample (and notes its record) after the answer
            while i == 1 and records() < 1 and time.monotonic() < deadline:
                time.sleep(0.2)
        assert records() == 1
    st = cap.stats()
    assert cached == [0, 0] + [128] * 6, cached
    assert (st["scheduler_written"], st["scheduler_incomplete"], st["scheduler_after_stored_prefix"]) == (8, 0, 6)
    assert st["scheduler_prefix_tokens_from_cache"] == 6 * 128
    root = tmp_path / "dd"
    assert eagle_io.Dataset.verify(root) == []
    ds = eagle_io.Dataset(root)
    (record,) = ds.prefix_records()
    assert record[1] == 128 and record[2] == "sha256:" + token_digest(system).hex()
    stored = _stored(root)
    assert sorted(stored) == sorted(served)
    for rid, (prompt, output) in served.items():
        item = stored[rid]
        assert item["input_ids"].tolist() == prompt + output[:-1]
        assert item["loss_mask"].tolist() == [0] * len(prompt) + [1] * (len(output) - 1)
        _held_to_hf(item, hf)


def test_only_sampled_requests_leave_a_trace_and_no_rate_changes_what_is_served(trained, chain, tmp_path):
    """Capture off, then rate 0 with one request flagged (``custom_params`` ``eagle_io_capture: true``), then rate 1
    with one request opted out (``false``) and an idle ``/health`` probe: the same greedy tokens in all three; rate 0
    stores only the flagged request, rate 1 all but the opted-out one and the probe; every request is counted."""
    url, _ = chain
    prompts = trained[3][:3]
    off = [o for _, o in _serve_all(url, prompts).values()]
    with ServerCapture(url, tmp_path / "r0", CaptureOptions(), live=LivePolicy(sample_rate=0.0)) as cap:
        r0 = _serve_all(url, prompts)
        flagged = f"t-{uuid.uuid4().hex[:12]}"
        _generate(url, prompts[0], flagged, custom_params={"eagle_io_capture": True})
    c0 = cap.stats()
    with ServerCapture(url, tmp_path / "r1", CaptureOptions(), live=LivePolicy(sample_rate=1.0)) as cap:
        with urllib.request.urlopen(f"{url}/health", timeout=120) as r:  # idle: SGLang runs a one-token request
            assert r.status == 200
        r1 = _serve_all(url, prompts)
        opted = f"t-{uuid.uuid4().hex[:12]}"
        _generate(url, prompts[1], opted, custom_params={"eagle_io_capture": False})
    c1 = cap.stats()
    assert [o for _, o in r0.values()] == off and [o for _, o in r1.values()] == off
    assert set(_stored(tmp_path / "r0")) == {flagged}
    assert (c0["scheduler_sampled"], c0["scheduler_not_sampled"], c0["scheduler_written"]) == (1, 3, 1)
    assert set(_stored(tmp_path / "r1")) == set(r1)
    assert (c1["scheduler_sampled"], c1["scheduler_opted_out"], c1["scheduler_written"]) == (3, 1, 3)
    assert c1["scheduler_health_checks"] == 1, "the /health probe is served, never sampled"


def test_a_full_ring_drops_and_counts_and_serving_never_waits(trained, chain, tmp_path):
    """A ring smaller than one prompt-plus-answer sample: every sampled request is still answered (the same tokens as
    before), each sample is dropped and counted, nothing is written, and the capture stays up."""
    url, _ = chain
    prompts = trained[3][:3]
    before = [o for _, o in _serve_all(url, prompts).values()]
    opts = CaptureOptions(ring_bytes=4096)  # a 16-token answer alone is 16 x (192 + 64) x 2 bytes of states
    with ServerCapture(url, tmp_path / "small", opts, live=LivePolicy(sample_rate=1.0)) as cap:
        during = [o for _, o in _serve_all(url, prompts).values()]
        deadline = time.monotonic() + 60  # the hand-off thread puts (and drops) a sample after its answer is sent
        while (status := capture_status(url)[0])["counts"]["dropped"] < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert status["state"] == "capturing" and status["counts"]["dropped"] == 3, status
    st = cap.stats()
    assert during == before
    assert (st["scheduler_sampled"], st["scheduler_dropped"], st["scheduler_written"]) == (3, 3, 0)


def test_a_full_disk_stops_the_capture_and_the_server_serves_on(trained, chain, tmp_path):
    """ENOSPC on the capture's shard writes (sticky, as a full disk): the capture stops with the error in its status,
    every request is still answered, and what was committed before verifies."""
    url, armed = chain
    if not armed:
        pytest.skip("no C compiler to build the test-only fault injector (tests/helpers/fault_inject.c)")
    out = tmp_path / DISK_FULL
    prompts = trained[3][:6]
    opts = CaptureOptions(writer_options={"shard_bytes": 4096})  # a shard per sample or so
    cap = ServerCapture(url, out, opts, live=LivePolicy(sample_rate=1.0))
    served = {}
    for p in prompts:  # one at a time: samples reach the writer in turn
        rid = f"t-{uuid.uuid4().hex[:12]}"
        served[rid] = _generate(url, p, rid)
        time.sleep(0.3)
    deadline = time.monotonic() + 60
    while (status := capture_status(url)[0])["state"] != "failed" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert status["state"] == "failed" and "No space left on device" in status["error"], status
    assert len(_generate(url, prompts[0], "after-the-disk-filled")) == ANSWER  # serving goes on
    with pytest.raises(StorageError, match="No space left on device"):
        cap.close()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is False
    assert eagle_io.Dataset.verify(out) == []
    stored = _stored(out)
    assert 0 < len(stored) < len(prompts) and set(stored) <= set(served)


def test_the_cli_starts_reports_and_stops_a_live_capture(trained, chain, tmp_path, capsys):
    """``eagle-io live start`` returns with the capture running; served requests are stored; ``live status`` shows
    them counted; ``live stop`` commits a complete dataset."""
    from eagle_io.cli import main

    url, _ = chain
    assert main(["live", "start", url, "--out", str(tmp_path / "cli"), "--rate", "1"]) == 0
    started = json.loads(capsys.readouterr().out)
    assert started["live"]["sample_rate"] == 1.0 and started["servers"] == [url]
    served = _serve_all(url, trained[3][:2])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert main(["live", "status", url]) == 0
        (status,) = json.loads(capsys.readouterr().out)
        if status["counts"]["written"] == 2:
            break
        time.sleep(0.5)
    assert status["state"] == "capturing" and status["counts"]["sampled"] == 2, status
    assert status["ring"]["ring_high_water_bytes"] > 0
    assert main(["live", "stop", url]) == 0
    (stopped,) = json.loads(capsys.readouterr().out)
    assert stopped["state"] == "stopped" and stopped["error"] is None
    assert json.loads((tmp_path / "cli" / "manifest.json").read_text())["complete"] is True
    assert set(_stored(tmp_path / "cli")) == set(served)
