"""How `eagle-io generate` ends: a progress bar with the record total, a one-screen human summary, the capture log
in the dataset directory, and a non-zero exit naming the reason when every record was skipped."""

from __future__ import annotations

import json

import pytest
from helpers.bars import final_bar
from helpers.tiny_model import FIXTURE, build_tiny_model_dir

from eagle_io.cli import main
from eagle_io.report.capture_log import read_logs


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(build_tiny_model_dir(tmp_path_factory.mktemp("tiny")))


def argv(model_dir, dataset, out, *more):
    return ["generate", "--model", model_dir, "--dataset", str(dataset), "--out", str(out), "--threads", "1", *more]


def test_bar_total_summary_and_capture_log(model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    args = argv(model_dir, FIXTURE, out, "--limit", "12", "--max-length", "128", "--batch-size", "3")
    assert main([*args, "--summary-json", str(tmp_path / "s.json")]) == 0
    stdout, err = capsys.readouterr()
    s = json.loads((tmp_path / "s.json").read_text())
    assert "| 12/12 [" in final_bar(err, "capture")  # the total is known from --limit
    assert "records   12 to read" in stdout
    skipped = sum(s["records_skipped"].values())
    assert s["samples_written"] + skipped == 12 and s["samples_written"] > 0 and skipped > 0
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(s["records_skipped"].items(), key=lambda kv: (-kv[1], kv[0])))
    assert f"done      {s['samples_written']} samples, {s['tokens_written']:,} tokens written in" in stdout
    assert f"(ratio {s['ratio']:.3f})" in stdout
    assert f"records   12 read: {s['samples_written']} written, 0 already committed, {skipped} skipped ({reasons})" in (
        stdout
    )
    assert f"{s['tokens_per_s']:,.0f} tokens/s" in stdout and "outside the forward" in stdout
    lines, torn = read_logs(out)
    assert torn == 0 and [line["event"] for line in lines] == ["start", "end"]
    start, end = lines
    assert start["records_total"] == 12 and start["max_length"] == 128 and start["run"] == end["run"]
    assert (end["records"], end["samples"], end["tokens"]) == (12, s["samples_written"], s["tokens_written"])
    assert end["skipped"] == s["records_skipped"] and end["modified"] == s["records_modified"]
    assert end["forward_s"] == pytest.approx(s["forward_seconds"], abs=0.01) and end["forward_s"] <= end["t"]
    assert s["capture_log"] == str(out / "capture_log.jsonl")

    # A resumed run that finds everything committed writes nothing and still succeeds; it logs a second run.
    assert main([*args, "--resume"]) == 0
    stdout, _ = capsys.readouterr()
    assert f"records   12 read: 0 written, {s['samples_written']} already committed" in stdout
    lines, _ = read_logs(out)
    assert [line["event"] for line in lines] == ["start", "end", "start", "end"]
    assert lines[3]["samples"] == 0 and lines[3]["already_committed"] == s["samples_written"]


def test_every_record_skipped_exits_1_naming_the_reason_and_the_option(model_dir, tmp_path, capsys):
    rc = main([*argv(model_dir, FIXTURE, tmp_path / "a", "--limit", "6", "--max-length", "4")])
    out, err = capsys.readouterr()
    assert rc == 1
    assert "done      0 samples, 0 tokens written" in out and "6 skipped (empty_loss_mask 6)" in out
    assert err.strip().splitlines()[-1] == (
        "eagle-io generate: no sample written: all 6 records read were skipped (empty_loss_mask 6); the main reason, "
        "empty_loss_mask (6 records): no assistant token lies within --max-length 4: raise --max-length; nothing was "
        f"kept in {tmp_path / 'a'}"
    )
    assert not (tmp_path / "a").exists()  # no empty dataset that looks finished (test_bad_input_leftovers.py)

    records = [{"id": str(i), "conversations": [{"from": "human", "value": f"question {i}"}]} for i in range(3)]
    records.append({"id": "x", "conversations": "not a list"})
    src = tmp_path / "users_only.json"
    src.write_text(json.dumps(records))
    rc = main([*argv(model_dir, src, tmp_path / "b", "--skip-bad-records")])
    err = capsys.readouterr().err
    assert rc == 1 and "skipped (no_assistant_turn 3, bad_shape 1)" in err
    assert "the main reason, no_assistant_turn (3 records): the records hold no assistant turn" in err
    assert "check --dataset" in err
