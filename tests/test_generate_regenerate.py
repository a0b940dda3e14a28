"""``eagle-io generate --regenerate``: every assistant turn replaced by the target's own reply before the capture, in
the same run (tiny HF target of tests/helpers/tiny_model.py over the ShareGPT fixture slice): the stored sample's
supervised tokens are the target's greedy reply, the original and regenerated turns are recorded per sample, the
metadata says how, and a resume with other regeneration options is refused. Through SGLang's capture engine:
tests/test_sglang_generate.py."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.tiny_model import FIXTURE, build_tiny_model_dir

import eagle_io
from eagle_io.cli import main


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("regen")
    target = build_tiny_model_dir(root / "tiny")
    out = root / "ds"
    args = [
        "generate",
        "--model",
        str(target),
        "--dataset",
        str(FIXTURE),
        "--out",
        str(out),
        "--limit",
        "5",
        "--max-length",
        "96",
        "--no-disk-check",
        "--skip-bad-records",
        "--threads",
        "1",
        "--regenerate",
        "--max-new-tokens",
        "10",
    ]
    assert main(args) == 0
    return target, out, args


def test_the_capture_holds_the_targets_own_answers(regenerated):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target, out, _ = regenerated
    ds = eagle_io.Dataset(out)
    assert ds.metadata["regenerated"] == {
        "by": "tiny",
        "max_new_tokens": 10,
        "temperature": 0.0,
        "seed": 0,
        "turns_file": "regenerated_turns.jsonl",
    }
    lines = [json.loads(x) for x in (out / "regenerated_turns.jsonl").read_text().splitlines()]
    records = {r["sample_id"]: r for r in lines}
    source = json.loads(FIXTURE.read_text())
    tok = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target).eval()
    assert len(ds) >= 2
    for pos in range(len(ds)):
        sample = ds[pos]
        rec = records[sample["sample_id"]]
        assert rec["turns"], rec
        first = rec["turns"][0]
        # The original is the source's text; the regenerated one what the target says greedily.
        originals = [t["value"] for t in source[sample["sample_id"]]["conversations"] if t["from"] == "gpt"]
        assert first["original"] in originals and 1 <= first["new_tokens"] <= 10
        ids, mask = sample["input_ids"], sample["loss_mask"].bool()
        start = int(torch.nonzero(mask)[0])
        prompt = ids[:start].tolist()
        with torch.no_grad():
            greedy = model.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False)[0, len(prompt) :]
        assert tok.decode(greedy, skip_special_tokens=True) == first["regenerated"]
        span_end = start + int(mask[start:].int().cumprod(0).sum())
        assert tok.decode(ids[start:span_end], skip_special_tokens=True).strip() == first["regenerated"].strip()


def test_resume_with_other_regeneration_options_is_refused(regenerated, capsys):
    _, _, args = regenerated
    other = [a if a != "10" else "20" for a in args] + ["--resume"]
    assert main(other) == 2
    err = capsys.readouterr().err
    assert "--max-new-tokens 10 (this run: 20)" in err
    plain = [a for a in args if a not in ("--regenerate", "--max-new-tokens", "10")] + ["--resume"]
    assert main(plain) == 2 and "--regenerate (this run: without it)" in capsys.readouterr().err
