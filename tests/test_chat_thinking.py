"""Thinking-model chat templates, on the real Qwen3 template (tests/fixtures/templates/qwen3.jinja) over SmolLM2's
BPE with Qwen3's special tokens: multi-turn conversations are rendered as the serving engine's chat path renders
them (``enable_thinking`` as a template kwarg) and kept; with thinking off, the empty think block the template puts
in the generation prompt is not supervised."""

from __future__ import annotations

import copy
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from test_chat_template_masks import MULTI_TURN, conv, masked_runs

from eagle_io.data.chat import chat_template_identity, has_thinking_switch, iter_tokenized, tokenize_conversation
from eagle_io.data.embedded import load_default_tokenizer
from eagle_io.data.stats import SkipStats

TEMPLATES = Path(__file__).parent / "fixtures" / "templates"
SPEC = json.loads((TEMPLATES / "families.json").read_text())["qwen3"]
EOT = "<|im_end|>"
EMPTY_THINK = "<think>\n\n</think>\n\n"
OFF, ON = {"enable_thinking": False}, {"enable_thinking": True}


@pytest.fixture(scope="module")
def qwen3() -> Any:
    tok = copy.deepcopy(load_default_tokenizer())
    tok.add_tokens(SPEC["special_tokens"], special_tokens=True)
    tok.add_tokens(SPEC["added_tokens"], special_tokens=False)
    tok.eos_token = SPEC["eos_token"]
    tok.chat_template = (TEMPLATES / SPEC["template"]).read_text()
    return tok


VARIANTS = {
    "two turns": MULTI_TURN,
    "system and three turns": [
        ("system", "You are terse."),
        *MULTI_TURN,
        ("user", "And in Rust?"),
        ("assistant", 'fn main() { println!("héllo"); }'),
    ],
    "replies with leading newlines": [
        ("user", "a"),
        ("assistant", "\n\nfirst"),
        ("user", "b"),
        ("assistant", "\nlast"),
    ],
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_multi_turn_with_thinking_off_is_kept_and_the_empty_think_block_is_context(qwen3, variant):
    turns = VARIANTS[variant]
    c = conv(*turns)
    sample = tokenize_conversation(c, qwen3, template_kwargs=OFF)
    # what the engine sees: the chat template's render with the same kwargs
    text = qwen3.apply_chat_template(c.messages, tokenize=False, enable_thinking=False)
    assert qwen3.decode(sample.input_ids.tolist(), skip_special_tokens=False) == text
    answers = [t for r, t in turns if r == "assistant"]
    # Qwen3 lstrips the newlines of the last reply (after the think block); earlier replies render verbatim
    want = [a + EOT for a in answers[:-1]] + [answers[-1].lstrip("\n") + EOT]
    assert masked_runs(qwen3, sample) == want
    assert text.count(EMPTY_THINK) == 1, "only the last turn carries the (empty) think block"
    unmasked = qwen3.decode(sample.input_ids[sample.loss_mask == 0].tolist(), skip_special_tokens=False)
    assert EMPTY_THINK in unmasked


def test_multi_turn_with_thinking_on_supervises_the_think_block_the_model_writes(qwen3):
    sample = tokenize_conversation(conv(*MULTI_TURN), qwen3, template_kwargs=ON)
    assert masked_runs(qwen3, sample) == [MULTI_TURN[1][1] + EOT, EMPTY_THINK + MULTI_TURN[3][1] + EOT]


def test_no_multi_turn_conversation_is_dropped(qwen3):
    convs = [conv(*turns, index=i) for i, turns in enumerate(VARIANTS.values())]
    for kwargs in (OFF, ON, None):
        stats = SkipStats()
        kept = list(iter_tokenized(convs, qwen3, stats=stats, template_kwargs=kwargs))
        assert [s.index for s in kept] == [0, 1, 2] and stats.skipped == Counter(), kwargs


def test_the_switch_is_found_and_recorded(qwen3):
    assert has_thinking_switch(qwen3) and not has_thinking_switch(load_default_tokenizer())
    ident = chat_template_identity(qwen3, OFF)
    assert ident["chat_template_kwargs"] == {"enable_thinking": False}
    assert "chat_template_kwargs" not in chat_template_identity(qwen3)


@pytest.fixture(scope="module")
def thinking_model_dir(tmp_path_factory) -> Path:
    """The reliability tests' tiny Llama directory with the Qwen3 chat template swapped in."""
    from helpers.tiny_model import build_tiny_model_dir
    from transformers import AutoTokenizer

    d = build_tiny_model_dir(tmp_path_factory.mktemp("qwen3-tiny"))
    tok = AutoTokenizer.from_pretrained(d)
    tok.chat_template = (TEMPLATES / SPEC["template"]).read_text()
    tok.save_pretrained(d)
    return d


def test_generate_asks_for_the_switch_and_records_it(thinking_model_dir, tmp_path, capsys):
    from helpers.tiny_model import FIXTURE

    from eagle_io.cli import main
    from eagle_io.store.reader import Dataset

    base = ["generate", "--model", str(thinking_model_dir), "--dataset", str(FIXTURE), "--limit", "8"]
    base += ["--max-length", "256", "--threads", "1", "--no-disk-check"]
    assert main([*base, "--out", str(tmp_path / "a")]) == 2
    assert "has a thinking switch (enable_thinking): pass --enable-thinking on|off" in capsys.readouterr().err
    assert not (tmp_path / "a" / "manifest.json").exists()
    summary = tmp_path / "s.json"
    assert main([*base, "--out", str(tmp_path / "b"), "--enable-thinking", "off", "--summary-json", str(summary)]) == 0
    meta = Dataset(tmp_path / "b").metadata
    assert meta["tokenizer"]["chat_template_kwargs"] == {"enable_thinking": False}
    skipped = json.loads(summary.read_text())["records_skipped"]
    assert "template_not_prefix_stable" not in skipped and json.loads(summary.read_text())["samples_written"] >= 5
