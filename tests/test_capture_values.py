"""States that cannot be real are caught at capture, on the HF path and on the SGLang path alike (one capture core,
:mod:`eagle_io.store.values`): NaN/Inf, a value the float16 storage cast turns into Inf, a sample all zeros, a layer
all zeros in a row, rows copied from another request; raise (default) or skip and count. Per-layer max |x| goes to
``value_stats.json``."""

from __future__ import annotations

import json
import warnings
from types import SimpleNamespace

import pytest
import torch
from test_capture_session import samples, stored, tiny_target

import eagle_io
from eagle_io.capturing.sglang import capture as cc
from eagle_io.capturing.sglang.protocol import sample_proof
from eagle_io.capturing.store import ForwardSample, SampleStore
from eagle_io.store import value_stats, values


class _Sink:
    """TEST-ONLY stand-in for the capture ring: records what is put."""

    def __init__(self) -> None:
        self.put_ids: list[int] = []
        self.tensors: dict[int, dict] = {}

    def put(self, sample_id, tensors, key="", shared_prefix=0, stored_prefix=None):
        self.put_ids.append(sample_id)
        self.tensors[sample_id] = tensors
        return True

    def close(self):
        return {}

    def stats(self):
        return {}


def _store(**kw) -> tuple[SampleStore, _Sink]:
    sink = _Sink()
    opts = {"state_dtype": torch.bfloat16, "max_length": None, "vocab_size": None, "aux_layer_ids": [2, 15, 27]}
    return SampleStore(sink, **{**opts, **kw}), sink


def _forward(n_samples: int = 2, length: int = 4, hidden: int = 8, seed: int = 0):
    """Random states of a forward of ``n_samples`` requests of ``length`` tokens, SGLang's layout ([T, 3H], [T, H])
    and the samples (distinct token ids)."""
    g = torch.Generator().manual_seed(seed)
    t = n_samples * length
    aux, final = torch.randn(t, 3 * hidden, generator=g), torch.randn(t, hidden, generator=g)
    rows = [ForwardSample(i, list(range(10 * i, 10 * i + length)), [1] * length, i * length, length) for i in range(2)]
    return aux, final, rows[:n_samples]


def _rows(rows: list[ForwardSample]) -> list[values.SampleRows]:
    return [values.SampleRows(r.sample_id, r.input_ids, r.start, r.length) for r in rows]


# --- the checker on tensors as small as the examples -----------------------------------------------------


def test_each_kind_is_found_naming_sample_layer_and_row():
    aux, final, rows = _forward()
    aux[5, 8:16] = 0  # sample 1, row 1: aux layer 15 all zeros
    final[2] = float("nan")  # sample 0, row 2
    stats = values.row_stats(aux, final)
    names = values.block_names(3, [2, 15, 27])
    found = values.find_problems(stats, _rows(rows), names=names)
    assert [[p["kind"] for p in f] for f in found] == [["nonfinite"], ["zero_rows"]]
    (nf,), (zr,) = found
    assert (nf["sample_id"], nf["row"], nf["tensor"], nf["where"]) == (0, 2, "hidden_states", "hidden_states")
    assert (zr["sample_id"], zr["row"], zr["where"], zr["rows"]) == (1, 1, "aux layer 15", 1)
    assert "sample 1: all-zero aux layer 15 states at token row 1" in zr["message"]


def test_a_zero_sample_and_copied_rows_and_what_is_not_a_copy():
    aux, final, rows = _forward(2, 4)
    aux[4:], final[4:] = 0, 0
    st = values.row_stats(aux, final)
    found = values.find_problems(st, _rows(rows))
    assert [p["kind"] for p in found[1]] == ["zero_sample"] and found[0] == []
    # request 1's rows are request 0's rows, shifted by one (per-request offsets off by one)
    aux, final, rows = _forward(2, 4)
    aux[5:8], final[5:8] = aux[0:3], final[0:3]
    st = values.row_stats(aux, final)
    (f0, f1) = values.find_problems(st, _rows(rows))
    assert f0 == [] and [p["kind"] for p in f1] == ["copied_rows"]
    assert (f1[0]["row"], f1[0]["source_sample_id"], f1[0]["source_row"]) == (1, 0, 0)
    # the same rows at the same positions after the same tokens: a shared prefix, not a copy
    same = [values.SampleRows(0, [5, 6, 7, 8], 0, 4), values.SampleRows(1, [5, 6, 9, 9], 4, 4)]
    aux, final, _ = _forward(2, 4)
    aux[4:6], final[4:6] = aux[0:2], final[0:2]
    assert values.find_problems(values.row_stats(aux, final), same) == [[], []]
    # ... but one row further the prefixes differ
    aux[6], final[6] = aux[2], final[2]
    found = values.find_problems(values.row_stats(aux, final), same)
    assert [p["kind"] for p in found[1]] == ["copied_rows"] and found[1][0]["row"] == 2


def test_overflow_limit_is_where_the_cast_makes_inf():
    for dtype in (torch.float16, torch.bfloat16):  # from float32 forwards
        lim = torch.tensor(values.overflow_limit(dtype), dtype=torch.float32)
        assert float(lim) == values.overflow_limit(dtype) and torch.isinf(lim.to(dtype))
        assert torch.isfinite(torch.nextafter(lim, torch.tensor(0.0)).to(dtype))
    assert values.overflow_limit(torch.float16) == 65520.0


# --- the capture core (the SGLang scheduler's path: SampleStore.put_forward) -------------------------------------


@pytest.mark.parametrize("policy", ["raise", "skip"])
@pytest.mark.parametrize("kind", ["zero_sample", "zero_rows", "copied_rows"])
def test_the_capture_core_raises_or_skips_and_counts_implausible_states(kind, policy):
    store, sink = _store(implausible=policy)
    aux, final, rows = _forward(2, 4)
    if kind == "zero_sample":
        aux[4:], final[4:] = 0, 0
    elif kind == "zero_rows":
        final[6] = 0
    else:
        aux[4:8] = aux[0:4]
    if policy == "raise":
        with pytest.raises(eagle_io.ImplausibleStatesError, match=r"^sample 1: .*nothing of this sample was written"):
            store.put_forward(aux, final, rows)
    else:
        assert store.put_forward(aux, final, rows) == [True, False]
        assert store.counts[f"{kind}_skipped"] == 1
    assert sink.put_ids == [0], "the good sample is written, never the bad one"


def test_nonfinite_names_the_layer_and_the_float16_cast():
    with pytest.warns(UserWarning, match="bfloat16 is recommended"):
        store, sink = _store(state_dtype=torch.float16)
    aux, final, rows = _forward(2, 4)
    aux[6, 9] = 7.1e4  # finite in float32, Inf once cast to float16 for storage
    with pytest.raises(eagle_io.NonFiniteStatesError, match="float16 cast") as e:
        store.put_forward(aux, final, rows)
    err = e.value
    assert (err.sample_id, err.row, err.tensor) == (1, 2, "aux_hidden_states")
    assert (err.layer, err.overflow) == ("aux layer 15", True)
    assert "aux_hidden_states (aux layer 15) at token row 2" in str(err)
    assert sink.put_ids == [0]
    # 65504 is float16's largest value: stored, not refused
    store, sink = _store(state_dtype=torch.float16)
    aux, final, rows = _forward(1, 4)
    aux[1, 0] = 65504.0
    assert store.put_forward(aux, final, rows) == [True]


def test_a_float16_forward_warns_and_its_overflow_is_named():
    store, _ = _store()
    aux, final, rows = _forward(1, 4)
    aux, final = aux.half(), final.half()
    aux[3, 20] = float("inf")
    with (
        pytest.warns(UserWarning, match="float16 target forward"),
        pytest.raises(eagle_io.NonFiniteStatesError, match=r"aux layer 27\) at token row 3.*fp16 overflow"),
    ):
        store.put_forward(aux, final, rows)


def test_a_forward_costs_one_value_check(monkeypatch):
    calls = []
    real = values.row_stats
    monkeypatch.setattr(values, "row_stats", lambda *a: calls.append(1) or real(*a))
    store, sink = _store()
    aux, final, rows = _forward(2, 4)
    store.put_forward(aux, final, rows)
    assert len(calls) == 1 and sink.put_ids == [0, 1]


def _scheduler_capture(store):
    """A writing ``_SchedulerCapture`` over ``store`` (the fields ``__init__`` would set; no scheduler)."""

    cap = object.__new__(cc.SchedulerCapture)
    cap.writes, cap.store, cap.max_length, cap.vocab_size = True, store, 8, 100
    cap.requests, cap.request_counts, cap.refusal, cap.token = (
        cc.RequestStates(),
        dict.fromkeys(cc.REQUEST_COUNTS, 0),
        None,
        "secret",
    )
    cap.live, cap.admission, cap.admitted, cap.ready, cap.error = None, cc.Admission(None, 8), {}, None, None
    cap.prefixes, cap.prefix_counts = None, dict.fromkeys(cc.PREFIX_COUNTS, 0)
    cap.handoff = cc.Handoff(store, slots=4, drop_when_full=False, stored=cap._stored, fail=cap.fail)
    return cap


def _serve(cap, batch, aux, final):
    """The scheduler's hooks around one prefill forward: each request arrives, the forward, its result; then the
    hand-off thread puts what finished."""
    for r in batch.reqs:
        cap.on_request(r)
    cap.on_forward(batch, SimpleNamespace(logits_output=SimpleNamespace(hidden_states=aux, last_hidden_states=final)))
    cap.on_result(batch)
    cap.handoff.wait_idle()


def _prompt_request(sid, ids, n):
    """A prompt-only request (``max_new_tokens`` 1) of ``n`` prompt tokens, finished after its prefill."""
    params = {"eagle_io_sample_id": sid, "eagle_io_loss_mask": [1] * n, "eagle_io_proof": sample_proof("secret", sid)}
    return SimpleNamespace(rid=str(sid), prefix_len=0, extend_len=n, origin_input_ids=ids,
                           sampling_params=SimpleNamespace(custom_params=params), finished=lambda: True,
                           output_ids=[1], output_ids_through_stop=[1], finished_reason=None)  # fmt: skip


def test_sglang_scheduler_forward_with_copied_request_rows():
    """The scheduler's hook hands a whole prefill forward to the capture core: a request whose rows are another
    request's is caught there too (skip policy: counted, the other request written)."""

    store, sink = _store(implausible="skip")
    cap = _scheduler_capture(store)
    mode = SimpleNamespace(is_extend=lambda: True)
    aux, final, _ = _forward(2, 3)
    aux[3:6], final[3:6] = aux[0:3], final[0:3]  # request 8 got request 7's rows
    reqs = [_prompt_request(7, [1, 2, 3], 3), _prompt_request(8, [4, 5, 6], 3)]
    batch = SimpleNamespace(forward_mode=mode, reqs=reqs, extend_lens=[3, 3])
    _serve(cap, batch, aux, final)  # both finished in the same forward: checked together
    assert sink.put_ids == [7] and store.counts["copied_rows_skipped"] == 1


def test_a_layer_captured_twice_is_caught_on_both_backends(tmp_path):
    """One layer's block written into another's slot, from row 1 on (aux layer 27 = aux layer 2): the SGLang
    scheduler's forward and the HF hooks both reach the capture core, which raises (or skips and counts); real states
    of two layers are never equal, and equal blocks in rows of two different samples are not this kind."""

    aux, final, rows = _forward(2, 4)
    aux[5:8, 16:24] = aux[5:8, 0:8]  # sample 1, rows 1..3
    found = values.find_problems(values.row_stats(aux, final), _rows(rows), names=values.block_names(3, [2, 15, 27]))
    assert found[0] == [] and [p["kind"] for p in found[1]] == ["copied_layers"]
    (c,) = found[1]
    assert (c["row"], c["rows"], c["layers"]) == (1, 3, ["aux layer 2", "aux layer 27"])
    assert "sample 1: aux layer 2 and aux layer 27 states are equal bit for bit at token row 1" in c["message"]
    store, sink = _store(implausible="skip")
    cap = _scheduler_capture(store)
    reqs = [_prompt_request(r.sample_id, r.input_ids, r.length) for r in rows]
    batch = SimpleNamespace(forward_mode=SimpleNamespace(is_extend=lambda: True), reqs=reqs, extend_lens=[4, 4])
    _serve(cap, batch, aux, final)
    assert sink.put_ids == [0] and store.counts["copied_layers_skipped"] == 1
    # HF: a hook makes layer 4's output (eagle-io id 5) layer 1's (id 2) for sample 1.
    model, info = tiny_target()
    kept = {}

    def keep(module, args, output):
        kept["x"] = (output[0] if isinstance(output, tuple) else output).clone()

    def twice(module, args, output):
        (output[0] if isinstance(output, tuple) else output)[1] = kept["x"][1]

    model.model.layers[1].register_forward_hook(keep)
    model.model.layers[4].register_forward_hook(twice)
    session = eagle_io.capture(model, tmp_path / "hf", target_info=info, threads=1)
    with session, pytest.raises(eagle_io.ImplausibleStatesError, match=r"^sample 1: aux layer 2 and aux layer 5 ") as e:
        session.submit(samples([6, 6]))
    assert e.value.kind == "copied_layers"


# --- the HF path, end to end ------------------------------------------------------------------------------------


def _layer_output_hook(rows):
    def hook(module, args, output):
        out = output[0] if isinstance(output, tuple) else output
        out[rows] = 0

    return hook


@pytest.mark.parametrize("kind", ["zero_rows", "zero_sample", "copied_rows"])
def test_hf_capture_catches_implausible_states(tmp_path, kind):
    model, info = tiny_target()  # 8 layers: aux layers [2, 4, 5] = outputs of layers 1, 3, 4
    batch = samples([6, 6, 6])
    if kind == "zero_rows":
        model.model.layers[3].register_forward_hook(_layer_output_hook((1, slice(2, 4))))
    elif kind == "zero_sample":
        for i in (1, 3, 4):
            model.model.layers[i].register_forward_hook(_layer_output_hook((1, slice(None))))
        model.model.norm.register_forward_hook(_layer_output_hook((1, slice(None))))
    else:

        def copy(module, args, output):  # sample 1's final states are sample 0's, one row later
            output[1, 1:] = output[0, :-1].clone()

        model.model.norm.register_forward_hook(copy)
    cap = eagle_io.capture(model, tmp_path / "r", target_info=info, threads=1)
    with cap, pytest.raises(eagle_io.ImplausibleStatesError, match=r"^sample 1: ") as e:
        cap.submit(batch)
    assert e.value.kind == kind
    if kind == "zero_rows":
        assert (e.value.row, e.value.tensor) == (2, "aux_hidden_states") and "aux layer 4" in str(e.value)
    with eagle_io.capture(model, tmp_path / "s", target_info=info, threads=1, implausible="skip") as cap:
        cap.submit(batch)
        assert cap.counts[f"{kind}_skipped"] == 1 and cap.counts["written"] == 2
    assert sorted(stored(tmp_path / "s")) == [0, 2]


def test_hf_capture_keeps_shared_prefixes_and_duplicates_and_records_max_abs(tmp_path):
    model, info = tiny_target()
    batch = samples([6, 6, 6, 6])
    batch[1].input_ids = batch[0].input_ids.clone()  # a duplicate record
    batch[2].input_ids[:3] = batch[0].input_ids[:3]  # a shared prefix
    with eagle_io.capture(model, tmp_path, target_info=info, threads=1) as cap:
        cap.submit(batch)
    got = stored(tmp_path)
    assert sorted(got) == [0, 1, 2, 3]
    assert torch.equal(got[0]["aux_hidden_states"], got[1]["aux_hidden_states"]), "equal rows were stored"
    st = json.loads((tmp_path / "value_stats.json").read_text())
    assert st["aux_layer_ids"] == [2, 4, 5] and st["samples"] == 4 and st["source_dtype"] == "float32"
    aux = torch.cat([g["aux_hidden_states"].float() for g in got.values()]).view(-1, 3, 64).abs().amax((0, 2))
    fin = torch.cat([g["hidden_states"].float() for g in got.values()]).abs().max()
    # recorded before the bf16 rounding: within half a bf16 ulp of the stored maxima
    recorded = [*st["absmax"]["aux_hidden_states"], st["absmax"]["hidden_states"]]
    for want, have in zip([*aux.tolist(), float(fin)], recorded, strict=True):
        assert abs(want - have) <= want * 2**-8
    assert value_stats.read_value_stats(tmp_path) == [st]


def test_value_stats_merge_over_a_resume_and_feed_the_fp16_range_warning(tmp_path):
    model, info = tiny_target()
    batch = samples([5, 5, 5, 5])
    with eagle_io.capture(model, tmp_path, target_info=info, threads=1) as cap:
        cap.submit(batch[:2])
    first = json.loads((tmp_path / "value_stats.json").read_text())
    with eagle_io.capture(model, tmp_path, target_info=info, threads=1, resume=True) as cap:
        cap.submit(batch)
    both = json.loads((tmp_path / "value_stats.json").read_text())
    assert both["samples"] == 4 and first["samples"] == 2
    pairs = zip(first["absmax"]["aux_hidden_states"], both["absmax"]["aux_hidden_states"], strict=True)
    assert all(b >= a for a, b in pairs)
    assert value_stats.range_warnings(tmp_path, "float16") == []
    assert value_stats.range_warnings(tmp_path, "bfloat16") == []
    both["absmax"]["aux_hidden_states"][1] = 9.0e4
    (tmp_path / "value_stats.json").write_text(json.dumps(both))
    (w,) = value_stats.range_warnings(tmp_path, "float16")
    assert "aux layer 4 reach |x| = 9e+04, beyond float16's 65504" in w
    assert value_stats.range_warnings(tmp_path, torch.bfloat16) == []


def test_capture_in_float16_warns_and_names_the_cast_that_overflows(tmp_path):
    model, info = tiny_target()

    def big(module, args, output):  # the input of aux layer 4, sample 1, row 2: beyond float16
        (output[0] if isinstance(output, tuple) else output)[1, 2, 0] = 7.0e4

    model.model.layers[3].register_forward_hook(big)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        cap = eagle_io.capture(model, tmp_path, target_info=info, threads=1, state_dtype=torch.float16)
        with cap, pytest.raises(eagle_io.NonFiniteStatesError, match="cast from float32 to float16") as e:
            cap.submit(samples([4, 4]))
    assert any("bfloat16 is recommended" in str(w.message) for w in seen)
    assert (e.value.sample_id, e.value.row, e.value.layer) == (1, 2, "aux layer 4")
    assert sorted(stored(tmp_path)) == [0]
