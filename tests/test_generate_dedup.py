"""`eagle-io generate` stores a system prompt shared by several conversations once (issue 44 item 4, docs/FORMAT.md
4.7): the run stores fewer bytes, and every reader and exporter returns exactly what the same run with
`--dedup-prefixes off` stored (the tiny float32 target's rows do not depend on the batch, as tests/test_capture_hf.py
checks); verify passes; a resumed run finds its prefix records."""

from __future__ import annotations

import json

import pytest
from helpers.tiny_model import build_tiny_model_dir

import eagle_io
from conftest import make_sample, same
from eagle_io.capturing.options import CaptureOptions
from eagle_io.capturing.prefixes import SharedPrefixes, token_digest
from eagle_io.cli import main
from eagle_io.feed import Loader, PackingCollator, PaddingCollator, ShardDataset
from eagle_io.interop.specforge import export_specforge
from eagle_io.interop.speculators import export_speculators

SYSTEM = " ".join(f"Rule {i}: answer politely and cite the policy section on topic {i}." for i in range(6))
#: Conversations 2 and 5 have no system prompt; the others share SYSTEM.
CONVERSATIONS = [
    {
        "id": f"c{i}",
        "conversations": ([] if i % 3 == 2 else [{"from": "system", "value": SYSTEM}])
        + [
            {"from": "human", "value": f"Question {i}: how many apples are in basket {i * 7}?"},
            {"from": "gpt", "value": f"There are {i * 3} apples in basket {i * 7}, counted this morning."},
        ],
    }
    for i in range(6)
]


def generate(model, data, out, *flags: str) -> None:
    argv = ["generate", "--model", str(model), "--dataset", str(data), "--out", str(out)]
    # 8 (the final pre-norm boundary) for export-speculators
    assert main([*argv, "--batch-size", "2", "--threads", "1", "--aux-layer-ids", "2,4,5,8", *flags]) == 0


def stored_bytes(root) -> int:
    m = json.loads((root / "manifest.json").read_text())
    return sum(s["bytes"] for s in m["shards"] + m.get("prefixes", []))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same conversations captured with the default (shared prefixes stored once) and with them off."""
    root = tmp_path_factory.mktemp("dedup")
    model = build_tiny_model_dir(root / "model")
    data = root / "data.json"
    data.write_text(json.dumps(CONVERSATIONS))
    generate(model, data, root / "dd")
    generate(model, data, root / "whole", "--dedup-prefixes", "off")
    return model, data, root / "dd", root / "whole"


def test_the_shared_system_prompt_is_stored_once(runs):
    _, _, dd, whole = runs
    ds = eagle_io.Dataset(dd)
    (record,) = ds.prefix_records()
    assert ds.manifest["format_version"] == 3 and eagle_io.Dataset(whole).manifest["format_version"] == 2
    assert record[1] >= 64 and record[1] % 64 == 0
    with_system = [ds[p] for p in range(len(ds)) if ds.entry(p).sample_id % 3 != 2]
    assert len(with_system) == 4 and all(len(s["input_ids"]) > record[1] for s in with_system)
    assert all(s["loss_mask"][: record[1]].sum() == 0 for s in with_system)  # the system turn: no supervised token
    # The first sample with the prompt is stored whole (no earlier one shared it), the prompt once more as its
    # record, and the three after it as references: fewer bytes than four whole copies.
    assert stored_bytes(dd) < 0.8 * stored_bytes(whole), (stored_bytes(dd), stored_bytes(whole))
    assert main(["verify", str(dd)]) == 0


def test_every_reader_returns_what_the_whole_run_stored(runs, tmp_path):
    _, _, dd, whole = runs
    a, b = eagle_io.Dataset(dd), eagle_io.Dataset(whole)
    assert len(a) == len(b) == 6
    for pos in range(len(a)):
        assert a.entry(pos) == b.entry(pos)
        same(a[pos], b[pos])
    same(list(ShardDataset(dd)), list(ShardDataset(whole)))
    for collator in (PaddingCollator(), PackingCollator(512)):
        got = [dict(x) for x in Loader(ShardDataset(dd), batch_size=2, collate_fn=collator)]
        same(got, [dict(x) for x in Loader(ShardDataset(whole), batch_size=2, collate_fn=collator)])
    for src in (dd, whole):
        export_specforge(src, tmp_path / f"sf-{src.name}")
        export_speculators(eagle_io.Dataset(src), tmp_path / f"sp-{src.name}")
    for kind in ("sf", "sp"):
        files = sorted(p.relative_to(tmp_path / f"{kind}-dd") for p in (tmp_path / f"{kind}-dd").rglob("*.*"))
        assert files
        for f in files:
            x, y = (tmp_path / f"{kind}-dd" / f).read_bytes(), (tmp_path / f"{kind}-whole" / f).read_bytes()
            assert x == y or f.name == "eagle_io_export.json", f


def test_a_resumed_run_references_the_prefix_records_it_finds(runs, tmp_path):
    model, data, dd, whole = runs
    out = tmp_path / "resumed"
    generate(model, data, out, "--limit", "3")  # conversations 0 and 1 share the prompt: a prefix record
    (first,) = eagle_io.Dataset(out).prefix_records()
    generate(model, data, out, "--resume")
    ds = eagle_io.Dataset(out)
    assert ds.prefix_records() == [first]  # found on resume and referenced, not stored again
    # Conversation 3, the first with the prompt after the resume, references it too (not stored whole): as small as
    # the run in one go, but for the second run's shard framing.
    assert stored_bytes(out) < stored_bytes(dd) + 10_000, (stored_bytes(out), stored_bytes(dd))
    assert len(ds) == 6 and main(["verify", str(out)]) == 0
    ref = eagle_io.Dataset(whole)
    for pos in range(len(ds)):
        same(ds[pos], ref[ref.position(ds.entry(pos).sample_id)])


def test_dedup_on_is_refused_where_samples_are_stored_whole(tmp_path, capsys):
    assert main(["generate", "--out", "s3://b/run", "--dedup-prefixes", "on"]) != 0
    err = capsys.readouterr().err
    assert "--dedup-prefixes on: shared prefixes are stored once into a local --out only" in err, err
    assert "--out s3://b/run" in err
    with pytest.raises(eagle_io.InvalidArgumentError, match="prefix records are not uploaded to object storage yet"):
        CaptureOptions(dedup_prefixes=True).stores_prefixes_once("s3://b/run")
    assert CaptureOptions().stores_prefixes_once(tmp_path) and not CaptureOptions().stores_prefixes_once("s3://b/r")
    assert not CaptureOptions(dedup_prefixes=False).stores_prefixes_once(tmp_path)


def test_a_live_capture_remembers_a_bounded_number_of_prefixes_and_finds_the_longest_stored(tmp_path):
    p = SharedPrefixes(block=4, remember=3)
    ids = list(range(20))
    p.note_stored(ids[:8])
    assert p.match(ids, 19) == (8, token_digest(ids[:8]), 0)
    assert p.match(ids, 7) == (0, None, 0)  # the limit (its first supervised token) comes before the record
    assert p.match(ids[:8], 20) == (0, None, 4)  # a prefix leaves a token of the sample (block 4 seen above)
    p.shared(ids, 19)  # 4 block digests seen: the oldest is forgotten
    assert p.shared(ids[:5], 19) == 0 and p.shared(ids, 19) == 16


def test_shared_prefixes_are_whole_blocks_within_the_system_prompt_leaving_a_token(tmp_path):
    p = SharedPrefixes(block=4)
    ids = list(range(20))
    assert p.shared(ids, 11) == 0  # no earlier sample
    assert p.shared(ids, 11) == 8  # capped at the system prompt's 11 tokens, rounded down to blocks
    assert p.shared(ids, 3) == 0  # less than a block
    assert p.shared(ids[:8], 20) == 4  # a token of the sample is left
    assert p.shared([0, 1, 2, 3, 9, 9, 9, 9, 9], 8) == 4  # the first block only is shared
    assert p.shared([5, *ids[1:]], 20) == 0
    # The prefix records a resumed dataset holds are known by the writer's digest of their token ids.
    sample = make_sample(3, 10, hidden=16)
    with eagle_io.ShardWriter(tmp_path / "d", eagle_io.eagle3_schema(16), {}) as w:
        _, _, key = w.write_prefix(7, {k: v[:8] for k, v in sample.items()})
    assert SharedPrefixes([key], block=4).shared(sample["input_ids"], 10) == 8
    assert SharedPrefixes([key], block=4).shared(sample["input_ids"], 7) == 0  # the record's own length is known


def test_system_tokens_are_the_system_turn_as_rendered(runs):
    from transformers import AutoTokenizer

    from eagle_io.data import tokenize_conversation
    from eagle_io.data.sources import Conversation

    tok = AutoTokenizer.from_pretrained(runs[0])
    turns = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"}]
    with_system = tokenize_conversation(Conversation(0, None, [{"role": "system", "content": SYSTEM}, *turns]), tok)
    alone = tok.encode(tok.apply_chat_template([{"role": "system", "content": SYSTEM}], tokenize=False))
    assert with_system.system_tokens == len(alone) > 64
    assert with_system.input_ids[: len(alone)].tolist() == alone
    assert tokenize_conversation(Conversation(1, None, turns), tok).system_tokens == 0
