"""Files that parse but cannot be true (issue 47, kind 5): eagle-io validates the meaning of what it reads and did
not just write, naming the file, the field and why. A draft's ``speculation_profile.json`` (read by check-serving and
the serving plugin's acceptance watchdog, whose expected value went off in silence), and a vocab map (``d2t`` /
``t2d``: a float ``d2t`` was cast to integers, a file missing a tensor was a KeyError)."""

from __future__ import annotations

import json
import re

import pytest
import torch
from test_serving_preflight import eagle3_draft, llama_target

from eagle_io.cli import main
from eagle_io.draft import AcceptHistogram
from eagle_io.errors import CheckpointError, InvalidArgumentError
from eagle_io.interop.speculation_profile import PROFILE_NAME, build_profile, read_profile, write_json
from eagle_io.interop.vocab import load_vocab_mapping, mapping_from_counts
from eagle_io.serving import check_serving
from eagle_io.serving.plugin import expected_from_profile

STATS = {"format": "eagle-io/value-stats", "aux_layer_ids": [2, 4, 5], "samples": 1, "skipped": {},
         "absmax": {"aux_hidden_states": [3.0, 9.0e4, 5.0], "hidden_states": 4.0}}  # fmt: skip
HIST = AcceptHistogram(3, [4, 3, 1, 2])  # joint rates 0.6, 0.3, 0.2; accept length 2.1


def profile() -> dict:
    fig = HIST.to_dict()
    return build_profile(num_steps=3, live=fig, offline=fig, data={"samples": 10}, target={"model_id": "m"})


def with_live(**change):
    def edit(p):
        p["live"] = {**p["live"], **change}

    return edit


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda p: p.update(accept_length=0.5),
         "accept_length 0.5 is not a number in [1, num_steps + 1 = 4]: a verify step accepts its bonus token and at "
         "most num_steps drafts"),
        (lambda p: p.update(accept_length=6.0), "accept_length 6.0 is not a number in [1, num_steps + 1 = 4]"),
        (lambda p: p.update(accept_length=3.0),
         "accept_length 3.0 contradicts per_position_accept_rate [0.6, 0.3, 0.2]: it is 1 + their sum = 2.1"),
        (lambda p: p.update(per_position_conditional=[0.6, 1.3, 0.2]),
         "per_position_conditional [0.6, 1.3, 0.2] is not num_steps (3) rates in [0, 1] (or null)"),
        (lambda p: p.update(per_position_conditional=[0.6, 0.9, 0.2]),
         "per_position_conditional[1] 0.9 contradicts per_position_accept_rate[1] 0.3: the joint rate is the previous "
         "one (0.6) times the conditional one"),
        (lambda p: p.update(correct_drafts_histogram=[1, 1, 1, 7]),
         "correct_drafts_histogram [1, 1, 1, 7] contradicts per_position_accept_rate [0.6, 0.3, 0.2]: rate k is the "
         "share of steps accepting k drafts or more ([0.9, 0.8, 0.7])"),
        (lambda p: p.update(correct_drafts_histogram=[4, 3, -1, 2]),
         "correct_drafts_histogram [4, 3, -1, 2] is not num_steps + 1 (4) counts (integers >= 0)"),
        (lambda p: p.update(topk=4), "topk 4 is not 1: the figures are those of a chain draft"),
        (lambda p: p.update(num_steps=0), "num_steps 0 is not an integer >= 1 (drafts per verify step)"),
        (with_live(accept_length=-1), "live.accept_length -1 is not a number in [1, num_steps + 1 = 4]"),
        (with_live(per_position_accept_rate=[0.6, 0.3, 1.5]),
         "live.per_position_accept_rate [0.6, 0.3, 1.5] is not num_steps (3) rates in [0, 1]"),
    ],
    ids=["accept-length-below-1", "accept-length-above-steps", "accept-length-contradicts-rates",
         "conditional-outside-0-1", "conditional-contradicts-joint", "histogram-contradicts-rates",
         "negative-count", "topk", "zero-steps", "live-accept-length", "live-rate-above-1"],
)  # fmt: skip
def test_an_impossible_speculation_profile_is_refused_by_check_serving_and_the_watchdog(
    tmp_path, capsys, change, message
):
    t, d = llama_target(tmp_path), eagle3_draft(tmp_path, eagle_ids=[1, 3, 4])
    prof = profile()
    write_json(d / PROFILE_NAME, prof)
    assert read_profile(d) == prof  # the measured profile itself holds together
    change(prof)
    write_json(d / PROFILE_NAME, prof)
    # the Python API
    with pytest.raises(CheckpointError) as e:
        read_profile(d)
    assert str(e.value).startswith(f"{d / PROFILE_NAME}: ") and message in str(e.value)
    assert e.value.path == str(d / PROFILE_NAME) and "\n" not in str(e.value)
    fs = [f for f in check_serving(t, d, algorithm="EAGLE3") if f.code == "speculation-profile"]
    assert len(fs) == 1 and fs[0].severity == "error" and message in fs[0].message
    value, why = expected_from_profile(str(d), 3)
    assert value is None and message in why  # the watchdog does not take an impossible expected value
    # the command line: an error finding, exit 1 (it was "OK: no problems found", exit 0)
    assert main(["check-serving", "--target", str(t), "--draft", str(d), "--speculative-algorithm", "EAGLE3"]) == 1
    out = capsys.readouterr().out
    assert "speculation-profile" in out and message in out and "OK: no problems found" not in out


def test_a_measurement_without_a_verify_step_still_reads(tmp_path):
    # live ran no verify step (accept length null, conditional rates undefined): the offline figures stand
    empty = AcceptHistogram(3).to_dict()
    prof = build_profile(num_steps=3, live=empty, offline=HIST.to_dict(), data={}, target={})
    write_json(tmp_path / PROFILE_NAME, prof)
    assert read_profile(tmp_path)["source"] == "offline"
    assert expected_from_profile(str(tmp_path), 3)[0] == pytest.approx(2.1)


@pytest.mark.parametrize(
    "d2t, t2d, message",
    [
        (torch.tensor([0.0, 1.5, 2.0]), torch.tensor([1, 0, 1, 0, 1, 0, 0, 1], dtype=torch.bool),
         "d2t must be a 1-D integer tensor (SGLang indexes with d2t + arange), got float32 [3]"),
        (torch.tensor([0, 1, 2]), torch.tensor([1, 0, 2, 0, 1, 0, 0, 1]),
         "t2d must be a 1-D bool tensor, got int64 [8]"),
        (torch.tensor([0, 1, 9]), torch.tensor([1, 0, 1, 0, 1, 0, 0, 0], dtype=torch.bool),
         "d2t maps draft ids outside the target vocabulary [0, 8): 1 of 3, first draft id 2 -> target id 11"),
        (None, torch.tensor([1, 0, 1], dtype=torch.bool), "holds no d2t tensor"),
    ],
    ids=["float-d2t", "int-t2d", "d2t-past-the-vocab", "no-d2t"],
)  # fmt: skip
def test_a_vocab_map_that_cannot_be_true_is_refused_naming_the_file(tmp_path, capsys, d2t, t2d, message):
    path = tmp_path / "map.pt"
    torch.save({"t2d": t2d} if d2t is None else {"d2t": d2t, "t2d": t2d}, path)
    with pytest.raises(InvalidArgumentError) as e:
        load_vocab_mapping(path)
    assert str(e.value).startswith(f"{path}: ") and message in str(e.value) and "\n" not in str(e.value)


def test_a_vocab_map_that_is_not_one_reads_as_a_one_line_error(tmp_path):
    good = mapping_from_counts(torch.tensor([5, 0, 3, 0, 9, 0, 0, 1]), 3, key={})
    for name, data in (("x.pt", b"not a torch file"), ("x.safetensors", b"\x08\x00\x00\x00\x00\x00\x00\x00{}")):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(InvalidArgumentError, match=f"^{re.escape(str(tmp_path / name))}: cannot read a vocab map"):
            load_vocab_mapping(tmp_path / name)
    good.save(tmp_path / "ok.safetensors")
    assert load_vocab_mapping(tmp_path / "ok.safetensors").target_ids().tolist() == [0, 2, 4]
    with pytest.raises(InvalidArgumentError, match=r"missing\.pt: cannot read a vocab map: .*No such file"):
        load_vocab_mapping(tmp_path / "missing.pt")


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"format": "eagle-io/value-stats", "absmax": {"aux_hidden_states": [3.0, 9.0e4', "not JSON (Expecting"),
        (json.dumps({**STATS, "absmax": {"aux_hidden_states": [3.0, -9.0e4, 5.0], "hidden_states": 4.0}}),
         "absmax.aux_hidden_states [3.0, -90000.0, 5.0] is not a max |x| (a finite number >= 0) per captured layer"),
        (json.dumps({**STATS, "aux_layer_ids": [2, 4]}),
         "absmax.aux_hidden_states has 3 values for aux_layer_ids [2, 4]: one per layer"),
        (json.dumps({**STATS, "absmax": {"aux_hidden_states": [3.0, 9.0e4, 5.0], "hidden_states": "4"}}),
         "absmax.hidden_states '4' is not a max |x| (a finite number >= 0)"),
    ],
    ids=["torn", "negative-max", "another-layer-count", "a-string"],
)  # fmt: skip
def test_value_stats_that_cannot_be_true_are_refused_naming_the_file(tmp_path, capsys, text, message):
    from test_serving_preflight import one_sample_dataset

    from eagle_io.errors import CorruptRecordError
    from eagle_io.store.value_stats import range_warnings

    t16, d = llama_target(tmp_path / "fp16"), eagle3_draft(tmp_path, eagle_ids=[1, 3, 4])
    cfg = json.loads((t16 / "config.json").read_text())
    (t16 / "config.json").write_text(json.dumps({**cfg, "torch_dtype": "float16"}))
    ds = one_sample_dataset(tmp_path / "ds")
    (ds / "value_stats.json").write_text(json.dumps(STATS))
    assert len(range_warnings(ds, "float16")) == 1  # aux layer 4 beyond float16's range: the file as written
    (ds / "value_stats.json").write_text(text)
    with pytest.raises(CorruptRecordError) as e:  # the Python API
        range_warnings(ds, "float16")
    assert str(e.value).startswith(f"{ds / 'value_stats.json'}: ") and message in str(e.value)
    assert e.value.path == str(ds / "value_stats.json") and "delete it" in str(e.value)
    argv = ["check-serving", "--target", str(t16), "--draft", str(d), "--speculative-algorithm", "EAGLE3"]
    assert main([*argv, "--dataset", str(ds)]) == 2  # the command line: one line, no traceback
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"CorruptRecordError: {ds / 'value_stats.json'}: " in err and message in err


@pytest.mark.parametrize(
    "change, message",
    [
        ({"train_sample_ids": [1, -2]}, "train_sample_ids must be a list of sample ids (integers in [0, 2**64))"),
        (
            {"held_out_sample_ids": [4, 2**64]},
            "held_out_sample_ids must be a list of sample ids (integers in [0, 2**64))",
        ),
        ({"held_out_sample_ids": [3, 5, 9]}, "sample ids [3, 5] are both trained on and held out (2 in all)"),
        ({"source_dataset": 7}, "source_dataset 7 is neither a string nor null"),
    ],
    ids=["negative-id", "id-past-u64", "trained-and-held-out", "source-a-number"],
)
def test_a_training_sample_record_that_cannot_be_true_is_refused_naming_the_file(tmp_path, change, message):
    from eagle_io.interop.speculation_profile import TRAINING_SAMPLES_NAME, read_training_samples

    rec = {"train_sample_ids": [1, 3, 5], "held_out_sample_ids": [0, 2], "dataset_sha256": "ab", "source_dataset": None}
    write_json(tmp_path / TRAINING_SAMPLES_NAME, rec)
    assert read_training_samples(tmp_path) == rec
    write_json(tmp_path / TRAINING_SAMPLES_NAME, {**rec, **change})
    with pytest.raises(CheckpointError) as e:
        read_training_samples(tmp_path)
    assert str(e.value) == f"{tmp_path / TRAINING_SAMPLES_NAME}: {message}"
