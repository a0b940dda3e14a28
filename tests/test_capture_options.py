"""One capture options object (eagle_io.capturing.options.CaptureOptions), checked once and carried unchanged from
``eagle_io.capture`` to the capture core on both backends; what a backend cannot honour is refused."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import torch

import eagle_io
from eagle_io.capturing.options import CaptureOptions
from eagle_io.capturing.sglang import capture as cc
from eagle_io.capturing.sglang.client import ServerCapture


def test_options_round_trip_through_json_and_refuse_unknown_keys():
    o = CaptureOptions(
        target_info={"num_layers": 8},
        aux_layer_ids=[2, 4, 5],
        state_dtype=torch.float32,
        precision="fp8",
        drop_when_full=True,
        writer_options={"shard_bytes": 1 << 20},
    )
    assert (o.state_dtype, o.aux_layer_ids) == ("float32", (2, 4, 5))
    wire = json.loads(json.dumps(o.to_dict()))
    assert CaptureOptions.from_dict(wire) == o and wire["aux_layer_ids"] == [2, 4, 5]
    # a misspelt option (issue 47, kind 3): named, the closest suggested, every option listed; still a TypeError
    with pytest.raises(eagle_io.errors.ArgumentTypeError) as e:
        CaptureOptions.from_dict({**wire, "drop_when_ful": True})
    assert str(e.value).startswith(
        "capture options: unknown keyword argument 'drop_when_ful' (did you mean 'drop_when_full'?); the valid ones: "
        "aux_layer_ids, dedup_prefixes, drop_when_full, implausible, max_length, metadata,"
    )
    assert isinstance(e.value, TypeError) and isinstance(e.value, eagle_io.InvalidArgumentError)
    with pytest.raises(eagle_io.InvalidArgumentError, match="nonfinite must be 'raise' or 'skip', not 'drop'"):
        o.replace(nonfinite="drop")
    with pytest.raises(eagle_io.InvalidArgumentError, match="aux_layer_ids must be a list of integers"):
        CaptureOptions(aux_layer_ids=[2, "15", 27])
    # before: `eagle-io live start --max-length 0` started a capture that counted every request too_long
    for bad in (0, -3, 8.5):
        with pytest.raises(eagle_io.InvalidArgumentError, match=f"max_length must be an integer >= 1.*not {bad}"):
            CaptureOptions(max_length=bad)


def test_sglang_refuses_writer_ranks_before_any_request(tmp_path):
    """Before: ``rank``/``world_size`` reached the schedulers' writers and were overwritten by the DP layout. Refused
    by the client before it sends anything (the URL answers nothing here), and by every scheduler on its own."""
    for key in ("rank", "world_size"):
        opts = CaptureOptions(writer_options={key: 1})
        with pytest.raises(eagle_io.InvalidArgumentError, match=f"{key}=1 cannot be honoured by eagle-io's SGLang"):
            opts.refuse_writer_ranks()
        with pytest.raises(eagle_io.InvalidArgumentError, match=f"{key}=1 cannot be honoured by eagle-io's SGLang"):
            ServerCapture("http://127.0.0.1:9", tmp_path, opts)
    CaptureOptions(writer_options={"shard_bytes": 1 << 20}).refuse_writer_ranks()


def test_an_in_process_sglang_engine_is_refused_naming_the_server_path(tmp_path):
    """HTTP is the one transport to SGLang: ``eagle_io.capture(engine)`` names the launcher and the URL path."""
    engine_cls = type("Engine", (), {"__module__": "sglang.srt.entrypoints.engine"})
    with pytest.raises(eagle_io.InvalidArgumentError, match=r"in-process sglang\.Engine: .*launch_capture_server"):
        eagle_io.capture(engine_cls(), tmp_path, target_info={"num_layers": 8})
    assert not list(tmp_path.iterdir()), "nothing written"


def test_the_sglang_scheduler_honours_drop_when_full(tmp_path, monkeypatch):
    """``drop_when_full`` was silently ignored on SGLang (``eagle_io.capture`` never passed it on): the scheduler's
    capture core now gets it, with every other option, from the JSON the client sent."""
    pytest.importorskip("sglang.srt.runtime_context")
    sched = _stand_in_scheduler(monkeypatch)
    sent = CaptureOptions(drop_when_full=True, ring_bytes=1 << 16, max_length=64, nonfinite="skip").to_dict()
    cap = cc.SchedulerCapture(sched, str(tmp_path), sent)
    sink = cap.store._sink
    assert sink._drop is True and sink.stats()["ring_capacity"] == 1 << 16
    assert (cap.store.nonfinite, cap.store.max_length) == ("skip", 64)
    cap.stop("t")
    # the scheduler allocates the ring, so it judges its size against its own memory; the client did not
    huge = CaptureOptions(ring_bytes=10**15).to_dict()
    with pytest.raises(eagle_io.InvalidArgumentError, match="the capture ring is allocated at once, and only"):
        cc.SchedulerCapture(sched, str(tmp_path / "huge"), huge)
    assert not (tmp_path / "huge").exists()


def _stand_in_scheduler(monkeypatch):
    """A scheduler-shaped stand-in SchedulerCapture's real ``__init__`` reads (one DP rank, capture-only mode)."""
    import sglang.srt.runtime_context as rc

    monkeypatch.setattr(rc, "get_parallel", lambda: SimpleNamespace(dp_size=1, attn_dp_size=1, attn_tp_rank=0))
    text = SimpleNamespace(hidden_size=8, num_hidden_layers=8, vocab_size=100)
    model = SimpleNamespace(capture_aux_hidden_states=True, model=SimpleNamespace(layers_to_capture=[2, 4, 5]))
    runner = SimpleNamespace(model=model, model_config=SimpleNamespace(hf_text_config=text))
    return SimpleNamespace(
        tp_worker=SimpleNamespace(model_runner=runner),
        draft_worker=None,
        server_args=SimpleNamespace(
            chunked_prefill_size=-1, disable_radix_cache=True, api_key=None, admin_api_key=None
        ),
    )


@pytest.mark.parametrize("held", ["another capture's data", "a bad option"])
def test_a_capture_started_by_environment_that_cannot_start_never_stops_the_server(tmp_path, monkeypatch, held):
    """Before: a server launched with EAGLE_IO_CAPTURE_DIR, killed and restarted with the same environment (as a
    supervisor does) raised 'already holds data of this writer' in the scheduler, and the server exited. Now a capture
    that cannot start is logged and shown failed in the status, and the server serves without it."""
    pytest.importorskip("sglang.srt.runtime_context")
    from eagle_io.capturing.sglang import scheduler as sc

    sched = _stand_in_scheduler(monkeypatch)
    out = tmp_path / "live"
    options = {"ring_bytes": 1 << 16}
    if held == "a bad option":
        options["drop_when_ful"] = True
    else:  # another capture's dataset: other metadata
        w = eagle_io.ShardWriter(out, eagle_io.eagle3_schema(8), {"someone": "else"})
        w.close()
    monkeypatch.setenv("EAGLE_IO_CAPTURE_DIR", str(out))
    monkeypatch.setenv("EAGLE_IO_CAPTURE_OPTIONS", json.dumps(options))
    monkeypatch.setattr(sc, "_FACTS", {"writes": True})
    monkeypatch.setattr(sc, "_ACTIVE", None)
    monkeypatch.setattr(sc, "_STARTING", None)
    monkeypatch.setattr(sc, "_ignore_terminal_interrupt", lambda: None)  # this is pytest's process, not a scheduler
    sc._start_from_env(sched)  # before: raised, and SGLang's scheduler process exited
    st = sc.status(sched)
    assert st["state"] == "failed", st
    want = (
        "capture options: unknown keyword argument 'drop_when_ful' (did you mean 'drop_when_full'?)"
        if held == "a bad option"
        else "cannot resume: metadata differs"
    )
    assert want in st["error"], st["error"]


def test_a_server_restarted_by_its_supervisor_resumes_its_own_capture(tmp_path, monkeypatch):
    """The same capture started by environment again (the server killed and restarted): it resumes what its writer
    committed, the earlier samples kept, instead of refusing the directory."""
    pytest.importorskip("sglang.srt.runtime_context")
    from eagle_io.capturing.sglang import scheduler as sc

    sched = _stand_in_scheduler(monkeypatch)
    out = tmp_path / "live"
    monkeypatch.setenv("EAGLE_IO_CAPTURE_DIR", str(out))
    monkeypatch.setenv("EAGLE_IO_CAPTURE_OPTIONS", json.dumps({"ring_bytes": 1 << 16, "max_length": 8}))
    monkeypatch.setattr(sc, "_FACTS", {"writes": True})
    # a started capture ignores SIGINT in its scheduler; here that would be pytest's worker, whose later children
    # (the interrupt tests) would inherit SIGINT ignored and wait out their timeouts
    monkeypatch.setattr(sc, "_ignore_terminal_interrupt", lambda: None)
    for run in range(2):
        monkeypatch.setattr(sc, "_ACTIVE", None)
        monkeypatch.setattr(sc, "_STARTING", None)
        sc._start_from_env(sched)
        cap = sc._ACTIVE
        assert cap is not None and sc.status(sched)["state"] == "capturing", sc.status(sched)
        x = torch.randn(3, 24)
        cap.store.put(run, [1, 2, 3], [1, 1, 1], x, x[:, :8])
        cap.stop(None, complete=False)  # the server killed: what it committed stays, marked incomplete
    ds = eagle_io.Dataset(out)
    assert sorted(ds.entry(i).sample_id for i in range(len(ds))) == [0, 1]


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"model": "x"}, "unknown keyword argument 'model'"),
        ({"shard_byte": 1 << 20}, "unknown keyword argument 'shard_byte' (did you mean 'shard_bytes'?)"),
        ({"concurency": 4}, "(did you mean 'concurrency'?)"),
    ],
)
def test_a_misspelt_capture_keyword_is_refused_on_the_client_naming_the_closest(tmp_path, kwargs, said):
    """Before: eagle_io.capture(url, model=...) reached the server, which answered with its own TypeError. Now the
    client refuses it before any request (the URL here answers nothing), naming the closest valid keyword."""
    with pytest.raises(eagle_io.errors.ArgumentTypeError, match=re.escape(said)):
        eagle_io.capture("http://127.0.0.1:9", tmp_path / "out", **kwargs)
    with pytest.raises(eagle_io.errors.ArgumentTypeError, match="capture writer options: unknown keyword argument"):
        CaptureOptions(writer_options={"shard_byte": 1})
    assert not (tmp_path / "out").exists()
