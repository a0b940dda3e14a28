"""`eagle-io generate` estimates its output size on every run (not only with --limit) from the counted records and
the share of the first records tokenized that gave a sample, says how, and refuses to start when it exceeds the free
disk."""

from __future__ import annotations

import json
from collections import namedtuple
from itertools import islice
from types import SimpleNamespace

import pytest

from eagle_io.cli import generate_cmd, main
from eagle_io.data import iter_conversations
from eagle_io.data.sources import count_records


def _jsonl(path, n: int):
    with open(path, "w") as f:
        for i in range(n):
            turns = [{"from": "human", "value": f"question {i:05d} " * 3}, {"from": "gpt", "value": f"answer {i:05d}"}]
            f.write(json.dumps({"id": f"r{i}", "conversations": turns}) + "\n")
    return path


@pytest.mark.parametrize(("rank", "world", "limit", "want"), [(0, 1, None, 400), (1, 2, None, 200), (0, 1, 100, 100)])
def test_the_estimate_follows_the_counted_records_the_rank_share_and_the_limit(tmp_path, rank, world, limit, want):
    src = _jsonl(tmp_path / "src.jsonl", 400)
    args = SimpleNamespace(batch_size=4, rank=rank, world_size=world, limit=limit)
    total = len(range(rank, count_records(src, limit), world))  # this rank's share, as generate counts it
    head = list(islice(generate_cmd._mine(iter_conversations(src), rank, world), 16))  # one sample per record here
    n, how = generate_cmd._estimate(args, total, head, head[-1].index, done=0)
    assert n == want
    assert how == f"{total:,} records to read; the first 16 tokenized gave 16 samples (100%), assumed for the rest"


def test_the_estimate_scales_by_the_share_of_records_that_give_a_sample(tmp_path):
    src = _jsonl(tmp_path / "src.jsonl", 400)
    records = list(iter_conversations(src))
    head = records[:32:2]  # 16 samples from the first 32 records read: half of them gave one
    args = SimpleNamespace(batch_size=4, rank=0, world_size=1, limit=None)
    n, how = generate_cmd._estimate(args, 400, head, records[31].index, done=0)
    assert n == 16 + 0.5 * (400 - 32)
    assert how == "400 records to read; the first 32 tokenized gave 16 samples (50%), assumed for the rest"
    n, _ = generate_cmd._estimate(args, 400, head, records[31].index, done=16)  # 16 of them were committed
    assert n == 16 + 1.0 * (400 - 32)


def test_a_source_that_ends_in_the_first_batches_is_counted(tmp_path):
    src = _jsonl(tmp_path / "src.jsonl", 5)
    head = list(iter_conversations(src))
    args = SimpleNamespace(batch_size=4, rank=0, world_size=1, limit=None)
    assert generate_cmd._estimate(args, 5, head, 4, 0) == (5, "counted: the source ended within the first batches")


def test_generate_without_limit_refuses_an_output_larger_than_the_free_disk(tmp_path, monkeypatch, capsys):
    from helpers.tiny_model import build_tiny_model_dir

    model = build_tiny_model_dir(tmp_path / "model")
    src = _jsonl(tmp_path / "src.jsonl", 300)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(generate_cmd.shutil, "disk_usage", lambda p: usage(10**6, 10**6 - 50_000, 50_000))
    argv = ["generate", "--model", str(model), "--dataset", str(src), "--out", str(tmp_path / "out")]
    assert main([*argv, "--batch-size", "2", "--threads", "1"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the model loader's progress bars
    assert last.startswith("eagle-io generate: InvalidArgumentError: estimated output") and "exceeds free disk" in last
    assert "for 300 samples (300 records to read; the first 8 tokenized gave 8 samples (100%), assumed" in last, last


@pytest.mark.parametrize(("precision", "ratio"), [("bf16", 1.35), ("fp8", 2.3)])
def test_the_disk_estimate_uses_the_expected_ratio_of_the_storage_precision(tmp_path, precision, ratio):
    from eagle_io.store.schema import EXPECTED_RATIO, precision_name

    assert EXPECTED_RATIO[precision_name(precision)] == ratio
    # 1,000 samples x 1,000 tokens x 11,529 bytes per token (SmolLM2: 8 + 1 + 2 x 576 x 10) / ratio
    line = generate_cmd._disk_check(str(tmp_path), 1000, 1000, 11_529, "counted", 2048, ratio)
    assert f"estimated output {11_529e6 / ratio / 1e9:,.2f} GB for 1,000 samples" in line, line
