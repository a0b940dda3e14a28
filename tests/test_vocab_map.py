"""Draft vocabulary mapping: counts over loss-masked tokens only, SpecForge's d2t/t2d convention (compared with its
own ``process_token_dict_to_mappings`` when SpecForge is installed), deterministic ties and padding, and keys that
refuse a mapping built for another dataset or vocabulary size."""

from __future__ import annotations

import ast
import importlib.metadata
from collections import Counter
from pathlib import Path

import pytest
import torch

import eagle_io
from eagle_io.cli import main, vocab_cmd
from eagle_io.interop.vocab import (
    VocabMappingMismatchError,
    build_vocab_mapping,
    count_loss_masked_tokens,
    dataset_fingerprint,
    load_vocab_mapping,
    mapping_from_counts,
    validate_mapping,
)

VOCAB = 64


def write_tokens(root: Path, seqs: list[tuple[list[int], list[int]]], vocab: int = VOCAB) -> Path:
    """A dataset whose samples have the given (input_ids, loss_mask); states are zeros (hidden 8)."""
    with eagle_io.ShardWriter(root, eagle_io.eagle3_schema(8), {"vocab_size": vocab}, threads=1) as w:
        for i, (ids, mask) in enumerate(seqs):
            n = len(ids)
            w.write(
                i,
                {
                    "input_ids": torch.tensor(ids, dtype=torch.int64),
                    "loss_mask": torch.tensor(mask, dtype=torch.uint8),
                    "aux_hidden_states": torch.zeros(n, 24, dtype=torch.bfloat16),
                    "hidden_states": torch.zeros(n, 8, dtype=torch.bfloat16),
                },
            )
    return root


def specforge_mapping_fn():
    """SpecForge's real ``process_token_dict_to_mappings`` (``specforge/data/preprocessing.py``), compiled alone
    from the installed file (its module imports ``datasets`` and distributed helpers), or skip."""
    try:
        dist = importlib.metadata.distribution("specforge")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("SpecForge not installed (pip install --no-deps specforge==0.2.0)")
    path = Path(str(dist.locate_file("specforge/data/preprocessing.py")))
    tree = ast.parse(path.read_text())
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "process_token_dict_to_mappings"]
    ns = {"Counter": Counter, "torch": torch, "Tuple": tuple}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), ns)
    return ns["process_token_dict_to_mappings"]


@pytest.fixture
def corpus(tmp_path):
    # Masked counts: 5 -> 4, 9 -> 3, 2 -> 2, 40 -> 1. Token 7 appears 6 times but never masked.
    seqs = [
        ([7, 5, 5, 9, 7], [0, 1, 1, 1, 0]),
        ([7, 7, 5, 2, 40], [0, 0, 1, 1, 1]),
        ([5, 9, 9, 2, 7, 7], [1, 1, 1, 1, 0, 0]),
        ([], []),
    ]
    return write_tokens(tmp_path / "ds", seqs)


def test_counts_only_loss_masked_tokens(corpus):
    counts, n = count_loss_masked_tokens(corpus, VOCAB)
    assert n == 4 and counts.dtype == torch.int64 and counts.shape == (VOCAB,)
    assert {i: int(c) for i, c in enumerate(counts) if c} == {5: 4, 9: 3, 2: 2, 40: 1}


def test_mapping_invariants_and_ranking(corpus):
    m = build_vocab_mapping(corpus, 3)
    assert m.t2d.dtype == torch.bool and m.d2t.dtype == torch.int64
    assert int(m.t2d.sum()) == len(m.d2t) == m.draft_vocab_size == 3
    assert m.target_ids().tolist() == [2, 5, 9]  # top 3 by count, sorted by id
    assert m.d2t.tolist() == [2 - 0, 5 - 1, 9 - 2]
    assert m.t2d.nonzero().flatten().tolist() == [2, 5, 9]
    assert m.key["padded"] == 0 and m.key["distinct_tokens"] == 4 and m.key["counted_tokens"] == 10
    assert m.key["coverage"] == pytest.approx(9 / 10)
    assert m.key["target_vocab_size"] == VOCAB and m.key["draft_vocab_size"] == 3
    assert m.key["dataset_sha256"] == dataset_fingerprint(corpus)


def test_ties_break_to_the_lower_token_id():
    counts = torch.zeros(VOCAB, dtype=torch.int64)
    counts[[30, 10, 20, 50]] = torch.tensor([2, 2, 2, 5])
    assert mapping_from_counts(counts, 2).target_ids().tolist() == [10, 50]
    assert mapping_from_counts(counts, 3).target_ids().tolist() == [10, 20, 50]


def test_padding_adds_the_lowest_unused_ids(corpus):
    m = build_vocab_mapping(corpus, 8)
    assert m.key["padded"] == 4 and m.key["distinct_tokens"] == 4
    # counted {2, 5, 9, 40} plus the 4 lowest unused ids {0, 1, 3, 4}
    assert m.target_ids().tolist() == [0, 1, 2, 3, 4, 5, 9, 40]
    assert int(m.t2d.sum()) == len(m.d2t) == 8
    full = build_vocab_mapping(corpus, VOCAB)  # every id: the identity mapping
    assert bool(full.t2d.all()) and full.d2t.tolist() == [0] * VOCAB and full.key["padded"] == VOCAB - 4


def test_empty_corpus_pads_everything(tmp_path):
    root = write_tokens(tmp_path / "e", [([1, 2, 3], [0, 0, 0])])
    m = build_vocab_mapping(root, 5)
    assert m.target_ids().tolist() == [0, 1, 2, 3, 4] and m.key["padded"] == 5 and m.key["coverage"] == 0.0


@pytest.mark.parametrize("draft", [3, 4, 8])
def test_same_mapping_as_specforge(corpus, draft, capsys):
    """No ties at the cut-off here, so SpecForge's first-seen tie order cannot differ."""
    sf = specforge_mapping_fn()
    counts, _ = count_loss_masked_tokens(corpus, VOCAB)
    token_dict = Counter({i: int(c) for i, c in enumerate(counts) if c})
    d2t, t2d = sf(token_dict, draft, VOCAB)
    m = build_vocab_mapping(corpus, draft)
    assert torch.equal(m.d2t, d2t) and torch.equal(m.t2d, t2d)


def test_bad_sizes_and_ids_are_refused(corpus, tmp_path):
    with pytest.raises(eagle_io.InvalidArgumentError, match=r"draft_vocab_size 65 must be in \[1, "):
        build_vocab_mapping(corpus, VOCAB + 1)
    with pytest.raises(eagle_io.InvalidArgumentError, match="disagrees with the datasets' metadata vocab_size"):
        build_vocab_mapping(corpus, 3, target_vocab_size=100)
    root = write_tokens(tmp_path / "big", [([1, 70], [1, 1])])
    with pytest.raises(eagle_io.InvalidArgumentError, match=r"sample 0 has token id 70 outside"):
        build_vocab_mapping(root, 3)


def test_validate_mapping_names_the_broken_invariant():
    m = mapping_from_counts(torch.arange(VOCAB), 4)
    validate_mapping(m.d2t, m.t2d, 4, VOCAB)
    t2d = m.t2d.clone()
    t2d[0] = True
    with pytest.raises(ValueError, match=r"t2d.sum\(\) = 5, len\(d2t\) = 4, draft_vocab_size = 4"):
        validate_mapping(m.d2t, t2d, 4, VOCAB)
    with pytest.raises(ValueError, match="draft_vocab_size = 5"):
        validate_mapping(m.d2t, m.t2d, 5, VOCAB)
    with pytest.raises(ValueError, match="t2d has 64 entries, target_vocab_size is 65"):
        validate_mapping(m.d2t, m.t2d, 4, VOCAB + 1)
    with pytest.raises(ValueError, match="int64"):
        validate_mapping(m.d2t.int(), m.t2d, 4, VOCAB)


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_saved_mapping_is_keyed(corpus, tmp_path, suffix):
    m = build_vocab_mapping(corpus, 3)
    path = tmp_path / f"map{suffix}"
    m.save(path)
    back = load_vocab_mapping(path, dataset=corpus, target_vocab_size=VOCAB, draft_vocab_size=3)
    assert torch.equal(back.d2t, m.d2t) and torch.equal(back.t2d, m.t2d) and back.key == m.key
    with pytest.raises(VocabMappingMismatchError, match="draft_vocab_size: mapping has 3, expected 4") as e:
        load_vocab_mapping(path, draft_vocab_size=4)
    assert str(path) in str(e.value)
    with pytest.raises(VocabMappingMismatchError, match="target_vocab_size: mapping has 64, expected 49152"):
        load_vocab_mapping(path, target_vocab_size=49152)
    other = write_tokens(tmp_path / "other", [([5, 9], [1, 1])])
    with pytest.raises(VocabMappingMismatchError, match=r"dataset_sha256: mapping has '[0-9a-f]{64}', expected"):
        load_vocab_mapping(path, dataset=other)


def test_pt_file_is_what_specforge_loads(corpus, tmp_path):
    m = build_vocab_mapping(corpus, 3)
    m.save(tmp_path / "vocab_mapping.pt")
    raw = torch.load(tmp_path / "vocab_mapping.pt", map_location="cpu", weights_only=True)
    assert torch.equal(raw["d2t"], m.d2t) and torch.equal(raw["t2d"], m.t2d)
    # A bare SpecForge mapping has no key: refused when a fit is asked for, accepted (validated) otherwise.
    torch.save({"d2t": m.d2t, "t2d": m.t2d}, tmp_path / "bare.pt")
    assert load_vocab_mapping(tmp_path / "bare.pt").draft_vocab_size == 3
    with pytest.raises(VocabMappingMismatchError, match="carries no eagle-io key"):
        load_vocab_mapping(tmp_path / "bare.pt", draft_vocab_size=3)


def test_fingerprint_follows_the_data_not_the_path(corpus, tmp_path):
    import shutil

    shutil.copytree(corpus, tmp_path / "copy")
    assert dataset_fingerprint(tmp_path / "copy") == dataset_fingerprint(corpus)
    changed = write_tokens(tmp_path / "changed", [([7, 5, 5, 9, 8], [0, 1, 1, 1, 0])])
    assert dataset_fingerprint(changed) != dataset_fingerprint(corpus)
    assert dataset_fingerprint([corpus, changed]) != dataset_fingerprint([changed, corpus])


def test_cli_vocab_map(corpus, tmp_path, monkeypatch, capsys):
    from eagle_io import cli as cli_mod

    monkeypatch.setitem(cli_mod.COMMANDS, "vocab-map", vocab_cmd)
    out = tmp_path / "m.safetensors"
    assert main(["vocab-map", str(corpus), "--draft-vocab-size", "8", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert '"padded": 4' in text and "padded with the 4 lowest unused target ids" in text
    assert load_vocab_mapping(out, dataset=corpus, draft_vocab_size=8).key["padded"] == 4
    assert main(["vocab-map", str(corpus), "--draft-vocab-size", "99", "--out", str(out)]) == 2


def test_a_map_that_names_a_target_id_twice_is_refused_everywhere(tmp_path):
    """Draft ids 5 and 6 both reach target id 9 (d2t[6] = 3): t2d marks as many ids as d2t has entries and holds
    True at every mapped id, so only the one-to-one check sees it: check-serving, validate_mapping (vocab-map,
    train-draft --vocab-map, save_draft) and a draft given the map directly (train_draft)."""
    from test_serving_preflight import by_code, eagle3_draft, llama_target

    from eagle_io.draft.model import Eagle3Draft, Eagle3DraftConfig
    from eagle_io.interop.vocab import mapping_problems
    from eagle_io.serving import check_serving

    d2t = torch.tensor([4, 4, 4, 4, 4, 4, 3, 4, 4, 4], dtype=torch.int64)  # target ids 4..9, 9, 11..14
    t2d = torch.zeros(64, dtype=torch.bool)
    t2d[4:15] = True
    t2d[10] = False  # 10 target ids marked, one of them (target id 15 - 5) never drafted
    (p,) = mapping_problems(d2t, t2d, 10, 64)
    assert "not one-to-one: draft ids 5 and 6 both map to target id 9 (1 of 10 draft ids" in p
    with pytest.raises(eagle_io.InvalidArgumentError, match="draft ids 5 and 6 both map to target id 9"):
        validate_mapping(d2t, t2d, 10, 64)
    cfg = Eagle3DraftConfig(64, 10, 16, 16, num_attention_heads=2, num_key_value_heads=1, intermediate_size=16)
    with pytest.raises(eagle_io.InvalidArgumentError, match="not one-to-one"):
        Eagle3Draft(cfg).set_vocab_mapping(d2t, t2d)
    t = llama_target(tmp_path)  # vocab 1000
    big = torch.zeros(500, dtype=torch.int64)
    big[300:] = -1  # draft ids 300.. reach target ids 299..498: 299 is named twice
    d = eagle3_draft(tmp_path, eagle_ids=[1, 3, 4], d2t_values=big)
    f = by_code(check_serving(t, d, algorithm="EAGLE3"), "d2t-values")
    assert f.severity == "error" and "draft ids 299 and 300 both map to target id 299" in f.message
