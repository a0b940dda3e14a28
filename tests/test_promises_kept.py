"""Promises the code keeps (issue 34, kind 5): a Loader state resumes only over the data it was saved over (its
fingerprint, not the sample count); a bad speculation profile is a check-serving finding, by the same check the
plugin's watchdog runs; the lossy history of a dataset survives every transcode and is shown by inspect and report.
(A NaN/Inf draft refused: test_eval_draft.py.)"""

from __future__ import annotations

import json

import pytest
import torch

import eagle_io
from conftest import make_sample
from eagle_io.errors import InvalidArgumentError
from eagle_io.feed import Loader, ShardDataset


def _write(root, scale: float):
    with eagle_io.ShardWriter(root, eagle_io.eagle3_schema(8), {}, threads=1) as w:
        for i in range(10):
            s = make_sample(i, 4 + i % 3, hidden=8)
            s["hidden_states"] = (s["hidden_states"].float() * scale).to(torch.bfloat16)
            w.write(i, s)
    return root


def test_a_loader_state_from_other_data_with_the_same_ids_and_lengths_is_refused(tmp_path):
    a, b = _write(tmp_path / "a", 1.0), _write(tmp_path / "b", 2.0)  # same ids, lengths and count; other values
    loader = Loader(ShardDataset(a), batch_size=3)
    it = iter(loader)
    next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    it.close()
    with pytest.raises(InvalidArgumentError, match="saved over other data"):
        Loader(ShardDataset(b), batch_size=3).load_state_dict(state)
    same = Loader(ShardDataset(tmp_path / "a"), batch_size=3)
    same.load_state_dict(state)
    assert [b["sample_ids"] for b in same] == [[3, 4, 5], [6, 7, 8], [9]]
    old = {k: v for k, v in state.items() if k != "dataset"}  # a state saved before states carried it
    Loader(ShardDataset(b), batch_size=3).load_state_dict(old)


@pytest.mark.parametrize(
    "profile",
    [
        '{"format": "eagle-io speculation profile", "version": 1, "num_steps": 2, "per_position_accept_rate": [0.3,',
        {
            "format": "eagle-io speculation profile",
            "version": 1,
            "num_steps": 2,
            "per_position_accept_rate": [0.2, 0.6],
        },
        {"format": "eagle-io speculation profile", "version": 1, "num_steps": "2", "per_position_accept_rate": [0.5]},
        [0.5, 0.4],
    ],
)
def test_a_bad_speculation_profile_is_a_preflight_finding_and_the_watchdog_agrees(tmp_path, profile):
    from test_serving_preflight import eagle3_draft, llama_target

    from eagle_io.serving import check_serving
    from eagle_io.serving.plugin import expected_from_profile

    t, d = llama_target(tmp_path), eagle3_draft(tmp_path, eagle_ids=[1, 3, 4])
    text = profile if isinstance(profile, str) else json.dumps(profile)
    (d / "speculation_profile.json").write_text(text)
    fs = [f for f in check_serving(t, d, algorithm="EAGLE3") if f.code == "speculation-profile"]
    assert len(fs) == 1 and fs[0].severity == "error" and "watchdog ignores it" in fs[0].message
    value, why = expected_from_profile(str(d), 2)
    assert value is None and why in fs[0].message, "one check: the plugin ignores what preflight reports"


def test_the_lossy_history_survives_every_transcode_and_is_shown(tmp_path, capsys):
    from conftest import make_sample
    from eagle_io.cli import main
    from eagle_io.report.figures import build_figures
    from eagle_io.report.html import render

    src = tmp_path / "fp8"
    with eagle_io.ShardWriter(src, eagle_io.eagle3_schema(32, precision="fp8"), {"target_model": "t"}) as w:
        for i in range(3):
            w.write(i, make_sample(i, 5))
    hops = [("bf16", tmp_path / "a"), ("fp8", tmp_path / "b"), ("bf16", tmp_path / "c")]
    previous = src
    for precision, out in hops:
        assert main(["transcode", str(previous), "--out", str(out), "--precision", precision]) == 0
        previous = out
    final = eagle_io.Dataset(tmp_path / "c")
    assert all(t.precision is None for t in final.schema), "stored lossless now"
    history = final.metadata["lossy_history"]
    assert [(h["precision"], h["transcoded_to"]) for h in history] == [
        ("float8_e4m3fn", "lossless"),
        ("float8_e4m3fn", "lossless"),
    ]
    assert history[0]["tensors"] == ["aux_hidden_states", "hidden_states"] and len(history[0]["source_sha256"]) == 64
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "c"), "--no-masks"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("lossy"))
    assert line.count("stored as float8_e4m3fn") == 2 and "then transcoded to lossless" in line
    figures = build_figures(str(tmp_path / "c"))
    assert (
        figures["lossy_history"]
        == ["stored as float8_e4m3fn (aux_hidden_states, hidden_states), then transcoded to lossless"] * 2
    )
    assert "then transcoded to lossless" in render(figures)
    assert main(["inspect", str(src), "--no-masks"]) == 0
    assert "stored as float8_e4m3fn now" in capsys.readouterr().out
