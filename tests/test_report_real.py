"""(slow) The report on real data: the embedded SmolLM2 over a few ShareGPT records, checked against whole reads and
rendered in headless Chromium; and the issue's all-skipped run (records 1500-1503 at --max-length 384)."""

from __future__ import annotations

import json
import math
from itertools import islice

import pytest
import torch
from helpers import browser

import eagle_io
from eagle_io.cli import main
from eagle_io.report import capture_log

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """4 records of the embedded ShareGPT through SmolLM2 at --max-length 256, one capture-log line per batch."""
    base = tmp_path_factory.mktemp("real")
    out, summary = base / "run", base / "summary.json"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(capture_log, "INTERVAL_S", 0.0)
        args = ["generate", "--out", str(out), "--limit", "4", "--max-length", "256", "--batch-size", "1"]
        assert main([*args, "--skip-bad-records", "--summary-json", str(summary)]) == 0
    return out, json.loads(summary.read_text())


def test_report_figures_match_the_real_dataset(real_run, capsys):
    out, summary = real_run
    assert main(["report", str(out), "--json"]) == 0
    f = json.loads(capsys.readouterr().out)
    ds = eagle_io.Dataset(out)
    items = [ds[p] for p in range(len(ds))]
    lengths = sorted(len(i["input_ids"]) for i in items)
    assert len(items) == summary["samples_written"] >= 3 and f["summary"]["tokens"] == summary["tokens_written"]
    assert f["lengths"]["percentiles"]["p50"] == lengths[math.ceil(len(lengths) / 2) - 1]
    assert f["lengths"]["percentiles"]["max"] == max(lengths) <= 256
    supervised = sum(int(i["loss_mask"].sum()) for i in items)
    assert f["loss_mask"]["supervised_tokens"] == supervised > 0

    layers = f["states"]["layers"]
    assert [ly["name"] for ly in layers] == ["aux layer 2", "aux layer 15", "aux layer 27", "final hidden (post-norm)"]
    x = torch.cat([i["aux_hidden_states"][:, 576 : 2 * 576] for i in items]).double()  # aux layer 15
    channel_rms = x.square().mean(dim=0).sqrt()
    mid = layers[1]
    assert (mid["rows"], mid["nan"], mid["inf"]) == (sum(lengths), 0, 0)
    assert mid["rms"] == pytest.approx(math.sqrt(float(x.square().mean())), rel=1e-6)
    assert mid["max_abs"] == float(x.abs().max())
    assert mid["top_channels"][0]["channel"] == int(channel_rms.argmax())
    assert mid["top_channels"][0]["rms"] == pytest.approx(float(channel_rms.max()), rel=1e-6)

    c = f["capture"]
    assert (c["runs"], c["finished_runs"], c["tokens"]) == (1, 1, summary["tokens_written"])
    assert len(c["intervals"]) >= len(items)  # one line per batch of 1 (interval 0 s), then the end line
    assert c["skipped"] == summary["records_skipped"] and c["modified"] == summary["records_modified"]
    assert 0 <= c["outside_forward_share"] < 1
    assert f["metadata"]["tokenizer"]["chat_template_sha256"] == ds.metadata["tokenizer"]["chat_template_sha256"]


def test_real_report_page_renders_every_plot(real_run, tmp_path):
    from PIL import Image

    out, _ = real_run
    assert main(["report", str(out)]) == 0
    page = out / "report.html"
    shown = browser.render(page, tmp_path / "chromium")
    assert shown.page_requests == [] and len(shown.images) == 8
    shot = Image.open(shown.screenshot)
    for left, top, width, height, natural in shown.images:
        assert natural > 0 and browser.colored_pixels(shot.crop((left, top, left + width, top + height))) > 300


def test_every_record_skipped_exits_1_naming_max_length(tmp_path, capsys):
    """The issue's run: records 1500-1503 of the embedded ShareGPT have no assistant token within 384 tokens of
    SmolLM2's chat template. The target is a tiny random Llama saved with SmolLM2's real tokenizer: the records are
    skipped before any forward, and it loads in seconds instead of the GGUF's half minute."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from eagle_io.data import default_dataset_path, load_default_tokenizer
    from eagle_io.data.json_stream import iter_raw_records

    with open(default_dataset_path(), "rb") as f:
        records = [r.value for r in islice(iter_raw_records(f), 1500, 1504)]
    src = tmp_path / "records_1500_1503.json"
    src.write_text(json.dumps(records))
    tok = load_default_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=8,
                      num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    argv = ["generate", "--model", str(tmp_path / "model"), "--dataset", str(src), "--out", str(tmp_path / "run")]
    rc = main([*argv, "--max-length", "384"])
    out, err = capsys.readouterr()
    assert rc == 1 and "records   4 read: 0 written, 0 already committed, 4 skipped (empty_loss_mask 4)" in out
    assert "no assistant token lies within --max-length 384: raise --max-length" in err
