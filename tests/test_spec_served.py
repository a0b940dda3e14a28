"""eval-draft's SGLang measurement without an engine: the prompts file, the parsing of SGLang's ``meta_info`` counts,
and the refusals that need no server (a URL that does not answer, a server without speculative decoding, a tree
asked of the reference decoder). The measurement itself against real SGLang engines and servers:
tests/test_sglang_spec.py."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar

import pytest
from helpers.s3server import free_port
from helpers.tiny_model import build_tiny_model_dir

from eagle_io.cli import main
from eagle_io.errors import DatasetFormatError, InvalidArgumentError, SGLangError
from eagle_io.spec.evaluate import read_prompts_file
from eagle_io.spec.served import _parse, engine_args, run_server


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(build_tiny_model_dir(tmp_path_factory.mktemp("tok"), layers=2))


def test_a_prompts_file_takes_ids_as_they_are_and_renders_messages_with_the_chat_template(tokenizer, tmp_path):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is a draft model?"}]
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"input_ids": [5, 6, 7]}) + "\n\n" + json.dumps({"messages": msgs}) + "\n")
    ids = read_prompts_file(f, tokenizer)
    text = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is a draft model?<|im_end|>\n"
    text += "<|im_start|>assistant\n"
    assert ids == [[5, 6, 7], tokenizer(text, add_special_tokens=False)["input_ids"]]
    assert tokenizer.decode(ids[1]) == text


@pytest.mark.parametrize(
    ("line", "what"),
    [
        ("{not json", "not UTF-8 JSON"),
        ('{"prompt": "hi"}', '"input_ids"'),
        ('{"input_ids": []}', "empty"),
        ('{"input_ids": [1, -2]}', "integer >= 0"),
        ('{"input_ids": [1, 2.5]}', "integer >= 0"),
        ('{"input_ids": [true]}', "integer >= 0"),
    ],
)
def test_a_bad_prompts_line_names_the_file_and_line(tokenizer, tmp_path, line, what):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"input_ids": [1]}) + "\n" + line + "\n")
    with pytest.raises(DatasetFormatError, match=rf"p\.jsonl: record 1 at byte offset 19: .*{what}"):
        read_prompts_file(f, tokenizer)


def test_sglang_counts_become_both_accept_lengths():
    outs = [
        {
            "output_ids": [1, 2, 3, 4, 5],
            "meta_info": {"completion_tokens": 5, "spec_verify_ct": 2, "spec_correct_drafts_histogram": [0, 1, 0, 1]},
        },
        {"output_ids": [9], "meta_info": {"completion_tokens": 1}},  # ended at its first token: no verify step
    ]
    tokens, completion, verify, hists = _parse(outs, 3, "here")
    assert tokens == [[1, 2, 3, 4, 5], [9]] and completion == [5, 1] and verify == [2, 0]
    assert hists[0].counts == [0, 1, 0, 1] and hists[1].verify_steps == 0
    bad = [
        {
            "output_ids": [1],
            "meta_info": {"completion_tokens": 3, "spec_verify_ct": 3, "spec_correct_drafts_histogram": [1, 1]},
        }
    ]
    with pytest.raises(SGLangError, match="counts 2 verify steps, spec_verify_ct says 3"):
        _parse(bad, 3, "here")
    with pytest.raises(SGLangError, match="here: request 0 answered without output_ids"):
        _parse([{"text": "hi"}], 3, "here")


def test_engine_args_bound_the_draft_tokens_as_sglang_does():
    a = engine_args("t", "d", num_steps=3)
    assert (a["speculative_eagle_topk"], a["speculative_num_draft_tokens"]) == (1, 4)
    assert engine_args("t", "d", num_steps=3, topk=4)["speculative_num_draft_tokens"] == 13
    with pytest.raises(InvalidArgumentError, match=r"--speculative-num-draft-tokens 100: .* at most 11 tokens"):
        engine_args("t", "d", num_steps=3, topk=2, draft_tokens=100)
    with pytest.raises(InvalidArgumentError, match="--speculative-eagle-topk 0: must be an integer >= 1"):
        engine_args("t", "d", topk=0)


class _Answer(BaseHTTPRequestHandler):
    body = b"{}"

    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


def test_a_url_that_does_not_serve_speculative_decoding_is_named():
    port = free_port()
    with pytest.raises(SGLangError, match=f"http://127.0.0.1:{port}/server_info: no answer"):
        run_server(f"http://127.0.0.1:{port}", [[1]], 4, timeout=5)
    srv = HTTPServer(("127.0.0.1", 0), type("A", (_Answer,), {"body": b'{"speculative_algorithm": null}'}))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_port}"
        with pytest.raises(SGLangError, match="speculative_algorithm None: the server runs no speculative decoding"):
            run_server(url, [[1]], 4, timeout=5)
    finally:
        srv.shutdown()


class _Gateway(BaseHTTPRequestHandler):
    """A stand-in of SMG's routes that eagle-io reads (the real gateway: tests/test_fleet.py): 404 at its root's
    ``/server_info``, its control plane's worker list and per-worker forward (``{status, latency_ms, body}``), and
    ``/generate``, which records what reached it."""

    workers: ClassVar[dict[str, dict]] = {}
    generated: ClassVar[list[dict]] = []

    def _send(self, status: int, obj) -> None:
        self.send_response(status)
        self.end_headers()
        self.wfile.write(json.dumps(obj).encode())

    def do_GET(self):
        if self.path == "/v1/rl/workers":
            return self._send(200, {"workers": [{"id": w, "url": f"http://{w}", "engine": "sglang", "health": "ready"}
                                                for w in self.workers]})  # fmt: skip
        parts = self.path.split("/")
        if self.path.startswith("/v1/rl/workers/") and parts[-1] == "server_info":
            return self._send(200, {"status": 200, "latency_ms": 1, "body": self.workers[parts[4]]})
        self._send(404, {"error": {"code": "unknown_url"}})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.generated.append(body)
        meta = {"completion_tokens": 4, "spec_verify_ct": 2, "spec_correct_drafts_histogram": [0, 2]}
        self._send(200, {"output_ids": [1, 2, 3, 4], "meta_info": meta})

    def log_message(self, *args):
        pass


def test_the_served_accept_length_through_a_gateway_reads_every_worker_and_sends_prompts_to_the_gateway():
    spec = {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 1, "speculative_eagle_topk": 1}
    handler = type("G", (_Gateway,), {"workers": {"w1": dict(spec), "w2": dict(spec)}, "generated": []})
    srv = HTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_port}"
        run = run_server(url, [[5, 6], [7]], 4, timeout=5)
        assert run.sglang_accept_length == 2.0
        assert sorted(g["input_ids"] for g in handler.generated) == [[5, 6], [7]]
        handler.workers["w2"]["speculative_num_steps"] = 3
        with pytest.raises(SGLangError, match=rf"{url} worker w2 \(http://w2\) serves speculative_num_steps 3, "
                                              rf"{url} worker w1 \(http://w1\) 1: one accept length"):  # fmt: skip
            run_server(url, [[1]], 4, timeout=5)
    finally:
        srv.shutdown()


@pytest.mark.parametrize(
    ("extra", "what"),
    [
        (["--speculative-eagle-topk", "4"], "chain drafts only"),
        (["--speculative-num-draft-tokens", "3"], "chain drafts only"),
        (["--engine", "sglang", "--server", "http://127.0.0.1:1"], "pick one"),
        (["--sglang-arg", "device=cpu"], "configures the engine of --engine sglang"),
        (["--speculative-eagle-topk", "0", "--engine", "sglang"], "must be an integer >= 1"),
    ],
)
def test_eval_draft_refuses_what_the_reference_decoder_cannot_measure(tmp_path, capsys, extra, what):
    capsys.readouterr()
    assert main(["eval-draft", "--draft", str(tmp_path), "--dataset", str(tmp_path), *extra]) == 2
    err = capsys.readouterr().err
    assert "InvalidArgumentError" in err and what in err, err
