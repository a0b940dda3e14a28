"""`eagle-io generate` looks at the dataset already in --out before loading the target: a capture it cannot continue
(other options, or no --resume) stops at once, naming what differs and the two ways out. The target given here does
not exist, so reaching the model loader would fail with TargetNotFoundError instead."""

from __future__ import annotations

import json

import pytest

import eagle_io
from eagle_io.cli import generate_cmd, main
from eagle_io.cli.resume_check import RESUME_HINT
from eagle_io.errors import IncompatibleDatasetError

META = {
    "target_model": {"model_id": "no-model"},
    "max_length": 2048,
    "source_dataset": "src.jsonl",
    "world_size": 1,
    "aux_layer_ids": [2, 15, 27],
}


@pytest.fixture
def captured(tmp_path):
    """A dataset in tmp_path/run whose metadata records the options of an earlier run, and the source file."""
    src = tmp_path / "src.jsonl"
    turns = [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]
    src.write_text(json.dumps({"id": "r0", "conversations": turns}) + "\n")
    meta = {**META, "eagle_io_format_writer": f"eagle-io {eagle_io.__version__}"}
    with eagle_io.ShardWriter(tmp_path / "run", eagle_io.eagle3_schema(32), meta, threads=1):
        pass
    base = ["generate", "--model", str(tmp_path / "no-model"), "--dataset", str(src), "--out", str(tmp_path / "run")]
    return tmp_path, base


def test_resume_with_another_max_length_stops_before_the_model_loads_and_says_how_out(captured, capsys):
    tmp_path, base = captured
    assert main([*base, "--resume", "--max-length", "4096", "--aux-layer-ids", "2,15,27"]) == 2
    err = capsys.readouterr().err
    assert "IncompatibleDatasetError" in err and "TargetNotFound" not in err, err
    assert f"{tmp_path / 'run' / 'manifest.json'}: cannot resume" in err
    assert "--max-length 2048 (this run: 4096)" in err and "--aux-layer-ids" not in err  # only what differs
    assert err.rstrip().endswith(f": {RESUME_HINT}") and "OUT=DIR" in RESUME_HINT


def test_every_known_difference_is_listed(captured, capsys):
    tmp_path, base = captured
    argv = [*base, "--resume", "--dataset", __file__, "--aux-layer-ids", "1,2,3", "--precision", "fp8"]
    argv += ["--model", str(tmp_path / "other-model")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    parts = (
        "--dataset src.jsonl (this run: test_generate_resume_check.py)",
        "--aux-layer-ids 2,15,27 (this run: 1,2,3)",
    )
    for part in (*parts, "--precision bf16 (this run: fp8)", "--model no-model (this run: other-model)"):
        assert part in err, err


def test_without_resume_an_existing_capture_is_refused_before_the_model_loads(captured, capsys):
    _, base = captured
    assert main(base) == 2
    err = capsys.readouterr().err
    assert "InvalidArgumentError" in err and "pass --resume to continue it" in err and "OUT=DIR" in err, err


def test_the_same_options_pass_the_check_and_reach_the_model_loader(captured, capsys):
    _, base = captured
    assert main([*base, "--resume"]) == 2
    err = capsys.readouterr().err
    assert "TargetNotFoundError" in err and "no-model does not exist" in err, err


def test_a_difference_found_after_loading_the_target_gets_the_same_hint(captured, monkeypatch, capsys):
    _, base = captured

    def loaded(*_):  # what the writer says when the loaded target's tokenizer differs from the recorded one
        raise IncompatibleDatasetError("run/manifest.json: cannot resume: metadata differs in tokenizer")

    monkeypatch.setattr(generate_cmd, "_hf_session", loaded)
    assert main([*base, "--resume"]) == 2
    err = capsys.readouterr().err
    assert (
        f"IncompatibleDatasetError: run/manifest.json: cannot resume: metadata differs in tokenizer: {RESUME_HINT}\n"
        == (err.split("generate: ", 1)[1])
    )


def test_free_form_metadata_is_compared_as_stored_not_a_traceback(tmp_path, capsys):
    src = tmp_path / "src.jsonl"
    src.write_text(json.dumps({"id": "r0", "conversations": [{"from": "human", "value": "hi"}]}) + "\n")
    with eagle_io.ShardWriter(tmp_path / "run", eagle_io.eagle3_schema(32), {"aux_layer_ids": 5}, threads=1):
        pass
    argv = ["generate", "--model", str(tmp_path / "m"), "--dataset", str(src), "--out", str(tmp_path / "run")]
    assert main([*argv, "--resume", "--aux-layer-ids", "1,2,3"]) == 2
    err = capsys.readouterr().err
    assert "IncompatibleDatasetError" in err and "--aux-layer-ids 5 (this run: 1,2,3)" in err, err
