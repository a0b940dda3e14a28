"""``eagle_io.capture("http://...")`` and ``eagle-io generate --server`` against a real CPU ``sglang.launch_server``
started with SGLang's own capture flags (``--enable-return-aux-hidden-states --speculative-algorithm EAGLE3``) and its
defaults otherwise: the radix cache on, chunked prefill on (32 tokens, so that every prompt here is split), float32.
The stored states are held to the Hugging Face reference forward over the same tokens (states stored in bfloat16:
max |difference| <= 1% of max |reference| per tensor; measured 0.2-0.4%). The fake server at the end tests the
client's own logic (retries, errors, routing), never SGLang's."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import pytest
import torch
from helpers.sglang_cpu import cpu_engine_env
from test_capture_session import FIXTURE, tiny_target
from test_serving_plugin import needs_sglang

import eagle_io
from eagle_io.capturing.sglang.protocol import capture_id
from eagle_io.errors import InvalidArgumentError, SGLangError
from eagle_io.sglang.servers import http_json

CPU = {"device": "cpu", "attention_backend": "torch_native", "disable_cuda_graph": True, "dtype": "float32"}
CPU |= {"max_total_tokens": 4096, "mem_fraction_static": 0.3, "chunked_prefill_size": 32, "log_level": "info"}


def tiny_checkpoint(where: Path):
    """The tiny float32 Llama target (8 layers, 64 wide) with SmolLM2's tokenizer saved as an HF checkpoint in
    ``where/tiny``, as the servers of these tests load it; returns the HF model (float32, eval)."""
    from eagle_io.data import load_default_tokenizer

    tok = load_default_tokenizer()
    model, _ = tiny_target(vocab=len(tok))
    model.save_pretrained(where / "tiny")
    tok.save_pretrained(where / "tiny")
    return model.float().eval()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One real CPU server for the module: ``(url, model directory, HF model)``."""
    from eagle_io.capturing.options import CaptureOptions
    from eagle_io.capturing.sglang.launch import launch_capture_server
    from eagle_io.sglang.servers import stop_server

    tmp = tmp_path_factory.mktemp("server")
    model = tiny_checkpoint(tmp)
    env = cpu_engine_env()
    root = tmp_path_factory.getbasetemp()  # the operator lets clients capture under this run's temporary directory
    url, proc = launch_capture_server(tmp / "tiny", CaptureOptions(), tmp / "server.log", capture_roots=[root], env=env,
                                      **CPU)  # fmt: skip
    try:
        yield url, tmp / "tiny", model
    finally:
        stop_server(proc)


def samples(n_tokens: list[int], seed: int = 0, first: int = 0) -> list[SimpleNamespace]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, n in enumerate(n_tokens):
        ids = torch.randint(10, 40000, (n,), generator=g)
        mask = (torch.rand(n, generator=g) > 0.5).long()
        mask[-1] = 1
        out.append(SimpleNamespace(index=first + i, id=f"s{first + i}", input_ids=ids, loss_mask=mask))
    return out


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def held_to_reference(out: Path, model) -> dict[int, dict]:
    """Every sample of ``out`` against the HF forward over its own tokens (and not within reach of the off-by-one
    layer sets); returns the items by sample id."""
    ds = eagle_io.Dataset(out)
    assert eagle_io.Dataset.verify(out) == [] and ds.manifest["complete"]
    items = {}
    for i in range(len(ds)):
        item, sid = ds[i], ds.entry(i).sample_id
        with torch.no_grad():
            hs = model(item["input_ids"][None], output_hidden_states=True).hidden_states
        aux = torch.cat([hs[j][0] for j in (2, 4, 5)], -1)  # SGLang's default [2, N//2, N-3] for 8 layers
        final = hs[-1][0]  # post-norm
        assert rel(item["aux_hidden_states"], aux) <= 0.01, sid
        assert rel(item["hidden_states"], final) <= 0.01, sid
        for off_by_one in ([1, 3, 4], [3, 5, 6]):  # the bound tells the neighbouring layer sets apart
            assert rel(item["aux_hidden_states"], torch.cat([hs[j][0] for j in off_by_one], -1)) > 0.2, sid
        items[sid] = item
    return items


@needs_sglang
@pytest.mark.slow
def test_prompts_are_captured_whole_with_chunked_prefill_and_the_radix_cache_on(server, tmp_path):
    """Prompts split over chunks, two of them sharing an 80-token prefix with a third (the radix cache would serve
    it), sent while plain requests of other users run: every prompt state is computed and stored, in order; the plain
    traffic leaves no trace; nothing was served from the cache."""
    url, _, model = server
    info = http_json(f"{url}/server_info")
    assert info["disable_radix_cache"] is False and info["chunked_prefill_size"] == 32  # SGLang's cache on
    todo = samples([5, 40, 100, 31, 64, 7])
    for j in (6, 7):
        ids = torch.cat([todo[2].input_ids[:80], torch.randint(10, 40000, (10,))])
        todo.append(SimpleNamespace(index=j, id=f"s{j}", input_ids=ids, loss_mask=torch.ones(90, dtype=torch.long)))
    plain = threading.Thread(
        target=lambda: [
            eagle_io.sglang.servers.http_json(
                f"{url}/generate",
                {"input_ids": todo[2].input_ids[:90].tolist(), "sampling_params": {"max_new_tokens": 4}},
            )
            for _ in range(3)
        ]
    )
    plain.start()
    with eagle_io.capture(url, tmp_path / "out", concurrency=3) as cap:
        cap.submit(todo[:4])
        cap.submit(todo[4:])
    plain.join()
    st = cap.stats()
    assert isinstance(cap, eagle_io.Capture) and cap.forward_seconds is None and cap.upload_report is None
    assert st["sent"] == 8 and st["prefix_tokens_reused"] == 0 and st["scheduler_written"] == 8
    assert st["scheduler_incomplete"] == st["scheduler_refused"] == 0
    items = held_to_reference(tmp_path / "out", model)
    assert sorted(items) == list(range(8))
    for s in todo:
        assert torch.equal(items[s.index]["input_ids"], s.input_ids)
        assert torch.equal(items[s.index]["loss_mask"], s.loss_mask.to(torch.uint8))
    meta = eagle_io.Dataset(tmp_path / "out").metadata
    assert meta["aux_layer_ids"] == [2, 4, 5] and meta["capture_backend"].startswith("sglang ")
    assert (meta["hidden_size"], meta["num_layers"], meta["dtype"]) == (64, 8, "bfloat16")
    assert cap.aux_layer_ids == [2, 4, 5]


@needs_sglang
@pytest.mark.slow
def test_a_system_prompt_the_samples_share_is_stored_once_and_served_from_the_cache(server, tmp_path):
    """Client-driven, shared prefixes stored once (the default): 6 samples, each a 128-token system prompt (loss mask
    0) and a 20-token turn of its own (mask 1), sent one at a time. The first two are computed whole (the second
    shares the system prompt with the first: its 128 tokens become a prefix record); SGLang serves each later one
    from its cache for exactly those 128 tokens (its own ``cached_tokens``), and it stores the rest. The dataset
    holds one prefix record, and every sample reads back whole, held to the HF forward."""
    from eagle_io.capturing.prefixes import token_digest
    from eagle_io.capturing.sglang.client import capture_status

    url, _, model = server
    g = torch.Generator().manual_seed(7)
    system = torch.randint(10, 40000, (128,), generator=g)
    mask = torch.cat([torch.zeros(128, dtype=torch.long), torch.ones(20, dtype=torch.long)])
    todo = [SimpleNamespace(index=i, id=f"s{i}", input_ids=torch.cat([system, torch.randint(10, 40000, (20,),
            generator=g)]), loss_mask=mask) for i in range(6)]  # fmt: skip
    with eagle_io.capture(url, tmp_path / "dd", concurrency=1) as cap:
        cap.submit(todo[:2])
        deadline = time.monotonic() + 60  # the hand-off notes the record once the second sample is in the ring
        while not (capture_status(url)[0]["prefixes"] or {}).get("records") and time.monotonic() < deadline:
            time.sleep(0.2)
        cap.submit(todo[2:])
    st = cap.stats()
    assert st["prefix_tokens_reused"] == 4 * 128 and st["scheduler_after_stored_prefix"] == 4, st
    assert st["scheduler_written"] == 6 and st["scheduler_incomplete"] == 0
    (record,) = eagle_io.Dataset(tmp_path / "dd").prefix_records()
    assert record[1] == 128 and record[2] == "sha256:" + token_digest(system).hex()
    items = held_to_reference(tmp_path / "dd", model)
    for s in todo:
        assert torch.equal(items[s.index]["input_ids"], s.input_ids)
        assert torch.equal(items[s.index]["loss_mask"], s.loss_mask.to(torch.uint8))


@needs_sglang
@pytest.mark.slow
def test_the_servers_own_answers_are_captured_in_the_same_request(server, tmp_path):
    """``max_new_tokens`` 12: each sample is its prompt plus the 11 first generated tokens (the 12th's state is never
    computed), the answer greedy-equal to the HF model's, the loss mask 1 over it, the decode forwards' states those
    of the HF forward over the whole sequence."""
    url, _, model = server
    todo = samples([16, 51, 3], seed=1)
    with eagle_io.capture(url, tmp_path / "ans", sampling_params={"max_new_tokens": 12, "temperature": 0}) as cap:
        cap.submit(todo)
    items = held_to_reference(tmp_path / "ans", model)
    for s in todo:
        item, n = items[s.index], len(s.input_ids)
        assert item["input_ids"].shape[0] == n + 11 and torch.equal(item["input_ids"][:n], s.input_ids)
        greedy = model.generate(s.input_ids[None], max_new_tokens=11, do_sample=False)[0, n:]
        assert torch.equal(item["input_ids"][n:], greedy)
        assert item["loss_mask"].tolist() == s.loss_mask.tolist() + [1] * 11


@needs_sglang
@pytest.mark.slow
def test_generate_server_then_resume(server, tmp_path):
    """``eagle-io generate --server URL`` on the real ShareGPT slice, then ``--resume`` to more records: only the
    missing samples are sent."""
    url, _, model = server
    out = tmp_path / "gen"
    base = [sys.executable, "-m", "eagle_io.cli", "generate", "--server", url, "--dataset", str(FIXTURE)]
    base += ["--out", str(out), "--max-length", "160", "--batch-size", "3"]
    r = subprocess.run([*base, "--limit", "5", "--summary-json", str(tmp_path / "a.json")], capture_output=True,
                       text=True, timeout=900)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    first = json.loads((tmp_path / "a.json").read_text())
    r = subprocess.run([*base, "--limit", "9", "--resume", "--summary-json", str(tmp_path / "b.json")],
                       capture_output=True, text=True, timeout=900)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    second = json.loads((tmp_path / "b.json").read_text())
    assert first["samples_written"] > 0 and second["already_committed_skipped"] == first["samples_written"]
    ds = eagle_io.Dataset(out)
    assert len(ds) == first["samples_written"] + second["samples_written"]
    held_to_reference(out, model)
    assert ds.metadata["target_model"]["model_id"] == "tiny" and ds.metadata["source_dataset"] == FIXTURE.name


@needs_sglang
@pytest.mark.slow
def test_the_preflight_names_what_the_server_cannot_capture(server, tmp_path):
    url, _, _ = server
    with pytest.raises(InvalidArgumentError, match=rf"{url} captures aux layers \[2, 4, 5\] .*not \[1, 4, 6\]"):
        eagle_io.capture(url, tmp_path / "x", aux_layer_ids=[1, 4, 6])
    from eagle_io.capturing.sglang.client import server_facts

    with pytest.raises(InvalidArgumentError, match=rf"{url} serves .*tiny, not the model asked for \(/elsewhere\)"):
        server_facts(url, model="/elsewhere")
    facts = server_facts(url)
    assert facts.target_info == {"num_layers": 8, "hidden_size": 64, "vocab_size": 49152,
                                 "architecture": "LlamaForCausalLM", "model_id": "tiny"}  # fmt: skip
    assert not list((tmp_path).iterdir()), "nothing written by a refused capture"


@needs_sglang
@pytest.mark.slow
def test_a_capture_whose_client_died_is_continued_by_its_user_and_refused_to_others(server, tmp_path, monkeypatch):
    """A client killed mid-capture (no close) leaves its capture running. Another user (who holds none of its
    secret) is refused, naming the operator's forced stop; the same user's ``resume=True`` proves the capture with
    the secret kept in its cache and continues it: the samples the dead client sent are not written again, and the
    close commits every sample once, complete."""
    url, _, model = server
    out = tmp_path / "orphan"
    dead = (
        "import os, sys, torch; sys.path.insert(0, sys.argv[3]); import eagle_io; from test_capture_server import "
        "samples; eagle_io.capture(sys.argv[1], sys.argv[2]).submit(samples([20, 30, 40])); os._exit(1)"
    )
    r = subprocess.run([sys.executable, "-c", dead, url, str(out), str(Path(__file__).parent)], capture_output=True,
                       text=True, timeout=300)  # fmt: skip
    assert r.returncode == 1, r.stderr[-2000:]
    with monkeypatch.context() as m:
        m.setenv("EAGLE_IO_CACHE", str(tmp_path / "another-user"))
        with pytest.raises(InvalidArgumentError, match=r"already capturing .*for another client .*stop_server_capture"):
            eagle_io.capture(url, out, resume=True)
    with eagle_io.capture(url, out, resume=True) as cap:
        cap.submit(samples([20, 30, 40, 50]))
    st = cap.stats()
    assert st["scheduler_already_done"] == 3 and st["scheduler_written"] == 4, st
    assert eagle_io.Dataset(out).manifest["complete"] is True
    assert sorted(held_to_reference(out, model)) == [0, 1, 2, 3]


# ------------------------------------------------------------------------------------- the client's own logic


class _Fake(http.server.BaseHTTPRequestHandler):
    """TEST-ONLY: answers as a one-rank eagle-io SGLang server would, with ``fail`` HTTP errors queued for
    /generate."""

    state: ClassVar[dict] = {}

    def log_message(self, *a):  # quiet
        pass

    def _send(self, code: int, body) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        st = self.state
        if self.path == "/model_info":
            return self._send(200, {"model_path": "/m/tiny", "tokenizer_path": None})
        target = {"architecture": "LlamaForCausalLM", "num_layers": 8, "hidden_size": 64, "vocab_size": 50000,
                  "layers": [2, 4, 5], "writers": 1, "writes": True, "capture_enabled": st.get("capture_enabled", True),
                  "speculative_algorithm": st.get("algorithm")}  # fmt: skip
        cap = {"target": target, **st["capture"]}
        return self._send(200, {**st["info"], "internal_states": [{"eagle_io_capture": cap} if st["plugin"] else {}]})

    def do_POST(self):
        st = self.state
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/set_internal_state":
            (key,) = body["server_args"]
            cmd = json.loads(key.removeprefix("eagle_io:"))
            cid = capture_id(cmd["token"])  # the status shows the capture's id, never its secret
            if cmd["op"] == "start":
                st["out_dir"] = cmd["out_dir"]
                st["capture"] = {"state": "failed", "id": cid, "error": st["start_error"]} if st[
                    "start_error"] else {"state": "capturing", "id": cid}  # fmt: skip
            else:
                st["capture"] = {**st["capture"], "state": "stopped", "stop_id": cid, "counts": {}}
            return self._send(200, [True])
        st["sent"].append(body)
        if st["fail"]:
            return self._send(st["fail"].pop(0), {"error": "busy"})
        if st.get("abort"):
            abort = {"type": "abort", "message": "Abort before prefill", "status_code": 200}
            return self._send(200, {"meta_info": {"cached_tokens": 0, "finish_reason": abort}})
        return self._send(200, {"meta_info": {"cached_tokens": 0}})


@pytest.fixture
def fake():
    _Fake.state = {"info": {"enable_return_aux_hidden_states": True, "pp_size": 1}, "plugin": True,
                   "capture": {"state": "idle"}, "start_error": None, "fail": [], "sent": []}  # fmt: skip
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Fake)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", _Fake.state
    srv.shutdown()


def test_requests_are_retried_with_backoff_and_a_failure_names_the_sample_and_url(fake, tmp_path):
    from eagle_io.capturing.options import CaptureOptions
    from eagle_io.capturing.sglang.client import ServerCapture

    url, st = fake
    st["fail"] = [503, 429]
    opts = CaptureOptions(dedup_prefixes=False)  # every sample whole: each request in a namespace of its own
    cap = ServerCapture(url, str(tmp_path / "o"), opts, retries=2, backoff_s=0.01, concurrency=2)
    cap.submit(samples([4, 6], first=3))
    assert cap.counts["retried"] == 2 and cap.counts["sent"] == 2 and len(st["sent"]) == 4
    keys = [b["extra_key"] for b in st["sent"]]
    assert len(set(keys)) == 4, "each attempt in its own radix-cache namespace"
    assert {b["sampling_params"]["custom_params"]["eagle_io_sample_id"] for b in st["sent"]} == {3, 4}
    st["fail"] = [400]
    with pytest.raises(SGLangError, match=rf"sample 9: {url}/generate: HTTP 400: .*busy.* \(after 1 attempt\(s\)\)"):
        cap.submit(samples([4], first=9))
    st["fail"] = [503, 503, 503]
    with pytest.raises(SGLangError, match=r"sample 10: .*HTTP 503.*after 3 attempt"):
        cap.submit(samples([4], first=10))
    cap.close()
    assert cap.answers and cap.answers[0]["state"] == "stopped"


def test_the_preflight_refuses_servers_it_cannot_capture_from(fake, tmp_path):
    url, st = fake
    st["plugin"] = False
    with pytest.raises(InvalidArgumentError, match=rf"cannot capture from {url}: it does not run eagle-io's SGLang"):
        eagle_io.capture(url, tmp_path / "o")
    st["plugin"], st["info"] = True, {"enable_return_aux_hidden_states": False, "pp_size": 2, "use_ray": True}
    with pytest.raises(InvalidArgumentError) as e:
        eagle_io.capture(url, tmp_path / "o")
    assert all(w in str(e.value) for w in ("pipeline parallelism (pp_size 2)", "Ray (--use-ray)"))
    st["info"] = {"enable_return_aux_hidden_states": True}
    st["capture_enabled"] = False  # a target that captures nothing: launched without EAGLE3
    with pytest.raises(InvalidArgumentError, match=rf"{url}: launch it with --speculative-algorithm EAGLE3"):
        eagle_io.capture(url, tmp_path / "o")
    st["algorithm"] = "EAGLE"  # the classic wrong flag for an EAGLE-3 draft: named, EAGLE3 asked for
    with pytest.raises(InvalidArgumentError, match=r"it runs --speculative-algorithm EAGLE, whose target captures no "
                       r"aux hidden states; launch it with --speculative-algorithm EAGLE3"):  # fmt: skip
        eagle_io.capture(url, tmp_path / "o")
    st["capture_enabled"], st["algorithm"] = True, "EAGLE3"  # serving an EAGLE-3 draft: live traffic is captured
    assert eagle_io.capturing.sglang.client.server_facts(url).target["speculative_algorithm"] == "EAGLE3"
    st["algorithm"] = None
    st["start_error"] = "InvalidArgumentError: aux_layer_ids [1] were asked for"
    with pytest.raises(InvalidArgumentError, match=rf"{url} DP rank 0: the capture's start failed: .*\[1\] were"):
        eagle_io.capture(url, tmp_path / "o")
    with pytest.raises(InvalidArgumentError, match="a server is named by its URL"):
        eagle_io.capture(["http://localhost:30000", 30001], tmp_path / "o")
    with pytest.raises(InvalidArgumentError, match="sampling_params are a server capture's"):
        eagle_io.capture(torch.nn.Linear(2, 2), tmp_path / "o", target_info={}, sampling_params={"max_new_tokens": 2})


def test_an_aborted_request_is_an_error_naming_the_sample_never_a_success(fake, tmp_path):
    """SGLang answers an aborted request (``/abort_request``, a disconnect) with HTTP 200 and ``finish_reason``
    ``abort``: nothing of it was stored, so ``submit`` raises naming the sample and does not count it done."""
    from eagle_io.capturing.options import CaptureOptions
    from eagle_io.capturing.sglang.client import ServerCapture

    url, st = fake
    cap = ServerCapture(url, str(tmp_path / "o"), CaptureOptions(), retries=0)
    st["abort"] = True
    with pytest.raises(SGLangError, match=rf"sample 5: {url}/generate: the server aborted the request \(Abort bef"):
        cap.submit(samples([4], first=5))
    assert 5 not in cap.done and cap.counts["sent"] == 0
    st["abort"] = False
    cap.submit(samples([4], first=5))
    assert 5 in cap.done and cap.counts["sent"] == 1
    cap.close()


def test_a_relative_out_dir_is_sent_as_the_clients_absolute_path(fake, tmp_path, monkeypatch):
    """The servers resolve a path in their own working directory: measured on a real CPU server before, ``eagle-io live
    start URL --out out/cli`` run in another directory than the server's wrote the dataset under the server's one
    (and printed ``"out": "out/cli"``)."""
    from eagle_io.capturing.options import CaptureOptions
    from eagle_io.capturing.sglang.client import ServerCapture

    url, st = fake
    monkeypatch.chdir(tmp_path)
    cap = ServerCapture(url, "rel/o", CaptureOptions())
    assert st["out_dir"] == cap.url == str(tmp_path / "rel" / "o")


def test_a_request_of_several_answers_is_refused_up_front(fake, tmp_path):
    """``n`` > 1: SGLang forks the request, each copy's prompt then served from the cache (counted incomplete) and a
    prompt-only sample stored in place of the answer asked for; refused before anything is started."""
    from eagle_io.capturing.options import CaptureOptions
    from eagle_io.capturing.sglang.client import ServerCapture

    url, st = fake
    with pytest.raises(InvalidArgumentError, match="sampling_params n=2: a sample request generates one answer"):
        ServerCapture(url, str(tmp_path / "o"), CaptureOptions(), sampling_params={"max_new_tokens": 4, "n": 2})
    assert st["capture"] == {"state": "idle"} and not st["sent"]


@pytest.mark.parametrize(
    ("given", "error"),
    [
        ("ftp://127.0.0.1:9/x", "SGLang servers answer over http:// or https://, not ftp://"),
        ("file:///tmp/server", "not file://"),
        ("not a server", "write it as http://HOST:PORT"),
    ],
)
def test_a_server_url_that_cannot_work_is_refused_before_anything_is_sent(tmp_path, capsys, given, error):
    """Before: generate --server ftp://... hung over two minutes and a URL without http:// failed with Python's
    'unknown url type'. Now the scheme is checked first, through the Python API and the CLI (exit 2)."""
    from eagle_io.cli import main

    with pytest.raises(InvalidArgumentError, match=error):
        eagle_io.capture(given, tmp_path / "a")
    assert main(["generate", "--server", given, "--out", str(tmp_path / "b"), "--dataset", str(FIXTURE)]) == 2
    assert error in capsys.readouterr().err
    assert main(["live", "status", given]) == 2
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_bare_host_port_is_read_as_http_and_a_silent_port_is_named_within_its_timeout(fake, tmp_path):
    """``localhost:PORT`` (no scheme) reaches the server; a port where something listens but never answers is named
    with the wait, after the timeout the caller set (before: the whole 600 s preflight)."""
    import socket
    import time

    from eagle_io.capturing.sglang.client import capture_status, server_facts

    url, _ = fake
    assert capture_status(url.removeprefix("http://"))[0]["state"] == "idle"
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        where = f"127.0.0.1:{silent.getsockname()[1]}"
        t0 = time.monotonic()
        with pytest.raises(SGLangError, match=rf"http://{where}/server_info: no answer within 1 s"):
            server_facts(where, timeout_s=1.0)
        assert time.monotonic() - t0 < 10


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ({"num_hidden_layers": 4, "hidden_size": 64, "vocab_size": 50000}, "num_layers 4 here, 8 served"),
        ({"num_hidden_layers": 8, "hidden_size": 128, "vocab_size": 32000},
         "hidden_size 128 here, 64 served; vocab_size 32000 here, 50000 served"),
    ],
)  # fmt: skip
def test_generate_refuses_a_model_that_is_not_the_one_served(fake, tmp_path, capsys, config, said):
    """Before: generate --server URL --model OTHER ran, recorded OTHER's tokenizer and produced token ids of another
    tokenizer than the states'. Now --model is compared with what the server serves, each difference named."""
    from eagle_io.cli import main
    from eagle_io.data import load_default_tokenizer

    url, _ = fake
    other = tmp_path / "other"
    load_default_tokenizer().save_pretrained(other)
    (other / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], **config}))
    argv = ["generate", "--server", url, "--model", str(other), "--out", str(tmp_path / "o"), "--dataset", str(FIXTURE),
            "--limit", "1"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--model {other} is not the model {url} serves (/m/tiny): {said}" in err, err
    assert not (tmp_path / "o").exists()
