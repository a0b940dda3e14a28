"""`eagle-io report` on a synthetic dataset with planted faults (a NaN row, an Inf, an all-zero and an all-one mask,
an outlier channel) and a hand-written capture log: every JSON figure equals the value computed here from whole
reads; the HTML renders in headless Chromium with every plot non-empty and makes no network request."""

from __future__ import annotations

import base64
import io
import json
import math
import re

import numpy as np
import pytest
import torch
from helpers import browser

import eagle_io
from eagle_io.cli import main

H, K, IDS = 16, 3, [1, 3, 5]
LENGTHS = [12, 30, 7, 30, 21, 3]
OUTLIER = (1, 5, 40.0)  # aux layer 1 (id 3), channel 5, scaled x40 in every sample
META = {
    "target_model": {"model_id": "planted"},
    "num_layers": 8,
    "hidden_size": H,
    "vocab_size": 100,
    "aux_layer_ids": IDS,
    "aux_layer_convention": "input of 0-based decoder layer i",
    "dtype": "bfloat16",
    "tokenizer": {"tokenizer": "tok", "chat_template_sha256": "ab" * 32, "loss_mask_method": "spans"},
    "max_length": 32,
}
# Two runs, the second resumed 100 s after the first began; one torn line. Expected: intervals of 100, 120 and
# 100 tokens/s with 10%, 0% and 12.5% of the time outside the forward.
LOG = [
    {"event": "start", "run": 1000.0, "records_total": 9},
    {"event": "interval", "run": 1000.0, "t": 10.0, "records": 5, "samples": 4, "tokens": 1000, "forward_s": 9.0},
    {"event": "end", "run": 1000.0, "t": 15.0, "records": 9, "samples": 5, "tokens": 1600, "forward_s": 14.0,
     "skipped": {"empty_loss_mask": 2}, "modified": {"truncated_to_max_length": 3}},
    {"event": "start", "run": 1100.0, "records_total": 12},
    {"event": "end", "run": 1100.0, "t": 4.0, "records": 12, "samples": 1, "tokens": 400, "forward_s": 3.5,
     "skipped": {"empty_loss_mask": 2, "no_assistant_turn": 1}, "modified": {"truncated_to_max_length": 1}},
]  # fmt: skip


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    root = tmp_path_factory.mktemp("planted") / "ds"
    g = torch.Generator().manual_seed(7)
    samples = {}
    for i, n in enumerate(LENGTHS):
        aux = torch.randn(n, K * H, generator=g)
        aux[:, OUTLIER[0] * H + OUTLIER[1]] *= OUTLIER[2]
        hidden = torch.randn(n, H, generator=g) * 0.5
        mask = (torch.arange(n) % 3 != 0).to(torch.uint8)
        samples[100 + i] = {
            "input_ids": torch.randint(0, 100, (n,), generator=g),
            "loss_mask": mask,
            "aux_hidden_states": aux.to(torch.bfloat16),
            "hidden_states": hidden.to(torch.bfloat16),
        }
    samples[102]["aux_hidden_states"][4, 3] = float("nan")  # a NaN row in aux layer 0 (id 1)
    samples[104]["hidden_states"][1, 0] = float("inf")  # an Inf row in the final states
    samples[103]["loss_mask"][:] = 0  # an all-zero mask
    samples[105]["loss_mask"][:] = 1  # an all-one mask
    with eagle_io.ShardWriter(root, eagle_io.eagle3_schema(H, K), META, shard_bytes=6_000, threads=1) as w:
        for sid, s in samples.items():
            w.write(sid, s)
    lines = [json.dumps(line) for line in LOG]
    (root / "capture_log.jsonl").write_text("\n".join([*lines[:3], '{"event": "interval", "ru', *lines[3:]]) + "\n")
    return root, samples


def expected_layer(rows: list[torch.Tensor], positions: list[torch.Tensor]) -> dict:
    """The layer figures in float64 from whole reads (the report sums float32 squares: rel. error ~1e-7)."""
    x, pos = torch.cat(rows).double(), torch.cat(positions)
    finite = torch.isfinite(x).all(dim=1)
    out = {"nan": int(torch.isnan(x).sum()), "inf": int(torch.isinf(x).sum()), "nonfinite_rows": int((~finite).sum())}
    x, pos = x[finite], pos[finite]
    out["rows"] = len(x)
    out["rms"] = math.sqrt(float(x.square().mean()))
    out["max_abs"] = float(x.abs().max())
    out["rms_by_position"] = [
        math.sqrt(float(x[pos == p].square().mean())) if (pos == p).any() else None for p in range(max(LENGTHS))
    ]
    out["max_abs_by_position"] = [float(x[pos == p].abs().max()) if (pos == p).any() else None for p in range(30)]
    out["channel_rms"] = x.square().mean(dim=0).sqrt()
    return out


def test_json_figures_equal_independent_values(planted, capsys):
    root, samples = planted
    assert main(["report", str(root), "--json"]) == 0
    f = json.loads(capsys.readouterr().out)
    ordered = [samples[sid] for sid in sorted(samples)]  # ids ascend with positions here
    lengths = sorted(LENGTHS)

    assert f["summary"]["samples"] == 6 and f["summary"]["tokens"] == sum(LENGTHS)
    p = f["lengths"]["percentiles"]
    for q in (1, 10, 25, 50, 75, 90, 99):
        assert p[f"p{q}"] == lengths[math.ceil(q / 100 * 6) - 1]
    assert (p["min"], p["max"], p["mean"]) == (3, 30, pytest.approx(np.mean(LENGTHS)))
    assert sum(f["lengths"]["histogram"]["counts"]) == 6

    m = f["loss_mask"]
    sup = [int(s["loss_mask"].sum()) for s in ordered]
    assert m["supervised_tokens"] == sum(sup) and m["supervised_share"] == pytest.approx(sum(sup) / sum(LENGTHS))
    assert (m["all_zero"], m["all_one"], m["empty"], m["unreadable"]) == (1, 1, 0, [])
    assert m["mean_sample_share"] == pytest.approx(np.mean([a / n for a, n in zip(sup, LENGTHS, strict=True)]))
    assert sum(m["share_histogram"]["counts"]) == 6 and m["share_histogram"]["counts"][0] == 1

    st = f["states"]
    assert (st["samples_read"], st["all_samples"], st["tokens_read"]) == (6, True, sum(LENGTHS))
    assert [ly["name"] for ly in st["layers"]] == [
        "aux layer 1",
        "aux layer 3",
        "aux layer 5",
        "final hidden (post-norm)",
    ]
    positions = [torch.arange(n) for n in LENGTHS]
    slices = [("aux_hidden_states", i * H) for i in range(K)] + [("hidden_states", 0)]
    for ly, (tensor, start) in zip(st["layers"], slices, strict=True):
        want = expected_layer([s[tensor][:, start : start + H] for s in ordered], positions)
        assert (ly["nan"], ly["inf"], ly["nonfinite_rows"], ly["rows"]) == (
            want["nan"], want["inf"], want["nonfinite_rows"], want["rows"]
        )  # fmt: skip
        assert ly["position_bins"] == {"count": 30, "max_length": 30}
        assert ly["rms"] == pytest.approx(want["rms"], rel=1e-6) and ly["max_abs"] == want["max_abs"]
        assert ly["rms_by_position"] == pytest.approx(want["rms_by_position"], rel=1e-6)
        assert ly["max_abs_by_position"] == want["max_abs_by_position"]
        assert ly["channel_rms"] == pytest.approx(want["channel_rms"].tolist(), rel=1e-6)
        ranked = sorted(range(H), key=lambda c: -float(want["channel_rms"][c]))[:8]
        median = float(np.median(want["channel_rms"].numpy()))  # the mean of the middle two of 16
        assert [c["channel"] for c in ly["top_channels"]] == ranked
        assert [c["ratio"] for c in ly["top_channels"]] == pytest.approx(
            [float(want["channel_rms"][c]) / median for c in ranked], rel=1e-6
        )
    faults = [(ly["nan"], ly["inf"], ly["nonfinite_rows"]) for ly in st["layers"]]
    assert faults == [(1, 0, 1), (0, 0, 0), (0, 0, 0), (0, 1, 1)]  # the planted NaN and Inf rows
    outlier = st["layers"][OUTLIER[0]]["top_channels"][0]
    assert outlier["channel"] == OUTLIER[1] and outlier["ratio"] > 20  # found and standing out
    assert all(ly["top_channels"][0]["ratio"] < 3 for i, ly in enumerate(st["layers"]) if i != OUTLIER[0])

    manifest = json.loads((root / "manifest.json").read_text())
    assert len(f["shards"]) == len(manifest["shards"]) > 1
    for got, s in zip(f["shards"], manifest["shards"], strict=True):
        assert (got["bytes"], got["raw_bytes"], got["samples"]) == (s["bytes"], s["raw_bytes"], s["samples"])
        assert got["ratio"] == pytest.approx(s["raw_bytes"] / s["bytes"])

    c = f["capture"]
    assert (c["runs"], c["finished_runs"], c["torn_lines"]) == (2, 2, 1)
    got = [
        v for i in c["intervals"] for v in (i["start_s"], i["seconds"], i["tokens_per_s"], i["outside_forward_share"])
    ]
    assert got == pytest.approx([0, 10, 100, 0.1, 10, 5, 120, 0.0, 100, 4, 100, 0.125])
    assert (c["seconds"], c["tokens"]) == (19.0, 2000)
    assert c["tokens_per_s"] == pytest.approx(2000 / 19) and c["outside_forward_share"] == pytest.approx(1.5 / 19)
    assert c["skipped"] == {"empty_loss_mask": 2, "no_assistant_turn": 1}  # the last finished run's
    assert c["modified"] == {"truncated_to_max_length": 4}  # summed over runs
    assert f["metadata"] == META


def test_sampled_states_say_so_and_stay_consistent(planted, capsys):
    root, _ = planted
    assert main(["report", str(root), "--json", "--sample", "2", "--seed", "3"]) == 0
    st = json.loads(capsys.readouterr().out)["states"]
    assert (st["samples_read"], st["samples"], st["all_samples"], st["seed"]) == (2, 6, False, 3)
    assert st["tokens_read"] in {a + b for i, a in enumerate(LENGTHS) for b in LENGTHS[i + 1 :]}
    assert all(ly["rows"] + ly["nonfinite_rows"] == st["tokens_read"] for ly in st["layers"])
    assert main(["report", str(root), "--sample", "0"]) == 2


def test_html_is_self_contained_and_every_plot_renders_non_empty(planted, tmp_path, capsys):
    from PIL import Image

    root, _ = planted
    out = tmp_path / "r.html"
    assert main(["report", str(root), "--out", str(out)]) == 0
    assert f"report    {out}" in capsys.readouterr().out
    page = out.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page, re.I) and "<script" not in page
    pngs = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(pngs) == 8  # lengths, masks, 4 layers, shards, capture
    for data in pngs:
        assert browser.colored_pixels(Image.open(io.BytesIO(base64.b64decode(data)))) > 300
    assert "a sample of" not in page and "all 6 samples" in page
    assert "1 NaN and 0 Inf values in 1 rows" in page and "0 NaN and 1 Inf values in 1 rows" in page

    shown = browser.render(out, tmp_path / "chromium")
    assert shown.page_requests == []
    assert len(shown.images) == 8 and all(natural > 0 for *_, natural in shown.images)
    shot = Image.open(shown.screenshot)
    for left, top, width, height, _ in shown.images:
        assert width >= 700 and height == 300
        assert browser.colored_pixels(shot.crop((left, top, left + width, top + height))) > 300


def test_the_request_check_sees_an_external_reference(tmp_path):
    """The NetLog check above can fail: a page that references the network shows up in it."""
    page = tmp_path / "leaky.html"
    page.write_text('<html><body><img src="http://example.invalid/x.png"><p>x</p></body></html>')
    assert browser.render(page, tmp_path / "chromium").page_requests == ["http://example.invalid/x.png"]
