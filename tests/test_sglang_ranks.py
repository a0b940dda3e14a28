"""Shard writers under SGLang's data-parallel layouts (eagle_io.sglang.ranks), against SGLang's own rank functions.

Replicas (``--dp-size``) and attention-DP groups (``--attn-dp-size``, ``--dp-size N --enable-dp-attention``) each
serve their own requests; the capture must give each exactly one writer, numbered ``0..writers-1``, and wait for
that many answers at stop. The per-process ranks below come from SGLang 0.5.23's ``derive_attention_ranks`` and
``compute_dp_attention_world_info`` (what ``DataParallelController.launch_tensor_parallel_group`` hands a scheduler as
``dp_rank``), not from a copy of their arithmetic.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from test_serving_plugin import needs_sglang

import eagle_io
from eagle_io.capturing.sglang import capture as cc
from eagle_io.capturing.sglang.protocol import capture_id, sample_proof
from eagle_io.sglang.ranks import capture_ranks, data_parallel_of, writers_of
from eagle_io.sglang.servers import ServerKeys


def scheduler_contexts(tp_size: int, dp_size: int, attn_dp_size: int) -> list[SimpleNamespace]:
    """The parallel context of every scheduler process of one launch, as SGLang publishes it."""
    from sglang.srt.layers.dp_attention import compute_dp_attention_world_info
    from sglang.srt.runtime_context import derive_attention_ranks, derive_attn_tp_size, num_dp_ranks_of

    attn_tp = derive_attn_tp_size(tp_size=tp_size, attn_cp_size=1, attn_dp_size=attn_dp_size)
    assert num_dp_ranks_of(SimpleNamespace(dp_size=dp_size, attn_dp_size=attn_dp_size)) == dp_size * attn_dp_size
    out = []
    for replica in range(dp_size):
        for tp_rank in range(tp_size):
            attn_tp_rank, attn_dp_rank = derive_attention_ranks(tp_rank=tp_rank, attn_tp_size=attn_tp, attn_cp_size=1)
            handed = compute_dp_attention_world_info(tp_rank, tp_size, attn_dp_size, 1)[2] if attn_dp_size > 1 else None
            dp_rank = handed if attn_dp_size > 1 else (replica if dp_size > 1 else None)
            out.append(
                SimpleNamespace(
                    dp_size=dp_size,
                    dp_rank=dp_rank,
                    attn_dp_size=attn_dp_size,
                    attn_dp_rank=attn_dp_rank,
                    attn_tp_rank=attn_tp_rank,
                    attn_cp_size=1,
                    tp_rank=tp_rank,
                )
            )
    return out


@needs_sglang
@pytest.mark.parametrize(
    ("tp", "dp", "attn_dp"),
    [(1, 1, 1), (2, 1, 1), (1, 2, 1), (2, 2, 1), (2, 1, 2), (8, 1, 8), (8, 1, 4), (4, 1, 2)],
    ids=["single", "tp2", "dp2", "dp2-tp2", "attn-dp2", "attn-dp8-tp8", "attn-dp4-tp8", "attn-dp2-tp4"],
)
def test_each_data_parallel_rank_gets_exactly_one_writer(tp, dp, attn_dp):
    contexts = scheduler_contexts(tp, dp, attn_dp)
    ranks = [capture_ranks(c) for c in contexts]
    writers = dp * attn_dp
    assert {r.writers for r in ranks} == {writers}
    writing = sorted(r.writer_rank for r in ranks if r.writes)
    assert writing == list(range(writers)), "every request-serving rank writes once, numbered 0..writers-1"
    # The processes of one attention-DP group (or replica) share its writer rank; only attn_tp_rank 0 writes.
    for c, r in zip(contexts, ranks, strict=True):
        assert r.writes == (c.attn_tp_rank == 0)
    assert writers_of({"tp_size": tp, "dp_size": dp, "attn_dp_size": attn_dp}) == writers


def test_the_deprecated_enable_dp_attention_spelling_counts_groups_not_replicas():
    """``--dp-size 8 --enable-dp-attention`` is 8 attention-DP groups in one replica
    (``_handle_deprecated_dp_attention``): the old rule (``dp_size`` alone) saw one writer per launch and made all 8
    schedulers write as rank 0 of 1."""
    assert writers_of({"tp_size": 8, "dp_size": 8, "enable_dp_attention": True}) == 8
    assert data_parallel_of({"tp_size": 8, "dp_size": 8, "enable_dp_attention": True}) == (1, 8)
    assert data_parallel_of({"tp_size": 8, "dp_size": 2}) == (2, 1)
    assert writers_of({"tp_size": 8, "dp_size": 1, "attn_dp_size": 8, "enable_dp_attention": True}) == 8
    assert writers_of({"tp_size": 2}) == 1
    with pytest.raises(eagle_io.InvalidArgumentError, match="attention DP inside one replica only"):
        writers_of({"dp_size": 2, "attn_dp_size": 2})
    with pytest.raises(eagle_io.InvalidArgumentError, match="attn_cp_size=2"):
        capture_ranks(SimpleNamespace(dp_size=1, attn_dp_size=1, attn_cp_size=2))


def test_a_stop_waits_for_every_writer_and_names_the_missing_one(monkeypatch):
    """A stop over HTTP with attention DP of 2 (two writing ranks in ``/server_info``): the client waits for both
    ranks' statuses under its token and returns them in rank order; a rank still stopping is named."""
    from eagle_io.capturing.sglang import client
    from eagle_io.sglang import gateway

    stopped = {0: time.monotonic(), 1: time.monotonic() + 0.4}  # when each rank reports its stop

    def http_json(url, body=None, timeout_s=30.0, **_):
        if url.endswith("/set_internal_state"):
            return {"updated": True}
        ranks = []
        for rank, at in stopped.items():
            state = "stopped" if time.monotonic() >= at else "stopping"
            ranks.append({"eagle_io_capture": {"state": state, "stop_id": capture_id("tok"), "writes": True,
                                               "counts": {"written": rank + 1}}})  # fmt: skip
        return {"internal_states": ranks}

    monkeypatch.setattr(gateway, "http_json", http_json)
    h = [gateway.Route.direct("http://h")]
    answers = client._wait_ranks(h, "tok", {"stopped"}, "stop_id", 30, "stop", keys=ServerKeys())
    assert [a["counts"]["written"] for a in answers] == [1, 2]
    stopped[1] = time.monotonic() + 60
    with pytest.raises(eagle_io.errors.CaptureStopTimeoutError, match=r"reach http://h DP rank 1 \(stopping\)"):
        client._wait_ranks(h, "tok", {"stopped"}, "stop_id", 1.0, "stop", keys=ServerKeys())


@needs_sglang
def test_an_attention_dp_capture_merges_to_each_sample_once(tmp_path, monkeypatch):
    """The scheduler side under ``--tp 4 --attn-dp-size 2``, as far as a CPU can run it (SGLang's CPU engine cannot:
    TP > 1 needs its pynccl communicator): four scheduler captures built by their real ``__init__`` over
    scheduler-shaped stand-ins, each reading its ranks from a parallel context made of SGLang's rank functions;
    requests routed to the two groups; the two writing ranks stop; the merged manifest holds every sample once."""
    import sglang.srt.runtime_context as rc
    import torch

    from eagle_io.store.merge import merge_ranks

    H, layers = 8, 8
    contexts = scheduler_contexts(tp_size=4, dp_size=1, attn_dp_size=2)
    text = SimpleNamespace(hidden_size=H, num_hidden_layers=layers, vocab_size=100)
    model = SimpleNamespace(capture_aux_hidden_states=True, model=SimpleNamespace(layers_to_capture=[2, 4, 5]))
    runner = SimpleNamespace(model=model, model_config=SimpleNamespace(hf_text_config=text))
    sched = SimpleNamespace(
        tp_worker=SimpleNamespace(model_runner=runner),
        draft_worker=None,
        server_args=SimpleNamespace(chunked_prefill_size=-1, disable_radix_cache=True, dp_size=1, attn_dp_size=2),
    )
    caps = []
    for c in contexts:
        monkeypatch.setattr(rc, "get_parallel", lambda c=c: c)
        caps.append(cc.SchedulerCapture(sched, str(tmp_path), {"target_info": {"model_id": "stand-in"}}, "secret"))
    assert [c.writes for c in caps] == [True, False, True, False]  # attn_tp_rank 0 of each group
    assert [c.writer_rank for c in caps] == [0, 0, 1, 1]
    g = torch.Generator().manual_seed(0)
    for sid in range(10):  # the DP controller routes each request to one group; all its TP ranks run it
        group = sid % 2
        n = 3 + sid % 4
        params = {
            "eagle_io_sample_id": sid,
            "eagle_io_loss_mask": [1] * n,
            "eagle_io_proof": sample_proof("secret", sid),
        }
        req = SimpleNamespace(
            rid=str(sid), prefix_len=0, extend_len=n, origin_input_ids=list(range(n)),
            sampling_params=SimpleNamespace(custom_params=params), finished=lambda: True, output_ids=[7],
            output_ids_through_stop=[7], finished_reason=None,
            _compute_max_prefix_len=lambda input_len: input_len - 1,  # the radix-match bound a Req has
        )  # fmt: skip
        batch = SimpleNamespace(forward_mode=SimpleNamespace(is_extend=lambda: True), reqs=[req], extend_lens=[n])
        out = SimpleNamespace(hidden_states=torch.randn(n, 3 * H, generator=g), last_hidden_states=torch.randn(n, H))
        for cap, ctx in zip(caps, contexts, strict=True):
            if ctx.attn_dp_rank == group:
                cap.on_request(req)  # Scheduler._create_generation_req: the request arrives
                cap.on_forward(batch, SimpleNamespace(logits_output=out))
                cap.on_result(batch)  # SGLang processed the result: the prompt-only request finished
    answers = [cap.stop("token") for cap in caps if cap.writes]
    assert [a["writer_rank"] for a in answers] == [0, 1] and all(a["error"] is None for a in answers)
    assert [a["counts"]["written"] for a in answers] == [5, 5]
    report = merge_ranks(tmp_path, expected_ids=range(10))
    assert report.complete and len(report.ranks) == 2
    assert not report.missing and not report.duplicates and not report.unexpected
    ds = eagle_io.Dataset(tmp_path)
    assert sorted(ds.entry(i).sample_id for i in range(len(ds))) == list(range(10))
    assert (ds.metadata["dp_size"], ds.metadata["attn_dp_size"]) == (1, 2)


def test_pipeline_parallelism_is_refused_before_stages_write_as_one_writer():
    """``--pp-size 2``: both stages' schedulers have attention-TP rank 0, so both wrote as writer 0 of 1, and the
    stage before the last captures nothing (its setter returns early): the launch failed, if at all, saying
    "launch SGLang in capture-only mode", which it was. Refused by name, at the client and in each scheduler."""
    stages = [SimpleNamespace(dp_size=1, attn_dp_size=1, attn_tp_rank=0, pp_size=2, pp_rank=r) for r in range(2)]
    for stage in stages:
        with pytest.raises(eagle_io.InvalidArgumentError, match="pp_size=2: under pipeline parallelism"):
            capture_ranks(stage)
    with pytest.raises(eagle_io.InvalidArgumentError, match="capture with pp_size=1"):
        writers_of({"tp_size": 1, "pp_size": 2})
    assert writers_of({"pp_size": 1, "dp_size": 2}) == 2
