"""`eagle-io generate` estimates its output size on every run (not only with --limit), says how, and refuses to
start when the estimate exceeds the free disk."""

from __future__ import annotations

import json
import re
from collections import namedtuple
from itertools import islice
from types import SimpleNamespace

import pytest

from eagle_io.cli import generate_cmd, main
from eagle_io.data import iter_conversations


def _jsonl(path, n: int):
    with open(path, "w") as f:
        for i in range(n):
            turns = [{"from": "human", "value": f"question {i:05d} " * 3}, {"from": "gpt", "value": f"answer {i:05d}"}]
            f.write(json.dumps({"id": f"r{i}", "conversations": turns}) + "\n")
    return path


@pytest.mark.parametrize(("rank", "world", "limit", "want"), [(0, 1, None, 400), (1, 2, None, 200), (0, 1, 100, 100)])
def test_the_estimate_follows_the_source_size_the_rank_share_and_the_limit(tmp_path, rank, world, limit, want):
    src = _jsonl(tmp_path / "src.jsonl", 400)
    args = SimpleNamespace(batch_size=4, world_size=world, limit=limit)
    reading = generate_cmd._Reading(iter_conversations(src))
    head = list(islice(generate_cmd._mine(iter(reading), rank, world), 16))  # one sample per record here
    n, how = generate_cmd._estimate(args, str(src), reading, head, done=0)
    assert abs(n - want) <= 0.03 * want, (n, how)
    assert ("--limit 100" in how) if limit else ("the source's size" in how)


def test_a_source_that_ends_in_the_first_batches_is_counted(tmp_path):
    src = _jsonl(tmp_path / "src.jsonl", 5)
    reading = generate_cmd._Reading(iter_conversations(src))
    head = list(islice(iter(reading), 16))
    assert generate_cmd._estimate(
        SimpleNamespace(batch_size=4, world_size=1, limit=None), str(src), reading, head, 0
    ) == (
        5,
        "counted: the source ended within the first batches",
    )


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
    assert re.search(r"for 3\d\d samples \(~3\d\d records from the source's size, 4\d\.\d\d kB at", last), last
