"""`eagle-io verify`'s value section (:func:`eagle_io.store.value_scan.scan_dataset`): every sample decoded and its
states checked with the capture's checker. NaN/Inf fail the run; implausible states (all-zero samples or layers, rows
copied from another sample) are listed, and fail it under --strict."""

from __future__ import annotations

import json

import pytest
import torch

import eagle_io
from eagle_io.cli import main
from eagle_io.store.value_scan import scan_dataset

H = 8


def _sample(sid: int, n: int = 4) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(sid)
    return {
        "input_ids": torch.arange(100 * sid, 100 * sid + n),
        "loss_mask": torch.ones(n, dtype=torch.uint8),
        "aux_hidden_states": torch.randn(n, 3 * H, generator=g).to(torch.bfloat16),
        "hidden_states": torch.randn(n, H, generator=g).to(torch.bfloat16),
    }


def _write(root, samples: dict[int, dict]) -> None:
    meta = {"aux_layer_ids": [2, 15, 27]}
    with eagle_io.ShardWriter(root, eagle_io.eagle3_schema(H), meta, threads=1) as w:
        for sid, s in samples.items():
            w.write(sid, s)


def test_nan_written_through_the_writer_fails_verify(tmp_path, capsys):
    samples = {i: _sample(i) for i in range(5)}
    samples[4]["hidden_states"][2, 3] = float("nan")
    _write(tmp_path, samples)
    assert main(["verify", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "OK 5 samples in 1 shard(s) verified" in out, "the records themselves are sound"
    assert "VALUE FAIL nonfinite: sample 4: NaN/Inf in captured hidden_states at token row 2 (1 bad rows)" in out
    want = "values    5 samples, 20 tokens decoded and checked; samples with a problem, by kind: nonfinite 1, "
    assert want + "zero_sample 0, zero_rows 0, copied_layers 0, copied_rows 0\n" in out, out
    assert main(["verify", str(tmp_path), "--no-values"]) == 0


@pytest.mark.parametrize("kind", ["zero_sample", "zero_rows", "copied_rows"])
def test_implausible_states_are_listed_and_fail_only_under_strict(tmp_path, capsys, kind):
    samples = {i: _sample(i) for i in range(4)}
    s = samples[3]
    if kind == "zero_sample":
        s["aux_hidden_states"].zero_()
        s["hidden_states"].zero_()
    elif kind == "zero_rows":
        s["aux_hidden_states"][1, H : 2 * H] = 0  # aux layer 15 of row 1
    else:
        s["aux_hidden_states"][2:] = samples[1]["aux_hidden_states"][:2]
    _write(tmp_path, samples)
    assert main(["verify", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.startswith("VALUE WARN")]
    assert line.startswith(f"VALUE WARN {kind}: sample 3: ")
    if kind == "zero_rows":
        assert "all-zero aux layer 15 states at token row 1" in line
    if kind == "copied_rows":
        assert "at token row 2 equal bit for bit those of sample 1 at row 0" in line
    assert main(["verify", str(tmp_path), "--strict"]) == 1
    assert f"VALUE FAIL {kind}: sample 3" in capsys.readouterr().out


def test_the_scan_is_plain_data_with_per_layer_max_and_no_false_copies(tmp_path):
    samples = {i: _sample(i) for i in range(6)}
    # samples 2 and 3 share their first two tokens, and so their first two rows of states: not a copy
    samples[3]["input_ids"][:2] = samples[2]["input_ids"][:2]
    for t in ("aux_hidden_states", "hidden_states"):
        samples[3][t][:2] = samples[2][t][:2]
    samples[5]["aux_hidden_states"][0, 2 * H + 1] = -40.0  # the largest |x| of aux layer 27
    _write(tmp_path, samples)
    r = scan_dataset(tmp_path, window=2)
    assert json.loads(json.dumps(r)) == r
    assert r["checked"] and r["samples"] == 6 and r["tokens"] == 24 and r["problems"] == []
    assert r["absmax"]["blocks"] == ["aux layer 2", "aux layer 15", "aux layer 27", "hidden_states"]
    assert r["absmax"]["values"][2] == 40.0
    want = max(float(s["hidden_states"].float().abs().max()) for s in samples.values())
    assert r["absmax"]["values"][3] == want


def test_copies_are_found_across_window_blocks(tmp_path):
    samples = {i: _sample(i) for i in range(5)}
    samples[3]["hidden_states"][1] = samples[1]["hidden_states"][3]  # window 2: blocks [0, 1], [2, 3], [4]
    _write(tmp_path, samples)
    r = scan_dataset(tmp_path, window=2)
    (p,) = r["problems"]
    assert (p["kind"], p["sample_id"], p["row"], p["source_sample_id"], p["source_row"]) == ("copied_rows", 3, 1, 1, 3)
    assert r["counts"] == {"nonfinite": 0, "zero_sample": 0, "zero_rows": 0, "copied_layers": 0, "copied_rows": 1}


def test_a_layer_stored_twice_is_listed_by_verify_and_counted_in_the_report(tmp_path, capsys):
    """Sample 2's aux layer 15 block holds aux layer 27's, on rows 0 and 3 only: verify lists it (copied_layers,
    failing under --strict), and the report's figures count it among the samples read (it was found by neither)."""
    from eagle_io.report.figures import build_figures

    samples = {i: _sample(i, 6) for i in range(4)}
    aux = samples[2]["aux_hidden_states"]
    aux[[0, 3], H : 2 * H] = aux[[0, 3], 2 * H :]
    _write(tmp_path, samples)
    assert main(["verify", str(tmp_path)]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("VALUE WARN")]
    assert line.startswith("VALUE WARN copied_layers: sample 2: aux layer 15 and aux layer 27 states are equal bit")
    assert "at token row 0 (2 of 6 rows have two equal layers)" in line
    assert main(["verify", str(tmp_path), "--strict"]) == 1
    values = build_figures(tmp_path, sample=4)["states"]["values"]
    assert values["checked"] and values["samples"] == 4
    assert values["counts"] == {"nonfinite": 0, "zero_sample": 0, "zero_rows": 0, "copied_layers": 1, "copied_rows": 0}
    assert [(p["kind"], p["sample_id"]) for p in values["problems"]] == [("copied_layers", 2)]
