"""Capture through SGLang's gateway (SMG, ``smg launch --enable-rl``) in front of two real CPU SGLang workers
(capture-only mode, the tiny float32 target of test_capture_server.py), keys set as a fleet operator sets them: the
workers take the gateway's key (``--api-key K``), the gateway takes ``K`` for inference and a control-plane key of
the admin role. eagle-io reaches each worker through the gateway's control plane, and sends samples (and the served
traffic goes) through the gateway's ``/generate`` and ``/v1/chat/completions``."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from types import SimpleNamespace

import pytest
import torch
from helpers.gateway import launch_gateway, smg_binary
from helpers.sglang_cpu import cpu_engine_env
from test_capture_server import CPU, held_to_reference, samples, tiny_checkpoint
from test_capture_session import FIXTURE
from test_serving_plugin import needs_sglang

import eagle_io
from eagle_io.capturing.sglang.client import capture_status
from eagle_io.errors import InvalidArgumentError, SGLangError, StorageError
from eagle_io.sglang.servers import ServerKeys, http_json, stop_server

pytestmark = [
    needs_sglang,
    pytest.mark.slow,
    pytest.mark.skipif(smg_binary() is None, reason="SGLang's gateway (smg) is not installed"),
]

KEY, CONTROL = "fleet-inference-key", "fleet-control-key"
KEYS = {"api_key": KEY, "admin_api_key": CONTROL}


def _worker(tmp, i: int):
    """A CPU SGLang worker of the tiny target, launched as the fleet's workers are: ``(url, process)``."""
    from eagle_io.capturing.options import CaptureOptions
    from eagle_io.capturing.sglang.launch import launch_capture_server

    return launch_capture_server(tmp / "tiny", CaptureOptions(), tmp / f"worker{i}.log", capture_roots=[tmp.parent],
                                 env=cpu_engine_env(), api_key=KEY, **CPU)  # fmt: skip


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Two workers and a gateway: ``gateway`` (its URL), ``workers`` ({url: process}, a worker added by a test is
    added there and stopped here), ``model`` (the HF reference), ``model_dir``, ``tmp``."""
    tmp = tmp_path_factory.mktemp("fleet")
    model = tiny_checkpoint(tmp)
    workers, procs = {}, []
    try:
        for i in range(2):
            url, proc = _worker(tmp, i)
            workers[url] = proc
        gateway, gw = launch_gateway(list(workers), tmp / "gateway.log", api_key=KEY, control_key=CONTROL)
        procs.append(gw)
        yield SimpleNamespace(gateway=gateway, workers=workers, model=model, model_dir=tmp / "tiny", tmp=tmp)
    finally:
        for p in [*workers.values(), *procs]:
            stop_server(p)


def _writers(out) -> dict[int, int]:
    """Samples per writer rank of a merged dataset (its shards are named ``r{rank}-...``)."""
    ds, per = eagle_io.Dataset(out), {}
    for s in ds.manifest["shards"]:
        rank = int(s["file"].split("/")[-1][1:6])
        per[rank] = per.get(rank, 0) + s["samples"]
    return per


def test_generate_through_the_gateway_stores_every_sample_once_from_both_workers(fleet, tmp_path):
    """``eagle-io generate --server GATEWAY`` on the real ShareGPT slice: one dataset, one writer per worker, every
    sample once, each held to the HF reference forward; both workers wrote some; ``--resume`` to more records sends
    only the missing ones."""
    gateway, model = fleet.gateway, fleet.model
    out = tmp_path / "gen"
    cmd = [sys.executable, "-m", "eagle_io.cli", "generate", "--server", gateway, "--dataset", str(FIXTURE),
           "--out", str(out), "--max-length", "160", "--batch-size", "4", "--limit", "12", "--concurrency", "2",
           "--summary-json", str(tmp_path / "s.json"), "--api-key", KEY, "--admin-api-key", CONTROL]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((tmp_path / "s.json").read_text())
    items = held_to_reference(out, model)
    assert len(items) == summary["samples_written"] > 4
    per = _writers(out)
    assert sorted(per) == [0, 1] and min(per.values()) >= 1 and sum(per.values()) == len(items), per
    assert eagle_io.Dataset(out).manifest["complete"]
    # --resume through the gateway to more records: only the missing samples are sent, wherever the gateway routes them
    more = [*cmd[: cmd.index("--limit")], "--limit", "18", "--resume", *cmd[cmd.index("--limit") + 2 :]]
    r = subprocess.run(more, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    again = json.loads((tmp_path / "s.json").read_text())
    assert again["already_committed_skipped"] == len(items) and again["samples_written"] > 0
    assert len(held_to_reference(out, model)) == len(items) + again["samples_written"]


def test_samples_sent_through_the_gateway_are_stored_whole_and_the_status_shows_each_worker(fleet, tmp_path):
    """``eagle_io.capture(GATEWAY)``: prompts sharing a prefix (the radix cache would serve it) are computed and
    stored whole; ``capture_status(GATEWAY)`` lists every worker's rank."""
    gateway, model = fleet.gateway, fleet.model
    todo = samples([40, 100, 31, 64, 7, 90])
    for j in (6, 7):  # SGLang's radix cache would serve their first 80 tokens from sample 1's request
        ids = torch.cat([todo[1].input_ids[:80], torch.randint(10, 40000, (10,))])
        todo.append(SimpleNamespace(index=j, id=f"s{j}", input_ids=ids, loss_mask=torch.ones(90, dtype=torch.long)))
    with eagle_io.capture(gateway, tmp_path / "out", concurrency=2, **KEYS) as cap:
        assert len(cap.servers) == 2 and all(gateway in s.url and "worker" in s.url for s in cap.servers)
        status = capture_status(gateway, **KEYS)
        assert len(status) == 2 and {s["state"] for s in status} == {"capturing"}
        cap.submit(todo[:6])
        cap.submit(todo[6:])
    st = cap.stats()  # the gateway forwards each request's extra_key (its radix namespace): nothing served from cache
    assert st["sent"] == 8 and st["prefix_tokens_reused"] == 0 and st["scheduler_written"] == 8
    items = held_to_reference(tmp_path / "out", model)
    for s in todo:
        assert torch.equal(items[s.index]["input_ids"], s.input_ids)
    assert {s["state"] for s in capture_status(gateway, **KEYS)} == {"stopped"}


def test_live_capture_through_the_gateway_stores_what_its_clients_were_answered(fleet, tmp_path):
    """``eagle-io live start GATEWAY --rate 1``: requests to the gateway's ``/generate`` and
    ``/v1/chat/completions`` are stored as answered (prompt + answer but its last token); one that opts out through
    ``custom_params`` (``extra_body`` of the OpenAI route) is not; ``live status`` shows both workers; ``live stop``
    merges one dataset."""
    gateway, model, model_dir = fleet.gateway, fleet.model, fleet.model_dir
    out = tmp_path / "live"
    cli = [sys.executable, "-m", "eagle_io.cli", "live"]
    keys = ["--api-key", KEY, "--admin-api-key", CONTROL]
    r = subprocess.run([*cli, "start", gateway, "--out", str(out), "--rate", "1", *keys], capture_output=True,
                       text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["writers"] == 2
    inference = ServerKeys(api_key=KEY)
    g = torch.Generator().manual_seed(3)
    served = {}
    for i in range(6):
        prompt, rid = torch.randint(10, 40000, (12 + 7 * i,), generator=g).tolist(), f"fleet-{uuid.uuid4().hex[:8]}"
        body = {"input_ids": prompt, "rid": rid, "sampling_params": {"max_new_tokens": 6, "temperature": 0.0}}
        served[rid] = (prompt, http_json(f"{gateway}/generate", body, timeout_s=300, keys=inference)["output_ids"])
    chat = {"model": str(model_dir), "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 5,
            "temperature": 0.0}  # fmt: skip
    answer = http_json(f"{gateway}/v1/chat/completions", chat, timeout_s=300, keys=inference)
    opted_out = {**chat, "custom_params": {"eagle_io_capture": False}}
    http_json(f"{gateway}/v1/chat/completions", opted_out, timeout_s=300, keys=inference)
    r = subprocess.run([*cli, "status", gateway, *keys], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    status = json.loads(r.stdout)
    assert len(status) == 2 and {s["state"] for s in status} == {"capturing"}
    assert sum(s["counts"]["opted_out"] for s in status) == 1
    r = subprocess.run([*cli, "stop", gateway, *keys], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    ds = eagle_io.Dataset(out)
    stored = {ds.entry(i).key: ds[i] for i in range(len(ds))}
    assert len(stored) == 7, sorted(stored)  # 6 /generate + 1 chat; the opted-out chat left no trace
    for rid, (prompt, output) in served.items():
        assert stored[rid]["input_ids"].tolist() == prompt + output[:-1]
    chat_keys = [k for k in stored if k not in served]
    assert len(chat_keys) == 1 and answer["usage"]["completion_tokens"] == 5
    assert sorted(_writers(out)) == [0, 1]
    held_to_reference(out, model)


def test_a_gateway_without_its_control_plane_is_named_with_the_flag_to_add(fleet, tmp_path):
    gateway, tmp = fleet.gateway, fleet.tmp
    workers = [w["url"] for w in http_json(f"{gateway}/v1/rl/workers", keys=ServerKeys(admin_api_key=CONTROL),
                                           control=True)["workers"]]  # fmt: skip
    plain, proc = launch_gateway(workers, tmp / "plain-gateway.log", api_key=KEY, control_plane=False)
    try:
        with pytest.raises(InvalidArgumentError, match=r"relaunch it with --enable-rl"):
            eagle_io.capture(plain, tmp_path / "x", **KEYS)
        with pytest.raises(SGLangError, match=r"HTTP 401: the server refused the key sent: pass --admin-api-key"):
            eagle_io.capture(gateway, tmp_path / "y", api_key=KEY, admin_api_key="not-the-control-key")
    finally:
        stop_server(proc)
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_swap_draft_through_the_gateway_goes_worker_by_worker_and_says_who_was_left(fleet, tmp_path_factory):
    """``eagle-io swap-draft GATEWAY --draft D`` reaches each worker through the control plane, one at a time: these
    capture-only workers serve no draft, so the first refuses before anything is sent, and the message names the
    worker not tried (the swap itself, on a real EAGLE3 server: tests/test_serving_swap.py)."""
    from helpers.spec_fixture import shared_spec_fixture

    gateway = fleet.gateway
    draft = shared_spec_fixture(tmp_path_factory)[2]
    cmd = [sys.executable, "-m", "eagle_io.cli", "swap-draft", gateway, "--draft", str(draft), "--api-key", KEY,
           "--admin-api-key", CONTROL]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert r.returncode == 2, r.stderr[-3000:]
    first, second = (w["url"] for w in capture_status(gateway, **KEYS))
    assert f"{first} serves no draft" in r.stderr and "swapped before it: none" in r.stderr, r.stderr
    assert f"not tried, still serving their draft: {second}" in r.stderr, r.stderr


def _serve(gateway: str, n: int, seed: int) -> dict[str, tuple[list[int], list[int]]]:
    """``n`` greedy ``/generate`` requests through the gateway, as its users send them: ``{rid: (prompt, output)}``."""
    g, served = torch.Generator().manual_seed(seed), {}
    for i in range(n):
        prompt, rid = torch.randint(10, 40000, (12 + 5 * i,), generator=g).tolist(), f"fleet-{uuid.uuid4().hex[:8]}"
        body = {"input_ids": prompt, "rid": rid, "sampling_params": {"max_new_tokens": 4, "temperature": 0.0}}
        out = http_json(f"{gateway}/generate", body, timeout_s=300, keys=ServerKeys(api_key=KEY))["output_ids"]
        served[rid] = (prompt, out)
    return served


def test_a_worker_added_to_the_gateway_joins_the_live_capture_and_an_offline_one(fleet, tmp_path):
    """A third worker added to the gateway (SMG's ``POST /workers``) during a live capture serves without capturing
    until ``eagle-io live join GATEWAY`` starts the capture on it (the same policy, writer rank 2); every request the
    gateway's clients were answered after the join is stored once, by the three writers. Removed and added again
    during an offline capture, it joins that one at the next submit; every sample is stored once, held to the HF
    reference. ``generate --server GATEWAY --resume`` continues a 2-worker capture through the 3 workers."""
    from helpers.gateway import add_worker, remove_worker

    gateway, model = fleet.gateway, fleet.model
    cli, keys = [sys.executable, "-m", "eagle_io.cli"], ["--api-key", KEY, "--admin-api-key", CONTROL]
    gen = [*cli, "generate", "--server", gateway, "--dataset", str(FIXTURE), "--out", str(tmp_path / "gen"),
           "--max-length", "160", "--batch-size", "4", "--concurrency", "2", "--summary-json",
           str(tmp_path / "s.json"), *keys]  # fmt: skip
    r = subprocess.run([*gen, "--limit", "6"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    first = json.loads((tmp_path / "s.json").read_text())["samples_written"]
    r = subprocess.run([*cli, "live", "start", gateway, "--out", str(tmp_path / "live"), "--rate", "1", *keys],
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    served = _serve(gateway, 3, seed=11)
    url, proc = _worker(fleet.tmp, 2)
    fleet.workers[url] = proc
    add_worker(gateway, url, CONTROL, api_key=KEY)
    states = {s["url"]: s["state"] for s in capture_status(gateway, **KEYS)}
    assert sorted(states.values()) == ["capturing", "capturing", "idle"] and states[next(iter(
        u for u in states if url in u))] == "idle", states  # fmt: skip
    r = subprocess.run([*cli, "live", "join", gateway, *keys], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    joined = json.loads(r.stdout)[0]
    assert len(joined["joined"]) == 1 and url in joined["joined"][0] and joined["writers"] == 3, joined
    status = {s["url"]: s for s in capture_status(gateway, **KEYS)}
    new = next(s for u, s in status.items() if url in u)
    assert new["state"] == "capturing" and new["writer_rank"] == 2 and new["live"]["sample_rate"] == 1.0
    served.update(_serve(gateway, 9, seed=12))
    r = subprocess.run([*cli, "live", "stop", gateway, *keys], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    ds = eagle_io.Dataset(tmp_path / "live")
    stored = {ds.entry(i).key: ds[i] for i in range(len(ds))}
    assert sorted(stored) == sorted(served)
    for rid, (prompt, output) in served.items():
        assert stored[rid]["input_ids"].tolist() == prompt + output[:-1]
    assert sorted(_writers(tmp_path / "live")) == [0, 1, 2] and ds.manifest["complete"]
    # The same dataset --resume'd by 3 workers: the new records only, and every sample held to the reference.
    r = subprocess.run([*gen, "--limit", "12", "--resume"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    again = json.loads((tmp_path / "s.json").read_text())
    assert again["already_committed_skipped"] == first and again["samples_written"] > 0
    assert len(held_to_reference(tmp_path / "gen", model)) == first + again["samples_written"]
    # an offline capture: the worker leaves the gateway, then joins it again between two submits
    remove_worker(gateway, url, CONTROL)
    todo = samples([20, 30, 40, 50, 60, 70, 25, 35, 45, 55], seed=9)
    with eagle_io.capture(gateway, tmp_path / "off", concurrency=2, **KEYS) as cap:
        cap.submit(todo[:3])
        assert cap.writers == 2 and cap.joined == []
        add_worker(gateway, url, CONTROL, api_key=KEY)
        cap.submit(todo[3:])
        assert len(cap.joined) == 1 and url in cap.joined[0].url and cap.writers == 3
    items = held_to_reference(tmp_path / "off", model)
    assert sorted(items) == list(range(10))
    assert eagle_io.Dataset(tmp_path / "off").manifest["complete"]


def test_a_worker_lost_mid_capture_is_reported_the_others_commit_and_a_resume_by_fewer_completes_it(fleet, tmp_path):
    """Runs last (it stops a worker): a capture through the gateway's three workers, the one writing rank 2 killed
    after some samples; the close commits the others', merges what all committed (marked incomplete), and raises
    naming the lost worker; the status never hangs on it. The operator removes it from the gateway; a resume through
    the two left sends only what is missing, and completes the dataset (rank 2's manifest, which no writer
    continues, closed by the client)."""
    from helpers.gateway import remove_worker

    gateway = fleet.gateway
    todo = samples([20, 30, 40, 50, 60, 70, 25, 35, 45], seed=5)
    cap = eagle_io.capture(gateway, tmp_path / "lost", concurrency=2, **KEYS)
    assert cap.writers == 3
    cap.submit(todo[:6])
    last = max(capture_status(gateway, **KEYS), key=lambda s: s["writer_rank"])
    url = next(u for u in fleet.workers if u in last["url"])
    stop_server(fleet.workers[url], timeout_s=30)
    with pytest.raises(StorageError, match=r"1 worker\(s\) left the gateway during the capture .*worker .*resume"):
        cap.close(timeout_s=300)
    ds = eagle_io.Dataset(tmp_path / "lost")
    assert ds.manifest["complete"] is False and eagle_io.Dataset.verify(tmp_path / "lost") == []
    kept = {ds.entry(i).sample_id for i in range(len(ds))}
    assert kept <= set(range(6)), kept
    # the gateway lists the killed worker until its health checks fail: shown as lost, with the gateway's error
    states = sorted(s["state"] for s in capture_status(gateway, **KEYS))
    assert states in (["stopped", "stopped"], ["lost", "stopped", "stopped"]), states
    remove_worker(gateway, url, CONTROL)
    with eagle_io.capture(gateway, tmp_path / "lost", concurrency=2, resume=True, **KEYS) as again:
        assert again.writers == 2
        again.submit(todo)
    st = again.stats()
    assert st["already_done"] == len(kept) and st["sent"] == len(todo) - len(kept)
    ds = eagle_io.Dataset(tmp_path / "lost")
    assert sorted(ds.entry(i).sample_id for i in range(len(ds))) == list(range(9)) and ds.manifest["complete"]
    assert eagle_io.Dataset.verify(tmp_path / "lost") == []
    assert any("manifest.r00002.json: closed complete by the client" in w for w in again.merge_warnings), (
        again.merge_warnings
    )
