"""The capture's control surface as an attacker meets it, on real CPU ``sglang.launch_server`` processes in capture-only
mode with eagle-io installed beside them (SGLang's defaults otherwise): one launched with ``--admin-api-key``, a
capture root and operator limits; one with ``--api-key`` only. Each kind of attack is tried on variants: where a client
may have the server write, samples a client did not make, stops by someone else, resuming another capture's dataset,
sizes over the operator's limits, memory left behind by start/stop cycles, hidden states asked for by plain clients,
and the keys themselves."""

from __future__ import annotations

import json
import os
import urllib.request
from types import SimpleNamespace

import pytest
import torch
from helpers.sglang_cpu import cpu_engine_env
from test_capture_server import CPU, samples
from test_capture_session import tiny_target
from test_serving_plugin import needs_sglang

import eagle_io
from eagle_io.capturing.options import CaptureOptions
from eagle_io.capturing.sglang.client import ServerCapture, capture_status, stop_server_capture
from eagle_io.capturing.sglang.protocol import KEY_PARAM, MASK_PARAM, SAMPLE_PARAM, control_args
from eagle_io.errors import InvalidArgumentError, SGLangError, StorageError

pytestmark = [needs_sglang, pytest.mark.slow]

ADMIN, API = "admin-key-for-tests", "api-key-for-tests"
LIMITS = {"ring_bytes": 512 << 20, "max_inflight": 8}


def _launch(tmp_path_factory, name: str, *flags: str, env: dict | None = None):
    from eagle_io.capturing.sglang.launch import launch_capture_server
    from eagle_io.data import load_default_tokenizer

    tmp = tmp_path_factory.mktemp(name)
    tok = load_default_tokenizer()
    model, _ = tiny_target(vocab=len(tok))
    model.save_pretrained(tmp / "tiny")
    tok.save_pretrained(tmp / "tiny")
    root = tmp / "root"
    root.mkdir()
    args = {**CPU, "chunked_prefill_size": -1}
    url, proc = launch_capture_server(tmp / "tiny", CaptureOptions(), tmp / "server.log", capture_roots=[root],
                                      env=cpu_engine_env(**(env or {})), **args, **dict(flags))  # fmt: skip
    return url, proc, root, model.float().eval()


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    """A server launched with --admin-api-key, a capture root and operator limits."""
    from eagle_io.sglang.servers import stop_server

    url, proc, root, model = _launch(tmp_path_factory, "keyed", ("admin_api_key", ADMIN),
                                     env={"EAGLE_IO_CAPTURE_LIMITS": json.dumps(LIMITS)})  # fmt: skip
    try:
        yield SimpleNamespace(url=url, proc=proc, root=root, model=model)
    finally:
        stop_server(proc)


def _raw(url: str, path: str, body: dict | None = None, key: str | None = None) -> tuple[int, object]:
    """An HTTP call as any client makes it: (status, JSON answer)."""
    req = urllib.request.Request(f"{url}{path}", None if body is None else json.dumps(body).encode(),
                                 {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key
                                                                        else {})})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def test_the_control_route_needs_the_admin_key_and_the_error_names_the_option(keyed, tmp_path):
    """Without the key: SGLang refuses the start (401) and the client's error names --admin-api-key; with a wrong
    one too. The status route stays readable (SGLang keeps /server_info open with only an admin key) and shows no
    secret."""
    with pytest.raises(SGLangError, match=r"HTTP 401: the server needs a key: pass --admin-api-key"):
        eagle_io.capture(keyed.url, keyed.root / "nokey")
    with pytest.raises(SGLangError, match=r"HTTP 401: the server refused the key sent: pass --admin-api-key"):
        eagle_io.capture(keyed.url, keyed.root / "wrongkey", admin_api_key="not-it")
    assert not (keyed.root / "nokey").exists() and not (keyed.root / "wrongkey").exists()
    with eagle_io.capture(keyed.url, keyed.root / "ok", admin_api_key=ADMIN) as cap:
        cap.submit(samples([9, 12]))
        (st,) = capture_status(keyed.url)
        info = json.dumps(_raw(keyed.url, "/server_info")[1])
        assert st["id"] == cap.capture_id and cap._secret not in info
        assert ADMIN not in info, "SGLang's /server_info handed out the admin key (redacted by eagle-io's plugin)"
    assert eagle_io.Dataset.verify(keyed.root / "ok") == [] and len(eagle_io.Dataset(keyed.root / "ok")) == 2


@pytest.mark.parametrize(
    ("where", "why"),
    [
        ("outside", "is under none of this server's capture roots"),
        ("dotdot", "has a '..' component"),
        ("symlink", "is under none of this server's capture roots"),
        ("relative", "is relative"),
        ("scheme", "only local paths and s3:// URLs"),
    ],
)
def test_a_start_outside_the_operators_root_is_refused_and_creates_nothing(keyed, tmp_path, where, why):
    """Before: a raw start made the server create a dataset wherever the client said, '..' and relative paths
    included. Now each variant is refused, naming why, and nothing is created."""
    outside = tmp_path / "elsewhere"
    (keyed.root / "link").unlink(missing_ok=True)
    (keyed.root / "link").symlink_to(tmp_path)
    out_dir = {
        "outside": str(outside / "ds"),
        "dotdot": f"{keyed.root}/../escaped",
        "symlink": str(keyed.root / "link" / "ds"),
        "relative": "relative/ds",
        "scheme": "file:///tmp/ds",
    }[where]
    cmd = control_args("start", "s" * 64, out_dir=out_dir, options=CaptureOptions().to_dict())
    status, taken = _raw(keyed.url, "/set_internal_state", {"server_args": cmd}, key=ADMIN)
    assert status == 200 and taken == [True]  # taken for its thread; the refusal is in the status
    (st,) = _wait_state(keyed.url, {"failed"})
    assert why in st["error"], st
    assert not outside.exists() and not (tmp_path / "ds").exists() and not (keyed.root.parent / "escaped").exists()


def _wait_state(url: str, states: set[str], timeout_s: float = 60) -> list[dict]:
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        st = capture_status(url)
        if all(s["state"] in states for s in st) or time.monotonic() > deadline:
            return st
        time.sleep(0.2)


def test_options_over_the_operators_limits_or_outside_the_allow_list_are_refused(keyed):
    """A ring of 8 GiB allocated 8 GiB in the scheduler; metadata of the client's own reached the manifest. Now the
    operator's limits bound the client's, with the figures, and client options are an allow-list."""
    from eagle_io.capturing.sglang.live import LivePolicy

    cases = [
        (CaptureOptions(ring_bytes=8 << 30), None, "ring_bytes 8,589,934,592 > 536,870,912"),
        (CaptureOptions(), LivePolicy(sample_rate=1.0, max_inflight=100), "max_inflight 100 > 8"),
        (CaptureOptions(metadata={"pwned": "yes"}), None, "metadata key(s) ['pwned'] cannot be set by a remote"),
        (CaptureOptions(writer_options={"staging": "/tmp/x"}), None, "writer option(s) ['staging'] cannot be set"),
    ]
    for i, (opts, live, why) in enumerate(cases):
        with pytest.raises(InvalidArgumentError, match=f"the capture's start failed: .*{why}".replace("[", r"\[")
                           .replace("(", r"\(").replace(")", r"\)")):  # fmt: skip
            ServerCapture(keyed.url, keyed.root / f"limit{i}", opts, live=live, admin_api_key=ADMIN)
        assert not (keyed.root / f"limit{i}").exists()


def test_samples_are_made_only_by_the_captures_own_client(keyed):
    """Before: a plain /generate carrying eagle_io_sample_id 4 replaced the legitimate sample 4 (other tokens, an
    all-one mask). Now requests with eagle-io's parameters but not the capture's proof are served, counted
    foreign_params and never stored, on /generate and on /v1/chat/completions; the client's own sample 4 is stored
    as sent."""
    mine = samples([7, 11, 13, 17, 19], seed=3)
    foreign = {SAMPLE_PARAM: 4, MASK_PARAM: [1] * 5, KEY_PARAM: "forged"}
    with eagle_io.capture(keyed.url, keyed.root / "mine", admin_api_key=ADMIN) as cap:
        status, out = _raw(keyed.url, "/generate", {"input_ids": [5, 6, 7, 8, 9], "sampling_params": {
            "max_new_tokens": 2, "custom_params": foreign}})  # fmt: skip
        assert status == 200 and len(out["output_ids"]) == 2  # served
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                "custom_params": {**foreign, MASK_PARAM: [1] * 64}}  # fmt: skip
        status, out = _raw(keyed.url, "/v1/chat/completions", chat)
        assert status == 200 and out["choices"][0]["message"] is not None
        cap.submit(mine)
    st = cap.stats()
    assert st["scheduler_foreign_params"] == 2 and st["scheduler_written"] == 5, st
    ds = eagle_io.Dataset(keyed.root / "mine")
    item = ds[ds.position(4)]
    assert torch.equal(item["input_ids"], mine[4].input_ids) and ds.entry(ds.position(4)).key == "s4"


def test_a_stop_needs_the_secret_or_the_admin_key_and_a_forced_stop_ends_the_capture_incomplete(keyed):
    """Before: the capture token was shown in /server_info, a second client stopped the first one's capture with
    it, and the manifest said complete over part of the samples. Now /server_info shows the id only; a stop with
    another secret is not taken; the operator's forced stop (admin key) ends it incomplete, and its client's close
    names the forced stop and how many samples it sent were not stored."""
    cap = ServerCapture(keyed.url, keyed.root / "stopped", CaptureOptions(), admin_api_key=ADMIN)
    cap.submit(samples([8, 9, 10]))
    cmd = control_args("stop", "a guess", complete=True)
    _, taken = _raw(keyed.url, "/set_internal_state", {"server_args": cmd}, key=ADMIN)
    assert taken == [False] and capture_status(keyed.url)[0]["state"] == "capturing"
    (forced,) = stop_server_capture(keyed.url, timeout_s=120, complete=True, admin_api_key=ADMIN)
    assert forced["state"] == "stopped" and forced["forced"] is True
    with pytest.raises(StorageError, match=r"ended by a forced stop .*: 0 of the 3 samples sent were not stored"):
        cap.close()
    manifest = json.loads((keyed.root / "stopped" / "manifest.json").read_text())
    assert manifest["complete"] is False and sum(s["samples"] for s in manifest["shards"]) == 3


def test_a_resume_into_another_captures_dataset_is_refused(keyed, monkeypatch, tmp_path):
    """Before: with resume among the writer options, a client appended samples to someone else's complete dataset.
    Now a resume proves its secret (the dataset records its owner's digest): another client's is refused, the
    dataset untouched; the owner resumes."""
    out = keyed.root / "owned"
    with eagle_io.capture(keyed.url, out, admin_api_key=ADMIN) as cap:
        cap.submit(samples([6, 7]))
    before = (out / "manifest.json").read_bytes()
    monkeypatch.setenv("EAGLE_IO_CACHE", str(tmp_path / "another-user"))  # knows no secret of this capture
    with pytest.raises(InvalidArgumentError, match=r"was written by another capture .*capture_owner differs"):
        eagle_io.capture(keyed.url, out, admin_api_key=ADMIN, resume=True)
    assert (out / "manifest.json").read_bytes() == before
    monkeypatch.undo()
    with eagle_io.capture(keyed.url, out, admin_api_key=ADMIN, resume=True) as cap:
        cap.submit(samples([6, 7, 8]))
    assert len(eagle_io.Dataset(out)) == 3


def test_start_stop_cycles_give_the_ring_back(keyed):
    """Before: every start/stop cycle leaked its ring (256 MiB at the default) until the server restarted. After 10
    cycles of a 64 MiB ring the scheduler's RSS is within 64 MiB of where it started, and so is its virtual size
    (the ring is zeroed memory, resident only where samples were written: 10 leaked rings are 640 MiB of address
    space whatever was touched)."""
    import psutil

    sched = max(psutil.Process(keyed.proc.pid).children(recursive=True), key=lambda p: p.memory_info().rss)
    with eagle_io.capture(keyed.url, keyed.root / "warm", admin_api_key=ADMIN, ring_bytes=64 << 20) as cap:
        cap.submit(samples([5]))
    start = sched.memory_info()
    for i in range(10):
        with eagle_io.capture(keyed.url, keyed.root / f"cycle{i}", admin_api_key=ADMIN, ring_bytes=64 << 20) as cap:
            cap.submit(samples([5]))
    end = sched.memory_info()
    rss, vms = (end.rss - start.rss) / 2**20, (end.vms - start.vms) / 2**20
    assert rss < 64 and vms < 64, f"the scheduler grew {rss:.0f} MiB resident, {vms:.0f} MiB virtual over 10 cycles"


def test_a_plain_client_gets_no_hidden_states_from_a_capture_server(keyed):
    """Before: on a server launched with the flags eagle-io documents for capture, a plain request with
    return_hidden_states got hidden states back. Now it is answered without them and counted, on /generate and on
    /v1/chat/completions."""
    before = capture_status(keyed.url)[0]["hidden_states_refused"]
    status, out = _raw(keyed.url, "/generate", {"input_ids": [5, 6, 7], "return_hidden_states": True,
                                                 "sampling_params": {"max_new_tokens": 2}})  # fmt: skip
    assert status == 200 and not out["meta_info"].get("hidden_states"), out["meta_info"].keys()
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "return_hidden_states": True}  # fmt: skip
    status, out = _raw(keyed.url, "/v1/chat/completions", chat)
    assert status == 200 and not out["choices"][0].get("hidden_states"), out["choices"][0].keys()
    assert capture_status(keyed.url)[0]["hidden_states_refused"] == before + 2


def test_a_server_with_only_an_api_key(tmp_path_factory):
    """--api-key alone guards every route: the client works with the key (sent on inference and control alike), a
    request without it is refused and the error names --api-key."""
    from eagle_io.sglang.servers import stop_server

    url, proc, root, _ = _launch(tmp_path_factory, "apikey", ("api_key", API))
    try:
        with pytest.raises(SGLangError, match=r"HTTP 401: the server needs a key: pass --api-key"):
            eagle_io.capture(url, root / "nokey")
        with eagle_io.capture(url, root / "ok", api_key=API) as cap:
            cap.submit(samples([9, 10]))
        assert len(eagle_io.Dataset(root / "ok")) == 2
        os.environ.pop("EAGLE_IO_API_KEY", None)
        assert _raw(url, "/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}})[0] == 401
    finally:
        stop_server(proc)
