"""The seed's failure inside real SGLang: a real CPU ``sglang.Engine`` (scheduler, ``EAGLEWorkerV2``, verify, accept
accounting) runs speculative decoding with an EAGLE-3 draft that ``train-draft --ttt-length 3`` trained on a tiny
float32 target's own answers (``generate --regenerate``); sgl-kernel's CPU ops come from the test-only torch package
(tests/support/sgl_kernel_torch, :mod:`helpers.sglang_cpu`). What SGLang itself reports (``meta_info``) is held to:

* the non-speculative engine's greedy outputs (every speculative launch is lossless);
* the classic failure: SGLang's own pooled accept length under ``EAGLE3`` (chain and tree) far above ``EAGLE``, which
  sits next to 1;
* eagle-io's plugin: it refuses ``EAGLE`` / ``NEXTN`` launches at startup naming EAGLE3; with the startup guard off,
  the draft-width check stops the first prefill; with both off, the acceptance watchdog warns under ``EAGLE`` and
  stays silent under ``EAGLE3`` (the draft's own ``speculation_profile.json`` read);
* eagle-io's reference decoder (:class:`eagle_io.spec.SpeculativeDecoder`): the same tokens and, request for request,
  the same verify counts and accept histograms as SGLang, under ``EAGLE3`` and the ``EAGLE`` replay;
* ``eagle-io eval-draft --engine sglang``, ``--server URL`` (a real ``sglang.launch_server``) and ``--prompts-file``.

What this proves and what it does not: docs/SERVING.md section 6 (SGLang's Python path, not its CUDA kernels).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.sglang_cpu import SPEC_ENGINE_ARGS, cpu_engine_env
from helpers.spec_fixture import NEW_TOKENS, PROMPTS, STEPS, shared_spec_fixture

from eagle_io.cli import main
from eagle_io.errors import SGLangError
from eagle_io.sglang.servers import launch_server, server_flags, stop_server
from eagle_io.spec.served import engine_args

pytestmark = pytest.mark.slow

HELPERS = Path(__file__).parent / "helpers"
WATCH = {"EAGLE_IO_ACCEPT_WINDOW": "32"}  # a few windows per run instead of one per 256 request steps


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(target dir, dataset, draft dir, prompts, eos): :func:`helpers.spec_fixture.shared_spec_fixture`."""
    torch.set_num_threads(1)
    return shared_spec_fixture(tmp_path_factory)


def _spec(trained, algorithm: str, topk: int = 1) -> dict:
    target, _, draft, _, _ = trained
    return engine_args(target, draft, algorithm=algorithm, num_steps=STEPS, topk=topk, extra=SPEC_ENGINE_ARGS)


@pytest.fixture(scope="module")
def engines(trained, tmp_path_factory):
    """Every launch, each a real engine started and shut down in one subprocess (helpers/sglang_spec_run.py):
    ``{name: what it answered | {"error": ...}, "log": its stderr}``."""
    target, _, _, prompts, eos = trained
    plain = {"model_path": str(target), "skip_tokenizer_init": True, **SPEC_ENGINE_ARGS}
    guard_off = {"EAGLE_IO_STARTUP_GUARD": "0"}
    runs = [
        {"name": "none", "args": plain},
        {"name": "eagle3_chain", "args": _spec(trained, "EAGLE3"), "env": WATCH},
        {"name": "eagle3_tree", "args": _spec(trained, "EAGLE3", topk=4)},
        {"name": "eagle_plugin_off", "args": _spec(trained, "EAGLE"), "env": {"EAGLE_IO_SGLANG_PLUGIN": "0"}},
        {
            "name": "eagle_watched",
            "args": _spec(trained, "EAGLE"),
            "env": {**guard_off, "EAGLE_IO_DRAFT_WIDTH_CHECK": "0", **WATCH},
        },
        {"name": "eagle_guarded", "args": _spec(trained, "EAGLE")},
        {"name": "nextn_guarded", "args": _spec(trained, "NEXTN")},
        {"name": "eagle_width_checked", "args": _spec(trained, "EAGLE"), "env": guard_off},
    ]
    work = tmp_path_factory.mktemp("engines")
    job, out = work / "job.json", work / "out.json"
    job.write_text(json.dumps({"prompts": prompts, "max_new_tokens": NEW_TOKENS, "stop_token_ids": eos, "runs": runs}))
    r = subprocess.run(
        [sys.executable, str(HELPERS / "sglang_spec_run.py"), str(job), str(out)],
        capture_output=True,
        text=True,
        env=cpu_engine_env(),
        timeout=1500,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    return json.loads(out.read_text())


def _ok(engines, name: str) -> dict:
    res = engines[name]
    assert "error" not in res, f"{name}: {res['error']}\n{res['log'][-4000:]}"
    return res


SERVED = ("none", "eagle3_chain", "eagle3_tree", "eagle_plugin_off", "eagle_watched")


def test_the_split_attention_backends_really_resolved_to_intel_amx(engines):
    """SGLang rewrites ``attention_backend="intel_amx"`` to ``torch_native`` on a CPU without AMX and leaves the split
    fields alone; the speculative path runs only because they stay ``intel_amx`` (sglang_cpu_spec.md). A later SGLang
    that closes that gap must fail here, not silently run something else."""
    for name in SERVED:
        server = _ok(engines, name)["server"]
        assert server["prefill_attention_backend"] == "intel_amx", (name, server)
        assert server["decode_attention_backend"] == "intel_amx", (name, server)
        assert server["device"] == "cpu" and server["dtype"] == "float32", (name, server)


def test_every_speculative_launch_is_lossless(engines, trained):
    from eagle_io.capturing.models import load_target
    from eagle_io.spec import Target, greedy_decode

    target, _, _, prompts, eos = trained
    plain = _ok(engines, "none")["tokens"]
    assert all(len(t) > 8 for t in plain), plain
    for name in SERVED[1:]:
        assert _ok(engines, name)["tokens"] == plain, name
    model, _, _ = load_target(str(target), dtype=torch.float32)
    hf, _ = greedy_decode(Target(model, [2, 4, 5]), prompts, NEW_TOKENS, eos)
    assert hf == plain  # SGLang's CPU greedy decoding is the Hugging Face target's, token for token


def test_sglang_itself_accepts_far_more_under_eagle3_than_under_eagle(engines):
    chain, tree = _ok(engines, "eagle3_chain"), _ok(engines, "eagle3_tree")
    wrong = _ok(engines, "eagle_plugin_off")
    assert chain["sglang_accept_length"] > 1.8, chain["sglang_accept_length"]
    assert tree["sglang_accept_length"] >= chain["sglang_accept_length"]
    assert wrong["sglang_accept_length"] < 1.2, wrong["sglang_accept_length"]
    assert sum(wrong["verify_ct"]) > 1.5 * sum(chain["verify_ct"])
    # SGLang's completion_tokens are the prefill's token plus every verify's accepted tokens, less those cut at
    # max_new_tokens (at most num_steps): the two conventions differ by exactly that
    for res in (chain, tree, wrong):
        for hist, done in zip(res["histograms"], res["completion_tokens"], strict=True):
            accepted = sum((j + 1) * n for j, n in enumerate(hist))
            assert 0 <= 1 + accepted - done <= STEPS, (hist, done)


def test_the_plugin_refuses_eagle_and_nextn_at_startup_naming_eagle3(engines):
    for name in ("eagle_guarded", "nextn_guarded"):
        res = engines[name]
        assert "error" in res, f"{name} started: the startup guard let an EAGLE-3 draft run without aux states"
        assert "ServingGuardError" in res["log"] and "EAGLE3" in res["log"], res["log"][-3000:]


def test_with_the_guard_off_the_width_check_stops_the_first_prefill(engines):
    res = engines["eagle_width_checked"]
    assert "error" in res, "the draft-width check let 64-wide states into a draft whose fc takes 192"
    assert "DraftWidthError" in res["log"] and "192" in res["log"], res["log"][-3000:]


def test_with_both_off_the_watchdog_warns_under_eagle_and_not_under_eagle3(engines):
    watched, chain = _ok(engines, "eagle_watched"), _ok(engines, "eagle3_chain")
    assert "eagle-io acceptance watchdog: expecting" in chain["log"]  # the draft's profile was read
    assert "eagle-io acceptance watchdog: mean accept length" not in chain["log"]
    assert "eagle-io acceptance watchdog: mean accept length" in watched["log"], watched["log"][-3000:]
    # the plugin's hooks change nothing that is served
    off = _ok(engines, "eagle_plugin_off")
    assert (watched["tokens"], watched["verify_ct"]) == (off["tokens"], off["verify_ct"])


@pytest.mark.parametrize("algorithm", ["EAGLE3", "EAGLE"])
def test_the_reference_decoder_matches_sglang_verify_for_verify(engines, trained, algorithm):
    """Same draft, target, prompts and steps, topk 1, float32, greedy: eagle_io.spec's tokens, each request's verify
    count and its histogram of correct drafts are SGLang's."""
    from eagle_io.capturing.models import load_target
    from eagle_io.spec import SpeculativeDecoder, load_served_draft

    target, ds, draft, prompts, eos = trained
    model, _, info = load_target(str(target), dtype=torch.float32)
    served = load_served_draft(str(draft), model, info, dataset=str(ds))
    dec = SpeculativeDecoder(served.target, served.draft, num_steps=STEPS, as_algorithm=algorithm, eos_token_ids=eos)
    out = dec.generate(prompts, NEW_TOKENS)
    sg = _ok(engines, "eagle3_chain" if algorithm == "EAGLE3" else "eagle_plugin_off")
    assert out.tokens == sg["tokens"]
    assert [h.verify_steps for h in out.per_request] == sg["verify_ct"]
    assert [h.counts for h in out.per_request] == sg["histograms"]


def launch_spec_server(args: dict, log: Path, *extra: str, env: dict[str, str] | None = None) -> tuple[str, object]:
    """A real ``python -m sglang.launch_server`` for engine arguments ``args`` (plus raw ``extra`` flags) on SGLang's
    CPU engine, once it answers ``/health``: ``(url, process)``, stopped by ``stop_server``."""
    return launch_server([*server_flags(args), *extra], log, timeout_s=600, env=cpu_engine_env(**(env or {})))


@pytest.fixture(scope="module")
def server(trained, tmp_path_factory):
    """A real ``python -m sglang.launch_server`` serving the draft under EAGLE3 (chain), eagle-io's plugin on."""
    url, proc = launch_spec_server(_spec(trained, "EAGLE3"), tmp_path_factory.mktemp("server") / "server.log")
    try:
        yield url
    finally:
        stop_server(proc)


def _eval(capsys, *argv: str) -> dict:
    capsys.readouterr()
    assert main(["eval-draft", *argv, "--json", "--no-profile"]) == 0
    return json.loads(capsys.readouterr().out)


def _same_as_engine(live: dict, engine: dict) -> None:
    assert live["lossless"] is True
    assert live["request_verify_ct"] == engine["verify_ct"]
    assert live["sglang_accept_length"] == pytest.approx(engine["sglang_accept_length"])
    assert live["accept_length"] == pytest.approx(engine["accept_length"])
    assert set(live["definitions"]) == {"accept_length", "sglang_accept_length"}


def test_eval_draft_server_measures_a_running_server(server, trained, engines, capsys):
    target, ds, draft, prompts, _ = trained
    common = ("--draft", str(draft), "--target", str(target), "--dataset", str(ds), "--threads", "1")
    res = _eval(capsys, *common, "--server", server, "--prompts", str(PROMPTS), "--max-new-tokens", str(NEW_TOKENS))
    live = res["live"]
    assert live["engine"] == "sglang" and live["server"]["speculative_algorithm"] == "EAGLE3"
    assert live["prompts"] == len(prompts)
    _same_as_engine(live, _ok(engines, "eagle3_chain"))
    # a server that serves another algorithm than the one asked for is named, not measured
    assert main(["eval-draft", *common, "--server", server, "--as-algorithm", "EAGLE", "--no-profile"]) == 2
    err = capsys.readouterr().err
    assert "SGLangError" in err and f"{server} serves speculative_algorithm 'EAGLE3', not 'EAGLE'" in err, err


def test_eval_draft_engine_sglang_on_a_prompts_file(trained, engines, tmp_path):
    """``--engine sglang`` (the engine started inside eval-draft) on the same prompts given as a JSONL file:
    SGLang's counts, request for request, are the engine run's."""
    target, ds, draft, prompts, _ = trained
    file = tmp_path / "prompts.jsonl"
    file.write_text("".join(json.dumps({"input_ids": p}) + "\n" for p in prompts))
    sglang_args = [a for k, v in SPEC_ENGINE_ARGS.items() for a in ("--sglang-arg", f"{k}={json.dumps(v)}")]
    r = subprocess.run(
        [
            *(sys.executable, "-m", "eagle_io.cli", "eval-draft", "--engine", "sglang", *sglang_args),
            *("--draft", str(draft), "--target", str(target), "--dataset", str(ds), "--prompts-file", str(file)),
            *("--max-new-tokens", str(NEW_TOKENS), "--threads", "1", "--json", "--no-profile"),
        ],
        capture_output=True,
        text=True,
        env=cpu_engine_env(),
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    live = json.loads(r.stdout)["live"]
    assert live["engine"] == "sglang" and live["sample_ids"] == list(range(len(prompts)))
    _same_as_engine(live, _ok(engines, "eagle3_chain"))


def test_an_abbreviated_eagle_flag_is_refused_at_startup(trained, tmp_path):
    """``--speculative-algo EAGLE`` (argparse takes the abbreviation) launches EAGLE: the guard refuses it in the
    scheduler, and the server exits."""
    args = _spec(trained, "EAGLE3")
    args.pop("speculative_algorithm")
    log = tmp_path / "server.log"
    with pytest.raises(SGLangError, match="exited with"):
        launch_spec_server(args, log, "--speculative-algo", "EAGLE")
    text = log.read_text(errors="replace")
    assert "ServingGuardError" in text and "EAGLE3" in text, text[-4000:]
