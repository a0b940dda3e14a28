"""``swap-draft`` against real CPU ``sglang.launch_server`` processes (SGLang 0.5.23, the test-only ``sgl_kernel``):
one server serving the tiny target's draft v0 under EAGLE3 for the whole module, v1 trained on the same data with
``train-draft --keep-vocab-map v0``, a fresh server launched with v1 as the oracle of what "exactly v1" serves, and a
plain (capture-only, no draft) server for the refusal that needs one.

* refusals before anything is sent (another target, other widths, other layer ids, another vocab map, NaN weights, a
  truncated file, a server without a draft): one line each, ``sent`` False, the served draft's checksums unchanged,
  the server healthy;
* a swap to v1 while 4 requests are in flight: every answer is the target's own greedy continuation, answered by the
  old draft (its ``weight_version``); afterwards each request's ``spec_verify_ct`` equals the fresh v1 server's;
* ``eagle-io swap-draft`` swaps v0 back: the served counts are v0's again.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from helpers.sglang_cpu import SPEC_ENGINE_ARGS, cpu_engine_env
from helpers.spec_fixture import NEW_TOKENS, STEPS, shared_spec_fixture

from eagle_io.cli import main
from eagle_io.errors import DraftSwapError
from eagle_io.sglang.servers import http_json, launch_server, server_flags, stop_server
from eagle_io.spec.served import engine_args, run_server
from eagle_io.spec.swap import http_call, swap_draft

pytestmark = pytest.mark.slow

IN_FLIGHT_TOKENS = 160  # long enough (ignore_eos) to still be decoding when the swap's first call arrives


def _launch(args: dict, log: Path, **env: str) -> tuple[str, object]:
    return launch_server(server_flags(args), log, timeout_s=600, env=cpu_engine_env(**env))


def _spec_args(target: Path, draft: Path) -> dict:
    return engine_args(target, draft, algorithm="EAGLE3", num_steps=STEPS, extra=SPEC_ENGINE_ARGS)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(target dir, dataset, draft v0, held-out prompts, eos): :func:`helpers.spec_fixture.shared_spec_fixture`."""
    torch.set_num_threads(1)
    return shared_spec_fixture(tmp_path_factory)


@pytest.fixture(scope="module")
def v1(trained, tmp_path_factory):
    """A second draft on the same data, another seed and fewer steps, on v0's vocabulary map."""
    target, ds, v0, _, _ = trained
    out = tmp_path_factory.mktemp("v1") / "v1"
    argv = ["train-draft", str(ds), "--out", str(out), "--target-model", str(target), "--keep-vocab-map", str(v0)]
    argv += ["--steps", "200", "--seed", "1", "--eval-samples", "8", "--ttt-length", "3", "--lr", "3e-3"]
    argv += ["--warmup-steps", "5", "--accept-steps", str(STEPS), "--threads", "1", "--max-length", "160"]
    assert main(argv) == 0
    return out


@pytest.fixture(scope="module")
def server(trained, tmp_path_factory):
    target, _, v0, _, _ = trained
    root = str(tmp_path_factory.getbasetemp())  # the operator lets clients capture under it (the flywheel test)
    url, proc = _launch(_spec_args(target, v0), tmp_path_factory.mktemp("server") / "server.log",
                        EAGLE_IO_CAPTURE_ROOT=root)  # fmt: skip
    try:
        yield url
    finally:
        stop_server(proc)


@pytest.fixture(scope="module")
def fresh_v1(trained, v1, tmp_path_factory):
    """What a server launched with v1 answers on the held-out prompts (its run), then stopped."""
    target, _, _, prompts, eos = trained
    url, proc = _launch(_spec_args(target, v1), tmp_path_factory.mktemp("fresh") / "server.log")
    try:
        return run_server(url, prompts, NEW_TOKENS, eos)
    finally:
        stop_server(proc)


@pytest.fixture(scope="module")
def v0_run(server, trained):
    """What the server answers on the held-out prompts while it serves v0 (taken before any swap: every test that
    swaps asks for it)."""
    _, _, _, prompts, eos = trained
    return run_server(server, prompts, NEW_TOKENS, eos)


def _draft_checksums(url: str, selector: str = "draft") -> dict[str, str]:
    ans = http_json(url + "/weights_checker", {"action": "checksum", "selector": selector}, 60, control=True)
    (rank,) = ans["ranks"]
    return rank["checksums"]


def _healthy(url: str) -> bool:
    with urllib.request.urlopen(url + "/health", timeout=30) as r:
        return r.status == 200


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_config(d: Path, edit) -> None:
    cfg = json.loads((d / "config.json").read_text())
    edit(cfg)
    (d / "config.json").write_text(json.dumps(cfg))


def _edit_tensors(d: Path, edit) -> None:
    from safetensors.torch import load_file, save_file

    t = load_file(d / "model.safetensors")
    edit(t)
    save_file(t, d / "model.safetensors", metadata={"format": "pt"})


def _other_target(d: Path) -> str:
    _edit_config(d, lambda c: c["eagle_io"]["target"].update(model_id="another-target"))
    return "trained for target model_id 'another-target', the served draft for 'target'"


def _other_widths(d: Path) -> str:
    def widen(t):
        h = t["midlayer.mlp.down_proj.weight"].shape[0]
        t["midlayer.mlp.gate_proj.weight"] = torch.zeros(96, h, dtype=torch.bfloat16)
        t["midlayer.mlp.up_proj.weight"] = torch.zeros(96, h, dtype=torch.bfloat16)
        t["midlayer.mlp.down_proj.weight"] = torch.zeros(h, 96, dtype=torch.bfloat16)

    _edit_tensors(d, widen)
    _edit_config(d, lambda c: c.update(intermediate_size=96))
    return "tensor midlayer.mlp.down_proj.weight [64, 96], served [64, 64]"


def _other_layer_ids(d: Path) -> str:
    _edit_config(d, lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[1, 3, 5]))
    return "eagle_aux_hidden_state_layer_ids [1, 3, 5], served [1, 3, 4]"


def _other_vocab_map(d: Path) -> str:
    def move_one(t):  # one draft id maps to a target id the map did not hold (still ascending: a valid map)
        d2t, t2d = t["d2t"], t["t2d"]
        free = int((~t2d).nonzero()[0])
        ids = d2t + torch.arange(d2t.shape[0])
        j = int((ids > free).nonzero()[0])
        t2d[int(ids[j])], t2d[free] = False, True
        d2t[j] = free - j

    _edit_tensors(d, move_one)
    return "vocab map d2t: 1 of 256 entries differ from the served draft's"


def _nan(d: Path) -> str:
    _edit_tensors(d, lambda t: t["fc.weight"].view(-1).__setitem__(0, float("nan")))
    return "fc.weight: 1 NaN/Inf value(s) of 12288"


def _truncated(d: Path) -> str:
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    return "model.safetensors: cannot read its tensors (Error while deserializing header"


@pytest.mark.parametrize(
    "make",
    [_other_target, _other_widths, _other_layer_ids, _other_vocab_map, _nan, _truncated],
    ids=lambda f: f.__name__,
)
def test_a_draft_that_cannot_replace_the_served_one_is_refused_before_anything_is_sent(
    server, v0_run, v1, tmp_path, make
):
    before = _draft_checksums(server)
    bad = _copy(v1, tmp_path / "bad")
    line = make(bad)
    with pytest.raises(DraftSwapError) as e:
        swap_draft(http_call(server), bad)
    assert e.value.sent is False
    assert any(line in x for x in str(e.value).splitlines()[1:]), str(e.value)  # the reason, on a line of its own
    assert _draft_checksums(server) == before
    assert _healthy(server)


def test_a_server_without_a_draft_is_refused(trained, tmp_path):
    target, _, _, _, _ = trained
    url, proc = _launch({"model_path": str(target), **SPEC_ENGINE_ARGS}, tmp_path / "plain.log")
    try:
        with pytest.raises(DraftSwapError, match=r"serves no draft \(speculative_algorithm None") as e:
            swap_draft(http_call(url), trained[2], where=url)
        assert e.value.sent is False and str(e.value).startswith(f"{url} serves no draft")
        assert _healthy(url)
    finally:
        stop_server(proc)


class _Recorded:
    """The HTTP transport, recording when each route was called."""

    def __init__(self, url: str) -> None:
        self.inner, self.sent = http_call(url), {}

    def __call__(self, route, body, control):
        self.sent.setdefault(route, time.monotonic())
        return self.inner(route, body, control)


def test_a_swap_with_requests_in_flight_is_lossless_and_loads_exactly_v1(server, v0_run, trained, v1, fresh_v1):
    from eagle_io.capturing.models import load_target
    from eagle_io.spec.decoder import greedy_decode
    from eagle_io.spec.target import Target

    target, _, _, prompts, eos = trained
    before, target_before = _draft_checksums(server), _draft_checksums(server, "target")
    flight = prompts[:4]
    answers: list = [None] * 4
    times: list = [None] * 4

    def ask(i):
        body = {"input_ids": flight[i], "sampling_params": {"temperature": 0.0, "max_new_tokens": IN_FLIGHT_TOKENS,
                                                            "ignore_eos": True}}  # fmt: skip
        t0 = time.monotonic()
        answers[i] = http_json(server + "/generate", body, 600)
        times[i] = (t0, time.monotonic())

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    call = _Recorded(server)
    result = swap_draft(call, v1, prompts=prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=eos, where=server)
    for t in threads:
        t.join()
    begin = call.sent["/begin_weight_update"]
    assert all(t0 < begin < t1 for t0, t1 in times), (begin, times)  # in flight when the update began

    model, _, _ = load_target(str(target), dtype=torch.float32)
    greedy, _ = greedy_decode(Target(model, [1]), flight, IN_FLIGHT_TOKENS)
    assert [a["output_ids"] for a in answers] == greedy
    assert {a["meta_info"]["weight_version"] for a in answers} == {"default"}  # finished on v0, before the update

    # the swap loaded exactly v1: the same verify steps, request for request, as a server launched with it
    assert result.weight_version.startswith("v1@") and result.sent == 13 and result.checked == 10
    assert result.run.verify_ct == fresh_v1.verify_ct
    after = run_server(server, prompts, NEW_TOKENS, eos)
    assert after.verify_ct == fresh_v1.verify_ct and after.tokens == fresh_v1.tokens
    assert result.run.sglang_accept_length == pytest.approx(fresh_v1.sglang_accept_length)
    now = _draft_checksums(server)
    assert now["draft.model.embed_tokens.weight"] == before["draft.model.embed_tokens.weight"]  # never sent
    assert now["draft.model.fc.weight"] != before["draft.model.fc.weight"]
    assert _draft_checksums(server, "target") == target_before  # the draft selector left the target alone
    meta = http_json(server + "/generate", {"input_ids": prompts[0], "sampling_params": {"max_new_tokens": 2}}, 60)
    assert meta["meta_info"]["weight_version"] == result.weight_version
    assert _healthy(server)


def test_a_collapsed_swap_is_refused_after_it_was_sent(server, v0_run, trained, v1, tmp_path):
    """A draft whose head says nothing (lm_head zeroed: it proposes draft id 0 at every step) loads fine, reads back
    fine, and accepts about nothing: refused, ``sent`` True, and the server still answers."""
    _, _, _, prompts, eos = trained
    dead = _copy(v1, tmp_path / "dead")
    _edit_tensors(dead, lambda t: t["lm_head.weight"].zero_())
    with pytest.raises(DraftSwapError, match=r"served accept length 1\.0\d+ after the swap to dead@\w+ is below") as e:
        swap_draft(http_call(server), dead, prompts=prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=eos)
    assert e.value.sent is True and "a collapsed swap" in str(e.value)
    assert _healthy(server)


def test_the_command_swaps_v0_back(server, v0_run, trained, capsys):
    target, _, v0, prompts, eos = trained
    capsys.readouterr()
    assert main(["swap-draft", server, "--draft", str(v0), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["weight_version"].startswith("draft@") and res["checksums_matched"] == 10
    assert res["sglang_accept_length"] >= res["accept_threshold"] >= 1.2
    again = run_server(server, prompts, NEW_TOKENS, eos)
    assert again.verify_ct == v0_run.verify_ct and again.tokens == v0_run.tokens
    # a directory that is no draft (the target itself): exit 2, the reasons on stderr, nothing sent
    assert main(["swap-draft", server, "--draft", str(target)]) == 2
    err = capsys.readouterr().err
    assert "DraftSwapError" in err and "cannot replace the draft" in err, err
    assert _healthy(server)


def _eval_live(capsys, draft: Path, dataset: Path, target: Path, url: str, prompts_file: Path) -> dict:
    capsys.readouterr()
    argv = ["eval-draft", "--draft", str(draft), "--target", str(target), "--dataset", str(dataset), "--server", url]
    argv += ["--prompts-file", str(prompts_file), "--max-new-tokens", str(NEW_TOKENS), "--threads", "1"]
    assert main([*argv, "--json", "--no-profile"]) == 0
    return json.loads(capsys.readouterr().out)["live"]


def test_the_flywheel_at_tiny_scale(server, v0_run, trained, tmp_path, capsys):
    """docs/TRAINING.md "The flywheel", command for command, on the module's server (serving v0 again): a live
    capture of the traffic it answers, v1 trained on that capture alone with v0's vocab map, eval-draft --server
    before, swap-draft, eval-draft --server after, on held-out prompts neither draft trained on."""
    from eagle_io.feed import ShardDataset
    from eagle_io.spec.evaluate import prompt_of

    target, ds, v0, held_out, _ = trained
    held = tmp_path / "held_out.jsonl"
    held.write_text("".join(json.dumps({"input_ids": p}) + "\n" for p in held_out))
    data = ShardDataset(ds)
    traffic = [p for p in (prompt_of(data[i]["input_ids"], data[i]["loss_mask"]) for i in range(len(data))) if p]
    traffic = [p for p in traffic if p not in held_out][:24]

    served = tmp_path / "served"
    assert main(["live", "start", server, "--out", str(served), "--rate", "1"]) == 0
    for p in traffic:
        http_json(server + "/generate", {"input_ids": p, "sampling_params": {"temperature": 0.0,
                                                                           "max_new_tokens": 64}}, 600)  # fmt: skip
    assert main(["live", "stop", server]) == 0
    capsys.readouterr()
    assert json.loads((served / "manifest.json").read_text())["complete"] is True

    v1 = tmp_path / "v1"
    argv = ["train-draft", str(served), "--out", str(v1), "--target-model", str(target), "--keep-vocab-map", str(v0)]
    argv += ["--steps", "200", "--eval-samples", "4", "--ttt-length", "3", "--lr", "3e-3", "--warmup-steps", "5"]
    assert main([*argv, "--accept-steps", str(STEPS), "--threads", "1", "--max-length", "160"]) == 0

    before = _eval_live(capsys, v0, served, target, server, held)
    assert main(["swap-draft", server, "--draft", str(v1), "--prompts-file", str(held), "--json"]) == 0
    swapped = json.loads(capsys.readouterr().out)
    after = _eval_live(capsys, v1, served, target, server, held)

    assert before["lossless"] is True and after["lossless"] is True
    assert before["request_verify_ct"] == v0_run.verify_ct  # v0 served before the swap
    assert after["request_verify_ct"] != before["request_verify_ct"]  # another draft after it
    assert swapped["weight_version"].startswith("v1@") and swapped["checksums_matched"] == 10
    assert after["sglang_accept_length"] >= swapped["accept_threshold"]
    print(f"flywheel at tiny scale: v0 {before['sglang_accept_length']:.3f}, v1 {after['sglang_accept_length']:.3f}")
    assert _healthy(server)
