"""The eagle-io SGLang plugin: startup guard, draft-extend width check, acceptance watchdog, entry point.

Two parts:

* Decision logic and the watchdog on plain facts: always run.
* Against SGLang's real code (skipped when ``sglang`` is not importable; CI installs it with
  ``pip install --no-deps -r requirements/sglang.txt``): ``ServerArgs`` resolution (``resolve_once``,
  ``resolved_view``: ``NEXTN -> EAGLE``), ``runtime_context.publish``, ``ModelConfig.from_server_args`` for the
  target and the draft, ``resolve_spec_aux_hidden_state_config`` and ``configure_aux_hidden_state_capture``, which
  calls SGLang's real ``set_eagle3_layers_to_capture`` functions (Llama; Kimi-K2.5 delegating to DeepSeek-V3).
  TEST-ONLY STAND-INS: the torch modules those setters run on (``_TargetStandIn``: the attributes the real setter
  touches, since building SGLang's model needs its distributed runtime) and the draft model (``_DraftStandIn``:
  ``fc``/``embed_tokens`` on the meta device, sized from the draft's safetensors header), and the
  scheduler/worker objects that hold them (``SimpleNamespace``), with the attribute paths SGLang 0.5.23 uses.
  The hooks are installed with SGLang's real ``HookRegistry`` / ``load_plugins`` and run through SGLang's real
  ``Scheduler.init_all_cuda_graphs``, ``EagleDraftWorker._draft_extend_*`` and
  ``EAGLEWorkerV2.on_verify_complete_cpu``.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers.sglang_cpu import cpu_engine_env
from test_serving_preflight import H, eagle3_draft, kimi_k25, llama_target

import eagle_io
import eagle_io.errors
from eagle_io import sglang_plugin
from eagle_io.serving import plugin
from eagle_io.sglang import compat, probe
from eagle_io.sglang import hooks as targets
from eagle_io.sglang.checkpoint import read_draft
from eagle_io.sglang.draft_build import EAGLE3_DRAFT_CLASSES

try:
    import sglang.srt.plugins.hook_registry  # noqa: F401

    SGLANG_SKIP = ""
except Exception as e:  # ImportError, or a dependency failing at import
    SGLANG_SKIP = (
        f"sglang is not importable ({type(e).__name__}: {e}); install it with "
        "`pip install --no-deps -r requirements/sglang.txt`"
    )
needs_sglang = pytest.mark.skipif(bool(SGLANG_SKIP), reason=SGLANG_SKIP or "sglang present")


def facts(**kw) -> probe.StartupFacts:
    base = dict(
        algorithm="EAGLE3",
        is_eagle3=True,
        target_architecture="LlamaForCausalLM",
        target_hidden_size=64,
        target_num_layers=8,
        capture_enabled=True,
        layers_to_capture=(2, 4, 5),
        spec_aux_enabled=True,
        draft_present=True,
        draft_architecture="LlamaForCausalLMEagle3",
        draft_config={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]}, "draft_vocab_size": 500},
        draft_class="LlamaForCausalLMEagle3",
        fc_in_width=192,
        draft_embed_width=64,
    )
    base.update(kw)
    return probe.StartupFacts(**base)


# ---------------------------------------------------------------------------------------------- pure logic


def test_startup_decision_rules():
    assert plugin.startup_decision(facts()) is None
    msg = plugin.startup_decision(
        facts(algorithm="EAGLE", is_eagle3=False, capture_enabled=False, layers_to_capture=())
    )
    assert msg is not None and "Relaunch with --speculative-algorithm EAGLE3" in msg
    assert "64-wide final states instead of 192" in msg and "EAGLE_IO_STARTUP_GUARD=0" in msg
    msg = plugin.startup_decision(facts(capture_enabled=False, layers_to_capture=()))
    assert "does not capture aux states" in msg and "language_model" in msg
    msg = plugin.startup_decision(facts(layers_to_capture=(2, 5, 8)))  # 8 = N is never captured
    assert "ids outside 1..7" in msg and "only 2 of 3 states are captured" in msg and "fc expects 192" in msg
    msg = plugin.startup_decision(facts(layers_to_capture=(2, 4)))
    assert "captures 2 aux states ([2, 4]) x hidden 64 = 128 wide, but the draft's fc expects 192" in msg
    assert "use_aux_hidden_state: false" in plugin.startup_decision(facts(spec_aux_enabled=False))
    # Not an EAGLE-3 draft (EAGLE-2 fc [H, 2H], no EAGLE-3 keys), or no draft on this PP rank: nothing to say.
    eagle2 = facts(algorithm="EAGLE", is_eagle3=False, capture_enabled=False, draft_config={}, fc_in_width=128)
    assert plugin.draft_is_eagle3(eagle2) == [] and plugin.startup_decision(eagle2) is None
    assert plugin.startup_decision(facts(is_eagle3=False, draft_present=False)) is None
    # Detected from the fc width alone.
    plain = facts(algorithm="EAGLE", is_eagle3=False, draft_config={}, fc_in_width=192)
    assert plugin.draft_is_eagle3(plain) == ["fc input width 192 = 3 x target hidden 64"]
    assert "Relaunch with --speculative-algorithm EAGLE3" in plugin.startup_decision(plain)


def test_acceptance_watchdog_window():
    logged: list[str] = []
    wd = plugin.AcceptanceWatchdog(window=8, context="(ctx)", log=logged.append)
    wd.observe([0, 0, 0])
    assert wd.mean_accept_length == 1.0 and not logged
    wd.observe([0] * 5)  # window full, no accepted draft
    assert wd.windows == 1 and wd.warnings == 1
    assert "mean accept length 1.00 over the last 8 request steps" in logged[0] and "(ctx)" in logged[0]
    wd.observe([0] * 7 + [1])  # one accepted draft token in the window: no warning
    assert wd.windows == 2 and wd.warnings == 1 and len(logged) == 1
    wd.observe([2, 1])
    assert wd.mean_accept_length == 2.5


def test_acceptance_watchdog_expected_value_rule():
    logged: list[str] = []
    wd = plugin.AcceptanceWatchdog(
        window=8, context="(ctx)", expected=3.0, fraction=0.5, expected_from="profile.json", log=logged.append
    )
    wd.observe([0] * 7 + [1])  # mean 1.125 < 0.5 x 3.0
    assert wd.low_warnings == 1 and wd.warnings == 0
    assert "mean accept length 1.12 over the last 8 request steps" in logged[0]
    assert "below 0.5 x the 3.00 this draft is expected to reach (profile.json)" in logged[0]
    assert "aux layer ids" in logged[0] and "chat template" in logged[0] and "d2t" in logged[0]
    wd.observe([1] * 4 + [0] * 4)  # pooled 1.5: not below 1.5
    wd.observe([2] * 8)
    assert wd.low_warnings == 1 and len(logged) == 1
    wd.observe([0] * 8)  # exactly 1.00: the first rule's message, once
    assert wd.warnings == 1 and wd.low_warnings == 1 and "not produced a single accepted token" in logged[-1]
    off = plugin.AcceptanceWatchdog(window=4, expected=3.0, fraction=0.0, log=logged.append)
    off.observe([0, 0, 0, 1])
    assert off.low_warnings == 0 and len(logged) == 2


def write_profile(draft_dir, source: str, rates: list[float], *, samples: int) -> None:
    """A speculation profile of ``source`` ("live" / "offline") with these joint per-position rates (multiples of
    0.1: the figures of 10 verify steps, which read_profile holds together)."""
    from eagle_io.draft import AcceptHistogram
    from eagle_io.interop.speculation_profile import PROFILE_NAME, build_profile, write_json

    joint = [1.0, *rates, 0.0]
    fig = AcceptHistogram(len(rates), [round(10 * (a - b)) for a, b in itertools.pairwise(joint)]).to_dict()
    assert fig["per_position_accept_rate"] == pytest.approx(rates)
    prof = build_profile(
        num_steps=len(rates),
        live=fig if source == "live" else None,
        offline=fig if source == "offline" else None,
        data={"samples": samples},
        target={"model_id": "m"},
    )
    write_json(os.path.join(draft_dir, PROFILE_NAME), prof)


def test_expected_accept_length_from_the_drafts_profile(tmp_path, caplog, monkeypatch):
    from eagle_io.interop.speculation_profile import PROFILE_NAME, read_profile

    write_profile(tmp_path, "live", [0.6, 0.3, 0.2], samples=10)
    value, why = plugin.expected_from_profile(str(tmp_path), 2)
    assert value == pytest.approx(1.9) and "1.90 at 2 steps, live on 10 samples" in why
    value, why = plugin.expected_from_profile(str(tmp_path), None)
    assert value == pytest.approx(2.1)
    value, why = plugin.expected_from_profile(str(tmp_path), 5)
    assert value == pytest.approx(2.1) and "a lower bound at 5" in why
    assert plugin.expected_from_profile(str(tmp_path / "none"), 3)[0] is None
    (tmp_path / PROFILE_NAME).write_text('{"format": "something else"}')
    with caplog.at_level(logging.WARNING, logger="eagle_io.serving"):
        assert plugin.expected_from_profile(str(tmp_path), 3)[0] is None
    assert "ignoring the draft's speculation_profile.json" in caplog.text
    # The descriptive keys read_profile does not check: a profile without "source", or with "data" null, raised
    # KeyError / AttributeError out of the startup guard (every scheduler failed to start) instead of being read.
    write_profile(tmp_path, "live", [0.6, 0.3, 0.2], samples=10)
    good = json.loads((tmp_path / PROFILE_NAME).read_text())
    for odd in ({k: v for k, v in good.items() if k != "source"}, {**good, "data": None}, {**good, "data": [1]}):
        (tmp_path / PROFILE_NAME).write_text(json.dumps(odd))
        value, why = plugin.expected_from_profile(str(tmp_path), 2)
        assert value == pytest.approx(1.9) and "1.90 at 2 steps" in why
    # A Hub id (SGLang downloads it into the HF cache): read from its cached snapshot at the launch's revision; it
    # was looked up as a local path and the expected-acceptance rule went off without a word.
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    repo = tmp_path / "hub" / "models--org--d"
    (repo / "refs").mkdir(parents=True)
    for rev, commit, rates in (("main", "a" * 40, [0.6, 0.3, 0.2]), ("v2", "b" * 40, [0.2, 0.1, 0.0])):
        snap = repo / "snapshots" / commit
        snap.mkdir(parents=True)
        (snap / "config.json").write_text("{}")
        write_profile(snap, "live", rates, samples=10)
        (repo / "refs" / rev).write_text(commit)
    assert plugin.expected_from_profile("org/d", 3)[0] == pytest.approx(2.1)
    assert plugin.expected_from_profile("org/d", 3, "v2")[0] == pytest.approx(1.3)
    with caplog.at_level(logging.WARNING, logger="eagle_io.serving"):
        value, why = plugin.expected_from_profile("org/other", 3)
    assert value is None and "org/other: not a checkpoint directory" in why and why in caplog.text
    # JSON true is a Python int: a profile with true for a rate or the version was read as 1.
    write_profile(tmp_path, "live", [0.6, 0.3, 0.2], samples=10)
    good = json.loads((tmp_path / PROFILE_NAME).read_text())
    for bad in ({"per_position_accept_rate": [True, 0.3, 0.2]}, {"version": True}, {"num_steps": True}):
        (tmp_path / PROFILE_NAME).write_text(json.dumps({**good, **bad}))
        with pytest.raises(eagle_io.errors.CheckpointError, match=str(tmp_path / PROFILE_NAME)):
            read_profile(tmp_path)


def test_version_range():
    assert compat.version_supported("0.5.23") and compat.version_supported("0.5.14")
    assert compat.version_supported("0.5.23.post1") and compat.version_supported("0.5.30rc1")
    assert not compat.version_supported("0.5.13") and not compat.version_supported("0.6.0")
    assert not compat.version_supported(None)
    assert compat.capture_supported("0.5.23") and not compat.capture_supported("0.5.21")


# ---------------------------------------------------------------------------------------------- real SGLang


class _TargetStandIn(torch.nn.Module):
    """TEST-ONLY STAND-IN for an SGLang target model: the attributes SGLang's real
    ``set_eagle3_layers_to_capture`` reads and writes (``pp_group.is_last_rank``, ``config.num_hidden_layers``,
    ``model.layers_to_capture``, ``capture_aux_hidden_states``). The setter itself is SGLang's function."""

    def __init__(self, config, setter) -> None:
        super().__init__()
        self.config = config
        self.pp_group = SimpleNamespace(is_last_rank=True)
        self.model = torch.nn.Module()
        self.model.layers_to_capture = []
        self.capture_aux_hidden_states = False
        self._setter = setter

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        return self._setter(self, layer_ids)


def _named(cls_name: str, base: type) -> type:
    return type(cls_name, (base,), {})


class _KimiStandIn(torch.nn.Module):
    """TEST-ONLY STAND-IN for ``KimiK25ForConditionalGeneration``: holds ``language_model``; its setter is
    SGLang's real ``KimiK25ForConditionalGeneration.set_eagle3_layers_to_capture`` (or a non-delegating one)."""

    def __init__(self, language_model, setter) -> None:
        super().__init__()
        self.language_model = language_model
        self._setter = setter

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        return self._setter(self, layer_ids)


class _DraftStandIn(torch.nn.Module):
    """TEST-ONLY STAND-IN for the loaded EAGLE-3 draft: ``model.fc`` / ``model.embed_tokens`` on the meta device,
    sized from the draft checkpoint's safetensors header (what SGLang loads into them)."""

    def __init__(self, fc_in: int | None, hidden: int, vocab: int) -> None:
        super().__init__()
        self.model = torch.nn.Module()
        if fc_in is not None:  # a plain LlamaForCausalLM has none
            self.model.fc = torch.nn.Linear(fc_in, hidden, bias=False, device="meta")
        self.model.embed_tokens = torch.nn.Embedding(vocab, hidden, device="meta")


def real_scheduler(
    target: Path,
    draft: Path,
    algorithm: str,
    *,
    wrapper_delegates: bool = True,
    workers: tuple | None = None,
    num_steps: int | None = None,
):
    """A scheduler-shaped object whose config objects are SGLang's real ones, resolved as SGLang resolves them
    (see the module docstring for what is a stand-in); ``server_args`` is the resolved ``ServerArgs``
    (``Scheduler.server_args``), with a chain of ``num_steps`` drafts (top-k 1) when given."""
    from sglang.srt.arg_groups.overrides import resolved_view
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_executor.model_runner_components.attention_backend_setup import (
        configure_aux_hidden_state_capture,
    )
    from sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state import (
        resolve_spec_aux_hidden_state_config,
    )
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    sa = ServerArgs(
        model_path=str(target),
        speculative_algorithm=algorithm,
        speculative_draft_model_path=str(draft),
        device="cpu",
        attention_backend="torch_native",
        disable_cuda_graph=True,
        **(
            {}
            if num_steps is None
            else {
                "speculative_num_steps": num_steps,
                "speculative_eagle_topk": 1,
                "speculative_num_draft_tokens": num_steps + 1,
            }
        ),
    )
    sa.resolve_once()
    publish(sa, role="scheduler", ranks=SpawnRanks(world_rank=0, gpu_id=0))
    model_config = ModelConfig.from_server_args(sa)
    spec_algorithm = SpeculativeAlgorithm.from_string(resolved_view(sa).speculative_algorithm)
    spec_aux = resolve_spec_aux_hidden_state_config(
        server_args=sa, model_config=model_config, spec_algorithm=spec_algorithm, is_draft_worker=False
    )
    arch = model_config.hf_config.architectures[0]
    if arch == "KimiK25ForConditionalGeneration":
        from sglang.srt.models.deepseek_v2 import DeepseekV2ForCausalLM
        from sglang.srt.models.kimi_k25 import KimiK25ForConditionalGeneration

        lm = _named("DeepseekV3ForCausalLM", _TargetStandIn)(
            model_config.hf_text_config, DeepseekV2ForCausalLM.set_eagle3_layers_to_capture
        )
        setter = (
            KimiK25ForConditionalGeneration.set_eagle3_layers_to_capture
            if wrapper_delegates
            else (
                lambda self, ids: None  # an SGLang wrapper that forgets to delegate
            )
        )
        model = _named("KimiK25ForConditionalGeneration", _KimiStandIn)(lm, setter)
    else:
        from sglang.srt.models.llama import LlamaForCausalLM

        model = _named(arch, _TargetStandIn)(model_config.hf_config, LlamaForCausalLM.set_eagle3_layers_to_capture)
    configure_aux_hidden_state_capture(  # what ModelRunner.init_attention_backends does, SGLang's function
        model=model,
        eagle_use_aux_hidden_state=spec_aux.eagle_use_aux_hidden_state,
        eagle_aux_hidden_state_layer_ids=spec_aux.eagle_aux_hidden_state_layer_ids,
        dflash_use_aux_hidden_state=spec_aux.dflash_use_aux_hidden_state,
        dflash_target_layer_ids=spec_aux.dflash_target_layer_ids,
        is_dspark=spec_aux.is_dspark,
    )
    info = read_draft(draft)
    # SGLang builds architectures[0] as named; only its EAGLE-3 classes have the fc that loads fc.weight.
    fc_in = info.fc_in_width if info.architecture in EAGLE3_DRAFT_CLASSES else None
    draft_model = _named(info.architecture, _DraftStandIn)(fc_in, 8, 16)
    runner = SimpleNamespace(model=model, model_config=model_config, spec_aux_config=spec_aux)
    draft_runner = SimpleNamespace(model=draft_model, model_config=spec_aux.draft_model_config)
    calls: list[str] = []
    tp_worker = SimpleNamespace(model_runner=runner, init_cuda_graphs=lambda: calls.append("target graphs"))
    draft_worker = worker_stand_in(workers, draft_runner, lambda: calls.append("draft"))
    sched = SimpleNamespace(
        spec_algorithm=spec_algorithm, tp_worker=tp_worker, draft_worker=draft_worker, server_args=sa
    )
    return sched, calls


def worker_stand_in(classes: tuple[type, type] | None, draft_runner, init_cuda_graphs):
    """TEST-ONLY STAND-IN for ``scheduler.draft_worker``: instances of SGLang's real worker classes (default
    ``EAGLEWorkerV2`` holding an ``EagleDraftWorker``), made without running their ``__init__`` (which needs a GPU
    model), holding the attributes the plugin reads."""
    if classes is None:
        from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2

        classes = (EAGLEWorkerV2, EagleDraftWorker)
    outer_cls, inner_cls = classes
    inner = inner_cls.__new__(inner_cls)
    inner.draft_runner = draft_runner
    outer = outer_cls.__new__(outer_cls)
    outer._draft_worker = inner
    outer.init_cuda_graphs = init_cuda_graphs
    return outer


@pytest.fixture
def hooks():
    """Registers the plugin as ``load_plugins`` does (``register()`` then ``HookRegistry.apply_hooks()``) and
    undoes every patch afterwards, so each test starts from SGLang's unpatched classes."""
    import pkgutil

    import sglang.srt.managers.scheduler  # noqa: F401  (the scheduler process has it imported)
    from sglang.srt.plugins.hook_registry import HookRegistry

    def clean():
        HookRegistry.reset()
        targets.forget()
        plugin._REGISTERED.clear()
        plugin._RUNTIME = plugin._Runtime()

    clean()
    sglang_plugin.register()
    HookRegistry.apply_hooks()
    yield HookRegistry
    for target in set(plugin._REGISTERED):
        owner, attr = target.rsplit(".", 1)
        obj = pkgutil.resolve_name(owner)
        fn = obj.__dict__[attr]
        while getattr(fn, "__code__", None) is not None and fn.__code__.co_filename.endswith("hook_registry.py"):
            fn = fn.__wrapped__  # only HookRegistry's wrappers (torch.no_grad's stays)
        setattr(obj, attr, fn)
    clean()


@needs_sglang
@pytest.mark.parametrize("algorithm", ["EAGLE", "NEXTN"])
def test_guard_aborts_eagle3_draft_under_eagle(tmp_path, hooks, algorithm):
    from sglang.srt.managers.scheduler import Scheduler

    t, d = llama_target(tmp_path), eagle3_draft(tmp_path, eagle_ids=[1, 3, 4])
    sched, calls = real_scheduler(t, d, algorithm)
    assert sched.spec_algorithm.name == "EAGLE" and not sched.spec_algorithm.is_eagle3()  # NEXTN resolved
    f = probe.startup_facts(sched)
    assert f.capture_enabled is False and f.layers_to_capture == () and f.spec_aux_enabled is False
    assert f.fc_in_width == 192 and f.target_hidden_size == H and f.draft_config["draft_vocab_size"] == 500
    with pytest.raises(plugin.ServingGuardError, match="Relaunch with --speculative-algorithm EAGLE3") as e:
        Scheduler.init_all_cuda_graphs(sched)  # SGLang's method, with the plugin's BEFORE hook applied
    assert "64-wide final states instead of 192" in str(e.value)
    assert calls == []  # aborted before any CUDA graph capture


@needs_sglang
def test_guard_passes_eagle3_and_installs_runtime_checks(tmp_path, hooks, monkeypatch, caplog):
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2

    monkeypatch.setenv(plugin.ENV_ACCEPT_WINDOW, "8")
    t, d = llama_target(tmp_path), eagle3_draft(tmp_path, eagle_ids=[1, 3, 4])
    sched, calls = real_scheduler(t, d, "EAGLE3")
    f = probe.startup_facts(sched)
    assert f.layers_to_capture == (2, 4, 5)  # SGLang's Llama setter: eagle_config [1, 3, 4] + 1
    assert f.capture_enabled and f.spec_aux_enabled and f.is_eagle3
    Scheduler.init_all_cuda_graphs(sched)
    assert calls == ["target graphs", "draft"]
    assert set(plugin._REGISTERED) == {
        targets.STARTUP_HOOK,
        targets.SCHEDULER_INIT_HOOK,
        targets.TP_FORWARD_HOOK,
        targets.RESULT_HOOK,
        targets.VERIFY_HOOK,
        targets.REQUEST_HOOK,
        targets.FINAL_STATE_HOOK,
        targets.SET_STATE_HOOK,
        targets.GET_STATE_HOOK,
        targets.DRAFT_EXTEND_PREFILL_HOOK,
        targets.DRAFT_EXTEND_DECODE_HOOK,
        targets.ACCEPT_HOOK,
    }
    assert set(plugin._REGISTERED) <= hooks._patched
    # Draft extend for prefill with H-wide states (what EAGLE mode would feed): refused before the draft runs.
    with pytest.raises(plugin.DraftWidthError, match="receives 64-wide states but its fc expects 192"):
        EagleDraftWorker._draft_extend_for_prefill(None, None, torch.empty(5, 64, device="meta"), None)
    result = SimpleNamespace(logits_output=SimpleNamespace(hidden_states=torch.empty(4, 64, device="meta")))
    with pytest.raises(plugin.DraftWidthError, match="_draft_extend_for_decode"):
        EagleDraftWorker._draft_extend_for_decode(None, None, result)
    # The right width passes the check (SGLang's own code then runs, here on junk arguments).
    with pytest.raises(Exception) as e:
        EagleDraftWorker._draft_extend_for_prefill(None, None, torch.empty(5, 192, device="meta"), None)
    assert not isinstance(e.value, plugin.DraftWidthError)
    assert plugin._RUNTIME.width_checks == 3 and plugin._RUNTIME.width_errors == 2
    # Watchdog through SGLang's EAGLEWorkerV2.on_verify_complete_cpu (no adaptive controller).
    worker = SimpleNamespace(adaptive_controller=None)
    with caplog.at_level(logging.WARNING, logger="eagle_io.serving"):
        EAGLEWorkerV2.on_verify_complete_cpu(worker, [0, 0, 0, 0], batch_size=4)
        EAGLEWorkerV2.on_verify_complete_cpu(worker, [0, 0, 0, 0], batch_size=4)
    assert "mean accept length 1.00 over the last 8 request steps" in caplog.text
    assert "algorithm EAGLE3" in caplog.text


@needs_sglang
def test_watchdog_expects_what_the_served_drafts_profile_says(tmp_path, hooks, monkeypatch, caplog):
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    monkeypatch.setenv(plugin.ENV_ACCEPT_WINDOW, "8")
    t, d = llama_target(tmp_path), eagle3_draft(tmp_path, eagle_ids=[1, 3, 4])
    write_profile(d, "offline", [0.9, 0.8, 0.7], samples=40)
    sched, _ = real_scheduler(t, d, "EAGLE3", num_steps=2)
    Scheduler.init_all_cuda_graphs(sched)
    wd = plugin._RUNTIME.watchdog
    assert wd.expected == pytest.approx(2.7) and "2.70 at 2 steps, offline on 40 samples" in wd.expected_from
    worker = SimpleNamespace(adaptive_controller=None)
    with caplog.at_level(logging.WARNING, logger="eagle_io.serving"):
        EAGLEWorkerV2.on_verify_complete_cpu(worker, [2, 2, 2, 2], batch_size=4)  # 3.0: as expected
        EAGLEWorkerV2.on_verify_complete_cpu(worker, [1, 2, 2, 2], batch_size=4)
        assert wd.windows == 1 and wd.low_warnings == 0
        EAGLEWorkerV2.on_verify_complete_cpu(worker, [0, 0, 1, 0], batch_size=4)  # half the window at 1.06
        EAGLEWorkerV2.on_verify_complete_cpu(worker, [0, 0, 0, 0], batch_size=4)
    assert wd.windows == 2 and wd.low_warnings == 1
    assert "mean accept length 1.12 over the last 8 request steps" in caplog.text and "the 2.70" in caplog.text


@needs_sglang
@pytest.mark.parametrize(
    ("name", "value"),
    [("EAGLE_IO_ACCEPT_WINDOW", "abc"), ("EAGLE_IO_ACCEPT_WINDOW", "0"), ("EAGLE_IO_ACCEPT_WINDOW", "-8"),
     ("EAGLE_IO_ACCEPT_FRACTION", "half"), ("EAGLE_IO_ACCEPT_FRACTION", "nan"), ("EAGLE_IO_ACCEPT_FRACTION", "-1")],
)  # fmt: skip
def test_watchdog_settings_out_of_range_stop_the_launch_naming_the_variable(tmp_path, hooks, monkeypatch, name, value):
    """A bad value was a bare ``ValueError: invalid literal for int()`` at startup (no variable named), a window of
    0 or less made every verify step a window (a loud warning on each), and NaN switched the expected rule off."""
    from sglang.srt.managers.scheduler import Scheduler

    monkeypatch.setenv(name, value)
    t, d = llama_target(tmp_path), eagle3_draft(tmp_path, eagle_ids=[1, 3, 4])
    sched, _ = real_scheduler(t, d, "EAGLE3")
    with pytest.raises(eagle_io.InvalidArgumentError, match=f"{name}='{value}': must be"):
        Scheduler.init_all_cuda_graphs(sched)


@needs_sglang
def test_width_check_warn_mode(tmp_path, hooks, monkeypatch, caplog):
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    monkeypatch.setenv(plugin.ENV_DRAFT_WIDTH_CHECK, "warn")
    t, d = llama_target(tmp_path), eagle3_draft(tmp_path, eagle_ids=[1, 3, 4])
    sched, _ = real_scheduler(t, d, "EAGLE3")
    Scheduler.init_all_cuda_graphs(sched)
    with caplog.at_level(logging.ERROR, logger="eagle_io.serving"), pytest.raises(Exception) as e:
        EagleDraftWorker._draft_extend_for_prefill(None, None, torch.empty(5, 64, device="meta"), None)
    assert not isinstance(e.value, plugin.DraftWidthError)  # logged, then SGLang's code ran
    assert "receives 64-wide states" in caplog.text


@needs_sglang
def test_guard_layer_ids_past_the_last_layer(tmp_path, hooks):
    from sglang.srt.managers.scheduler import Scheduler

    t, d = llama_target(tmp_path), eagle3_draft(tmp_path, eagle_ids=[1, 4, 7])  # Llama +1 -> [2, 5, 8], N = 8
    sched, calls = real_scheduler(t, d, "EAGLE3")
    assert probe.startup_facts(sched).layers_to_capture == (2, 5, 8)
    with pytest.raises(plugin.ServingGuardError, match=r"ids outside 1\.\.7") as e:
        Scheduler.init_all_cuda_graphs(sched)
    assert "only 2 of 3 states" in str(e.value) and calls == []


@needs_sglang
def test_guard_switched_off(tmp_path, hooks, monkeypatch):
    from sglang.srt.managers.scheduler import Scheduler

    monkeypatch.setenv(plugin.ENV_STARTUP_GUARD, "0")
    t, d = llama_target(tmp_path), eagle3_draft(tmp_path, eagle_ids=[1, 3, 4])
    sched, calls = real_scheduler(t, d, "EAGLE")
    Scheduler.init_all_cuda_graphs(sched)
    assert calls == ["target graphs", "draft"]


@needs_sglang
def test_guard_kimi_k25_wrapper(tmp_path, hooks):
    """Kimi-K2.5 (real KimiK25Config, 61 layers x 7168): capture lives on ``language_model``."""
    from sglang.srt.managers.scheduler import Scheduler

    t, d = kimi_k25(tmp_path, algo_ids=[1, 29, 57])
    sched, calls = real_scheduler(t, d, "EAGLE3")
    f = probe.startup_facts(sched)
    assert (f.target_architecture, f.target_hidden_size, f.target_num_layers) == (
        "KimiK25ForConditionalGeneration",
        7168,
        61,
    )
    assert f.capture_enabled and f.layers_to_capture == (2, 30, 58) and f.fc_in_width == 21504
    Scheduler.init_all_cuda_graphs(sched)
    assert calls == ["target graphs", "draft"]

    sched, calls = real_scheduler(t, d, "NEXTN")
    with pytest.raises(plugin.ServingGuardError, match="7168-wide final states instead of 21504"):
        Scheduler.init_all_cuda_graphs(sched)
    assert calls == []


@needs_sglang
def test_guard_kimi_k25_wrapper_not_delegating(tmp_path, hooks):
    from sglang.srt.managers.scheduler import Scheduler

    t, d = kimi_k25(tmp_path, algo_ids=[1, 29, 57])
    sched, calls = real_scheduler(t, d, "EAGLE3", wrapper_delegates=False)
    with pytest.raises(plugin.ServingGuardError, match="does not capture aux states"):
        Scheduler.init_all_cuda_graphs(sched)
    assert calls == []


@needs_sglang
def test_non_speculative_launch_is_left_alone(hooks):
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    calls: list[str] = []
    sched = SimpleNamespace(
        spec_algorithm=SpeculativeAlgorithm.NONE,
        tp_worker=SimpleNamespace(init_cuda_graphs=lambda: calls.append("target graphs")),
        draft_worker=None,
    )
    Scheduler.init_all_cuda_graphs(sched)
    assert calls == ["target graphs"]
    capture = {targets.TP_FORWARD_HOOK, targets.RESULT_HOOK, targets.VERIFY_HOOK, targets.REQUEST_HOOK,
               targets.FINAL_STATE_HOOK, targets.SET_STATE_HOOK, targets.GET_STATE_HOOK}  # fmt: skip
    assert {targets.STARTUP_HOOK, targets.SCHEDULER_INIT_HOOK, *capture} == plugin._REGISTERED


_LOAD_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import sglang.srt.managers.scheduler as sched_mod  # as in run_scheduler_process
    import sglang.srt.plugins as plugins_mod
    from sglang.srt.plugins.hook_registry import HookRegistry
    keep = {"original": sched_mod.Scheduler.init_all_cuda_graphs,  # in a dict: HookRegistry rebinds module globals
            "init": sched_mod.Scheduler.__init__}
    for env in json.loads(sys.argv[1]):  # one fresh load_plugins() per scenario
        os.environ.update(env)
        plugins_mod._plugins_loaded = False
        plugins_mod.load_plugins()
        hooks = {t: [(ht.value, getattr(h, "__module__", ""), src.plugin_name if src else None) for ht, h, src in v]
                 for t, v in HookRegistry._hooks.items()}
        print(json.dumps({
            "hooks": hooks,
            "patched": sorted(HookRegistry._patched),
            "wrapped": sched_mod.Scheduler.init_all_cuda_graphs is not keep["original"],
        }))
        for k in env:
            del os.environ[k]
        sched_mod.Scheduler.init_all_cuda_graphs = keep["original"]
        sched_mod.Scheduler.__init__ = keep["init"]
        HookRegistry.reset()
        import eagle_io.serving.plugin as p
        import eagle_io.sglang.hooks as h
        p._REGISTERED.clear()
        h.forget()
    """
)


def _installed_declares_entry_point() -> bool:
    from importlib.metadata import entry_points

    return any(
        ep.value == "eagle_io.sglang_plugin:register" and ep.dist is not None and ep.dist.name == "eagle-io"
        for ep in entry_points(group="sglang.srt.plugins")
    )


def _load_plugins(tmp_path: Path, scenarios: list[dict[str, str]]) -> list[dict]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE_IO_", "SGLANG_PLUGINS"))}
    e["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    cmd = [sys.executable, "-c", _LOAD_SCRIPT, json.dumps(scenarios)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return [json.loads(line) for line in r.stdout.strip().splitlines() if line.startswith("{")]


@needs_sglang
def test_entry_point_loads_through_load_plugins(tmp_path):
    """SGLang's real ``load_plugins()`` in a fresh process discovers the entry point, runs ``register`` and applies
    the startup hooks (guard, then capture by environment) to ``Scheduler.init_all_cuda_graphs``;
    ``EAGLE_IO_SGLANG_PLUGIN=0`` and SGLang's own ``SGLANG_PLUGINS`` whitelist switch it off."""
    default, off, other, mine = _load_plugins(
        tmp_path,
        [{}, {"EAGLE_IO_SGLANG_PLUGIN": "0"}, {"SGLANG_PLUGINS": "someone_else"}, {"SGLANG_PLUGINS": "eagle_io"}],
    )
    assert default["hooks"] == {
        targets.STARTUP_HOOK: [  # the guard first, then the capture's start by environment
            ["before", "eagle_io.serving.plugin", "eagle_io"],
            ["before", "eagle_io.capturing.sglang.scheduler", "eagle_io"],
        ],
        targets.TP_FORWARD_HOOK: [["after", "eagle_io.capturing.sglang.scheduler", "eagle_io"]],
        targets.RESULT_HOOK: [["after", "eagle_io.capturing.sglang.scheduler", "eagle_io"]],
        targets.VERIFY_HOOK: [["after", "eagle_io.capturing.sglang.scheduler", "eagle_io"]],
        targets.REQUEST_HOOK: [["after", "eagle_io.capturing.sglang.scheduler", "eagle_io"]],
        targets.FINAL_STATE_HOOK: [["after", "eagle_io.capturing.sglang.scheduler", "eagle_io"]],
        targets.SET_STATE_HOOK: [["around", "eagle_io.capturing.sglang.scheduler", "eagle_io"]],
        targets.GET_STATE_HOOK: [["after", "eagle_io.capturing.sglang.scheduler", "eagle_io"]],
        targets.SCHEDULER_INIT_HOOK: [["before", "eagle_io.serving.plugin", "eagle_io"]],  # the hooks' check
    }
    assert {targets.STARTUP_HOOK, targets.TP_FORWARD_HOOK, targets.SCHEDULER_INIT_HOOK} <= set(default["patched"])
    assert default["wrapped"]
    assert off["hooks"] == {} and not off["wrapped"]
    assert other["hooks"] == {} and not other["wrapped"]
    assert mine["hooks"] == default["hooks"] and mine["wrapped"]


_ENGINE_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import sglang

    if __name__ == "__main__":
        engine = sglang.Engine(
            model_path=sys.argv[1], device="cpu", attention_backend="torch_native", disable_cuda_graph=True,
            skip_tokenizer_init=True, max_total_tokens=2048, chunked_prefill_size=-1, disable_radix_cache=True,
            max_running_requests=4, dtype="bfloat16", log_level="warning", mem_fraction_static=0.3,
        )
        try:
            out = engine.generate(input_ids=[[5, 6, 7, 8]], sampling_params={"max_new_tokens": 2, "temperature": 0})
        finally:
            engine.shutdown()
        print(json.dumps({"pid": os.getpid(), "output_ids": out[0]["output_ids"]}))
    """
)


@needs_sglang
@pytest.mark.slow
def test_startup_hook_runs_in_a_real_scheduler_process(tmp_path):
    """A real CPU SGLang Engine (non-speculative; the speculative ones: tests/test_sglang_spec.py):
    its spawned scheduler process loads the plugin through the entry point and runs the startup hook before
    ``init_all_cuda_graphs``; the hook's report (``EAGLE_IO_GUARD_REPORT``) comes from that process. Uses the
    test-only ``sgl_kernel`` of tests/support/sgl_kernel_torch (:mod:`helpers.sglang_cpu`)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1000,
        max_position_embeddings=2048,
    )
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp_path / "target")
    script = tmp_path / "engine.py"
    script.write_text(_ENGINE_SCRIPT)
    report = tmp_path / "guard.jsonl"
    env = cpu_engine_env(EAGLE_IO_GUARD_REPORT=str(report))
    r = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "target")], capture_output=True, text=True, env=env, timeout=900
    )
    assert r.returncode == 0, r.stderr[-4000:]
    engine = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(engine["output_ids"]) == 2
    (line,) = report.read_text().splitlines()  # one scheduler process (tp 1)
    rep = json.loads(line)
    assert rep["pid"] != engine["pid"]  # written by the spawned scheduler process, not the engine's
    assert rep["algorithm"] == "NONE" and rep["guarded"] is False
    assert targets.STARTUP_HOOK in rep["patched"]
    assert rep["sglang"] == compat.sglang_version()


@needs_sglang
def test_installed_wheel_declares_the_entry_point():
    assert _installed_declares_entry_point(), 'pyproject.toml declares [project.entry-points."sglang.srt.plugins"]'
    from importlib.metadata import entry_points

    (ep,) = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "eagle_io"]
    assert ep.load() is sglang_plugin.register


def test_startup_decision_counts_captured_states_not_ids():
    """eagle_config [3, 3, 7] / [1, 1, 1] through Llama's +1: the forward captures each layer once."""
    msg = plugin.startup_decision(facts(target_num_layers=36, layers_to_capture=(4, 4, 8)))
    assert msg is not None and "names layer 4 more than once" in msg and "only 2 of 3 states are captured" in msg
    assert "captures 2 aux states" in msg and "= 128 wide, but the draft's fc expects 192" in msg
    msg = plugin.startup_decision(facts(target_num_layers=36, layers_to_capture=(2, 2, 2)))
    assert msg is not None and "only 1 of 3 states are captured" in msg
    assert plugin.startup_decision(facts(target_num_layers=36, layers_to_capture=(4, 5, 8))) is None
    # DeepSeek-family targets pack the states: SGLang raises at the first forward instead of sending fewer.
    deepseek = facts(target_architecture="DeepseekV3ForCausalLM", target_num_layers=36, layers_to_capture=(4, 4, 8))
    msg = plugin.startup_decision(deepseek)
    assert "AuxHiddenStatePacker on DeepseekV3ForCausalLM raises 'captured 2 of 3 aux hidden states'" in msg
    assert "states are captured and sent" not in msg


@needs_sglang
@pytest.mark.parametrize("ids", [[3, 3, 7], [1, 1, 1]])
def test_guard_duplicate_eagle_config_ids(tmp_path, hooks, ids):
    from sglang.srt.managers.scheduler import Scheduler

    t, d = llama_target(tmp_path, layers=36), eagle3_draft(tmp_path, eagle_ids=ids)
    sched, calls = real_scheduler(t, d, "EAGLE3")
    assert probe.startup_facts(sched).layers_to_capture == tuple(i + 1 for i in ids)  # SGLang's real setter
    with pytest.raises(plugin.ServingGuardError, match="more than once"):
        Scheduler.init_all_cuda_graphs(sched)
    assert calls == []


class _FlagBackbone(torch.nn.Module):
    """TEST-ONLY: a text backbone whose forward captures the layers *flagged* ``_is_layer_to_capture`` (the rule of
    SGLang's Qwen3.5 / Qwen3-Next / MiniMax-M3 backbones), with their setter."""

    def __init__(self, n: int = 8) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Identity() for _ in range(n))
        self.layers_to_capture: list[int] = []

    def set_eagle3_layers_to_capture(self, layers_to_capture):
        self.layers_to_capture = layers_to_capture
        for i in layers_to_capture:
            self.layers[i]._is_layer_to_capture = True

    def forward(self, x):
        aux = []
        for layer in self.layers:
            if getattr(layer, "_is_layer_to_capture", False):
                aux.append(x)
            x = layer(x)
        return x, aux


class _VLWrapper(torch.nn.Module):
    """TEST-ONLY: a Qwen3.5-VL-style wrapper; ``delegates=False`` sets the flags and assigns ``layers_to_capture``
    without calling the backbone's setter (so the flags the backbone's forward reads stay unset)."""

    def __init__(self, text: torch.nn.Module, delegates: bool) -> None:
        super().__init__()
        self.model, self.delegates = text, delegates
        self.capture_aux_hidden_states = False

    def set_eagle3_layers_to_capture(self, layer_ids):
        self.capture_aux_hidden_states = True
        self.model.capture_aux_hidden_states = True
        ids = [i + 1 for i in layer_ids]
        if self.delegates:
            self.model.set_eagle3_layers_to_capture(ids)
        else:
            self.model.layers_to_capture = ids


def test_wiring_probe_catches_a_wrapper_that_records_nothing():
    good, bad = _VLWrapper(_FlagBackbone(), True), _VLWrapper(_FlagBackbone(), False)
    for w in (good, bad):
        w.set_eagle3_layers_to_capture([1, 3, 4])
        assert w.capture_aux_hidden_states and w.model.layers_to_capture == [2, 4, 5]
    x = torch.zeros(1, 4)
    assert len(good.model(x)[1]) == 3 and len(bad.model(x)[1]) == 0  # what a one-token forward would show
    assert probe.capture_wiring_problems(good) == ()
    (p,) = probe.capture_wiring_problems(bad)
    assert "_FlagBackbone.forward captures the layers flagged _is_layer_to_capture ([])" in p
    assert "layers_to_capture ([2, 4, 5])" in p and "0 aux states arrive instead of 3" in p
    msg = plugin.startup_decision(facts(wiring_problems=probe.capture_wiring_problems(bad)))
    assert msg is not None and "the target's capture is not wired" in msg
    # A wrapper whose flag is on while its language model's is off: the language model returns no aux states.
    lm = _VLWrapper(_FlagBackbone(), True)
    lm.set_eagle3_layers_to_capture([1, 3, 4])
    lm.capture_aux_hidden_states = False
    top = torch.nn.Module()
    top.language_model, top.capture_aux_hidden_states = lm, True
    (p,) = probe.capture_wiring_problems(top)
    assert "on for Module, _FlagBackbone but off for _VLWrapper" in p
    # Nothing to check on a model without decoder layers (the stand-ins above): no finding.
    assert probe.capture_wiring_problems(torch.nn.Linear(2, 2)) == ()


@needs_sglang
def test_wiring_probe_on_sglangs_qwen3_vl_setter_and_qwen35_backbone(tmp_path, hooks):
    """SGLang's real Qwen3VLForConditionalGeneration.set_eagle3_layers_to_capture on SGLang's real Qwen3.5 backbone
    class (its forward reads _is_layer_to_capture): wired. The same backbone given only a layers_to_capture list:
    the startup guard aborts before CUDA graphs."""
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.models.qwen3_5 import Qwen3_5ForCausalLM
    from sglang.srt.models.qwen3_vl import Qwen3VLForConditionalGeneration

    def backbone():
        m = Qwen3_5ForCausalLM.__new__(Qwen3_5ForCausalLM)  # SGLang's class, without its distributed init
        torch.nn.Module.__init__(m)
        m.layers = torch.nn.ModuleList(torch.nn.Identity() for _ in range(8))
        m.layers_to_capture = []
        return m

    def wrapper(text):
        w = _named("Qwen3_5ForConditionalGeneration", torch.nn.Module)()
        w.model, w.capture_aux_hidden_states = text, False
        w.config, w.pp_group = SimpleNamespace(num_hidden_layers=8), SimpleNamespace(is_last_rank=True)
        return w

    good = wrapper(backbone())
    Qwen3VLForConditionalGeneration.set_eagle3_layers_to_capture(good, [1, 3, 4])
    assert good.model.layers_to_capture == [2, 4, 5] and probe.capture_wiring_problems(good) == ()
    bad = wrapper(backbone())
    bad.capture_aux_hidden_states = bad.model.capture_aux_hidden_states = True
    bad.model.layers_to_capture = [2, 4, 5]  # assigned, not set through Qwen3_5ForCausalLM's setter
    (p,) = probe.capture_wiring_problems(bad)
    assert "Qwen3_5ForCausalLM.forward captures the layers flagged _is_layer_to_capture ([])" in p

    t, d = llama_target(tmp_path), eagle3_draft(tmp_path, eagle_ids=[1, 3, 4])
    sched, calls = real_scheduler(t, d, "EAGLE3")
    sched.tp_worker.model_runner.model = bad
    with pytest.raises(plugin.ServingGuardError, match="the target's capture is not wired"):
        Scheduler.init_all_cuda_graphs(sched)
    assert calls == []
    sched.tp_worker.model_runner.model = good
    Scheduler.init_all_cuda_graphs(sched)
    assert calls == ["target graphs", "draft"]


# ------------------------------------------------------------------------------------- hooks that fail loudly


@needs_sglang
def test_every_known_hook_target_resolves_on_the_installed_sglang():
    """A new SGLang pin that moves or renames one of them fails here (SGLang itself would only log it)."""
    assert [t for t in targets.KNOWN_TARGETS if targets.unresolved(t) is not None] == []
    assert targets.unresolved("sglang.srt.managers.scheduler.Scheduler.init_all_cuda_graphs_v2").startswith(
        "AttributeError"
    )
    assert "no_such_module" in targets.unresolved("sglang.srt.speculative.no_such_module.Worker.run")


@needs_sglang
def test_a_startup_target_that_does_not_resolve_stops_the_launch_at_scheduler_init(hooks, monkeypatch):
    """``load_plugins`` only logs what ``register()`` raises: the failure is raised from the ``Scheduler.__init__``
    hook instead, naming the target, the SGLang version and the switch."""
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.plugins.hook_registry import HookRegistry

    original_init = Scheduler.__init__
    hooks.reset()
    targets.forget()
    plugin._REGISTERED.clear()
    moved = "sglang.srt.managers.scheduler.Scheduler.init_all_cuda_graphs_renamed"
    monkeypatch.setattr(targets, "STARTUP_HOOK", moved)
    sglang_plugin.register()
    HookRegistry.apply_hooks()
    assert {targets.SCHEDULER_INIT_HOOK} == plugin._REGISTERED - {targets.SERVER_INFO_HOOK}  # nothing else placed
    with pytest.raises(eagle_io.errors.SGLangCompatError) as e:
        Scheduler.__init__(object.__new__(Scheduler))
    msg = str(e.value)
    assert f"cannot hook {moved}" in msg and f"SGLang {compat.sglang_version()}" in msg
    assert "set EAGLE_IO_SGLANG_PLUGIN=0" in msg
    monkeypatch.setattr(Scheduler, "__init__", original_init)  # the fixture unwraps the rest


@needs_sglang
def test_a_hook_sglang_did_not_apply_is_found(hooks, monkeypatch):
    """A target that resolves but that ``HookRegistry.apply_hooks`` failed to patch (it logs and goes on)."""
    from sglang.srt.managers.scheduler import Scheduler

    hooks._patched.discard(targets.TP_FORWARD_HOOK)  # as if applying it had failed
    with pytest.raises(eagle_io.errors.SGLangCompatError, match="HookRegistry did not apply it") as e:
        Scheduler.__init__(object.__new__(Scheduler))
    assert targets.TP_FORWARD_HOOK in str(e.value) and "EAGLE_IO_SGLANG_CAPTURE=0" in str(e.value)


@needs_sglang
def test_an_sglang_outside_the_supported_range_stops_the_launch_unless_allowed(hooks, monkeypatch):
    from sglang.srt.managers.scheduler import Scheduler

    original_init = Scheduler.__init__
    for allow, stopped in ((None, True), ("0.7.0", False)):
        hooks.reset()
        targets.forget()
        plugin._REGISTERED.clear()
        monkeypatch.setattr(Scheduler, "__init__", original_init)
        monkeypatch.setattr(compat, "sglang_version", lambda: "0.7.0")
        if allow:
            monkeypatch.setenv(plugin.ENV_ALLOW_SGLANG, allow)
        sglang_plugin.register()
        hooks.apply_hooks()
        if stopped:
            with pytest.raises(eagle_io.errors.SGLangCompatError, match=r"SGLang 0\.7\.0 is outside") as e:
                Scheduler.__init__(object.__new__(Scheduler))
            assert "set EAGLE_IO_ALLOW_SGLANG_VERSION=0.7.0" in str(e.value)
        else:
            assert targets.STARTUP_HOOK in plugin._REGISTERED
            with pytest.raises(Exception) as e:  # the check passes; SGLang's own __init__ then fails on no args
                Scheduler.__init__(object.__new__(Scheduler))
            assert not isinstance(e.value, eagle_io.errors.SGLangCompatError)
    monkeypatch.setattr(Scheduler, "__init__", original_init)


@needs_sglang
def test_a_draft_worker_without_the_hooked_method_stops_the_launch(tmp_path, hooks):
    """A draft worker class that does not define ``_draft_extend_for_prefill`` (SGLang renamed it): the guard's
    runtime checks cannot be placed, and the launch stops naming the method and the switch."""
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    class RenamedDraftWorker:  # a future SGLang's draft worker
        def _draft_extend_prefill_v2(self, *a): ...

    t, d = llama_target(tmp_path), eagle3_draft(tmp_path, eagle_ids=[1, 3, 4])
    sched, calls = real_scheduler(t, d, "EAGLE3", workers=(EAGLEWorkerV2, RenamedDraftWorker))
    with pytest.raises(eagle_io.errors.SGLangCompatError) as e:
        Scheduler.init_all_cuda_graphs(sched)
    msg = str(e.value)
    assert "RenamedDraftWorker._draft_extend_for_prefill" in msg and "set EAGLE_IO_DRAFT_WIDTH_CHECK=0" in msg
    assert calls == []


@needs_sglang
def test_multi_layer_eagle_gets_the_width_check_and_the_watchdog(tmp_path, hooks, monkeypatch, caplog):
    """``--enable-multi-layer-eagle``: ``MultiLayerEagleDraftWorker`` has its own draft extends, and
    ``MultiLayerEagleWorkerV2`` inherits ``BaseSpecWorker.on_verify_complete_cpu``: the hooks go there."""
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.speculative.multi_layer_eagle_worker_v2 import (
        MultiLayerEagleDraftWorker,
        MultiLayerEagleWorkerV2,
    )

    monkeypatch.setenv(plugin.ENV_ACCEPT_WINDOW, "4")
    t, d = llama_target(tmp_path), eagle3_draft(tmp_path, eagle_ids=[1, 3, 4])
    sched, calls = real_scheduler(t, d, "EAGLE3", workers=(MultiLayerEagleWorkerV2, MultiLayerEagleDraftWorker))
    Scheduler.init_all_cuda_graphs(sched)
    assert calls == ["target graphs", "draft"]  # the guard let it start
    ml = "sglang.srt.speculative.multi_layer_eagle_worker_v2.MultiLayerEagleDraftWorker"
    base = "sglang.srt.speculative.base_spec_worker.BaseSpecWorker.on_verify_complete_cpu"
    assert {f"{ml}._draft_extend_for_prefill", f"{ml}._draft_extend_for_decode", base} <= plugin._REGISTERED
    assert {f"{ml}._draft_extend_for_prefill", base} <= set(targets.KNOWN_TARGETS)
    with pytest.raises(plugin.DraftWidthError, match="receives 64-wide states but its fc expects 192"):
        MultiLayerEagleDraftWorker._draft_extend_for_prefill(None, None, torch.empty(3, 64, device="meta"), None)
    with caplog.at_level(logging.WARNING, logger="eagle_io.serving"):
        MultiLayerEagleWorkerV2.on_verify_complete_cpu(sched.draft_worker, [0, 0, 0, 0], batch_size=4)
    assert "mean accept length 1.00 over the last 4 request steps" in caplog.text


@needs_sglang
def test_guard_refuses_an_eagle3_draft_that_sglang_builds_without_fc(tmp_path, hooks):
    """An EAGLE-3 draft (eagle_config ids, draft_vocab_size) declaring a plain LlamaForCausalLM, launched as EAGLE3:
    SGLang builds a plain Llama, drops fc.weight, and would serve it; the guard refuses it with check-serving's
    draft-architecture rule."""
    from sglang.srt.managers.scheduler import Scheduler

    t, d = llama_target(tmp_path), eagle3_draft(tmp_path, arch="LlamaForCausalLM", eagle_ids=[1, 3, 4])
    sched, calls = real_scheduler(t, d, "EAGLE3")
    f = probe.startup_facts(sched)
    assert f.draft_class == "LlamaForCausalLM" and f.fc_in_width is None and plugin.draft_is_eagle3(f)
    with pytest.raises(plugin.ServingGuardError, match="builds the draft as 'LlamaForCausalLM'") as e:
        Scheduler.init_all_cuda_graphs(sched)
    assert 'set "architectures": ["LlamaForCausalLMEagle3"]' in str(e.value) and calls == []
    # The same rule, from the same place, for a live EAGLE-3 class that lost its fc.
    assert "without an fc" in plugin.startup_decision(facts(fc_in_width=None))


class _HelperBackbone(torch.nn.Module):
    """TEST-ONLY: a flag-selecting text backbone whose ``forward`` hands the layer loop to a helper (the flag is
    read there, not in ``forward``), without a capture setter; like Qwen3.5 it returns plain states when it
    captured nothing."""

    def __init__(self, n: int = 8) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Identity() for _ in range(n))
        self.layers_to_capture: list[int] = []

    def forward(self, input_ids=None, positions=None, forward_batch=None, pp_proxy_tensors=None):
        return self._run_layers(input_ids.float()[:, None].expand(-1, 4))

    def _run_layers(self, x):
        aux = []
        for layer in self.layers:
            if getattr(layer, "_is_layer_to_capture", False):
                aux.append(x)
            x = layer(x)
        return (x, aux) if aux else x


@needs_sglang
def test_a_vl_wrapper_whose_decoder_records_nothing_fails_its_first_request_in_the_target(tmp_path, hooks):
    """SGLang's real Qwen3VLForConditionalGeneration setter on a backbone without one: it sets the capture flags and
    assigns layers_to_capture, every per-layer flag stays False. Its first request does not reach the draft-extend
    width check: SGLang's own Qwen3VL forward unpacks the backbone's plain states as (states, aux) and fails inside
    the target forward (a ValueError, not DraftWidthError). So the startup probe must catch it, and now does (the
    flag is read in a helper of forward, which the probe did not read)."""
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.models.qwen3_vl import Qwen3VLForConditionalGeneration

    w = _named("Qwen3_5ForConditionalGeneration", torch.nn.Module)()
    w.model, w.capture_aux_hidden_states = _HelperBackbone(), False
    w.config, w.pp_group = SimpleNamespace(num_hidden_layers=8), SimpleNamespace(is_last_rank=True)
    w.is_mrope_enabled, w.language_model_only, w.lm_head = False, True, None
    w.logits_processor = lambda ids, states, head, batch, aux: SimpleNamespace(hidden_states=aux)
    Qwen3VLForConditionalGeneration.set_eagle3_layers_to_capture(w, [1, 3, 4])  # SGLang's setter
    assert w.capture_aux_hidden_states and w.model.capture_aux_hidden_states and w.model.layers_to_capture == [2, 4, 5]
    assert not any(getattr(layer, "_is_layer_to_capture", False) for layer in w.model.layers)
    with pytest.raises(ValueError, match="too many values to unpack") as e:  # the first request, 5 tokens
        Qwen3VLForConditionalGeneration.forward(w, torch.arange(5), torch.arange(5), SimpleNamespace())
    assert not isinstance(e.value, plugin.DraftWidthError) and plugin._RUNTIME.width_checks == 0
    (p,) = probe.capture_wiring_problems(w)
    assert "_HelperBackbone.forward captures the layers flagged _is_layer_to_capture ([])" in p
    t, d = llama_target(tmp_path), eagle3_draft(tmp_path, eagle_ids=[1, 3, 4])
    sched, calls = real_scheduler(t, d, "EAGLE3")
    sched.tp_worker.model_runner.model = w
    with pytest.raises(plugin.ServingGuardError, match="the target's capture is not wired"):
        Scheduler.init_all_cuda_graphs(sched)
    assert calls == []


def test_an_sglang_without_package_metadata_is_named_by_its_own_version(monkeypatch):
    """SGLang run from a source tree has no dist-info: the version read as None stopped every launch with "set
    EAGLE_IO_ALLOW_SGLANG_VERSION=None", a setting that could never match; its own ``__version__`` names it."""
    import importlib.metadata

    real = importlib.metadata.version

    def no_sglang(name):
        if name == "sglang":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", no_sglang)
    monkeypatch.setitem(sys.modules, "sglang", SimpleNamespace(__version__="0.0.0.dev0"))
    assert compat.sglang_version() == "0.0.0.dev0"
    problem = plugin._version_problem()
    assert problem is not None and "set EAGLE_IO_ALLOW_SGLANG_VERSION=0.0.0.dev0" in str(problem)
    monkeypatch.setenv(plugin.ENV_ALLOW_SGLANG, "0.0.0.dev0")
    assert plugin._version_problem() is None
    monkeypatch.delitem(sys.modules, "sglang")
    assert compat.sglang_version() is None


def test_sglangs_keys_never_leave_in_server_info():
    """Found on a real CPU server: SGLang 0.5.23's /server_info (readable by anyone when only --admin-api-key is set,
    and by every API user otherwise) answered the admin key in clear, in its field and in launch_command; a forced stop
    and a hijacked capture followed. The plugin's hook on its redaction redacts both keys."""
    launch = "python -m sglang.launch_server --admin-api-key ADMIN-KEY --api-key=A-KEY --port 1"
    info = {"api_key": "A-KEY", "admin_api_key": "ADMIN-KEY", "port": 30000, "launch_command": launch}
    out = plugin.redact_keys(info)
    assert "A-KEY" not in json.dumps(out) and "ADMIN-KEY" not in json.dumps(out), out
    assert out["port"] == 30000 and out["launch_command"].endswith("--api-key=<redacted> --port 1")
    argv = ["sglang", "--admin-api-key", "K", "--model-path", "m"]
    assert plugin.redact_keys({"launch_command": argv})["launch_command"] == [
        "sglang", "--admin-api-key", "<redacted>", "--model-path", "m"]  # fmt: skip
    assert plugin.redact_keys({"api_key": None})["api_key"] is None
