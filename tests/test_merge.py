"""Many writers (issue 6, item 7): ranks sharing one root never collide (see also
test_writer_reader.py::test_ranks_share_a_root_without_colliding), and `eagle_io.store.merge.merge_ranks` /
`eagle-io merge` build one manifest over every rank and audit duplicate and missing sample ids,
against an id range or the source dataset itself."""

from __future__ import annotations

import errno
import json
import signal
from pathlib import Path

import pytest
import torch
from helpers.checks import check_samples
from helpers.forkserver import ForkServer, shared
from helpers.tiny_model import FIXTURE

import eagle_io
from conftest import make_sample
from eagle_io.cli import merge_cmd
from eagle_io.store.merge import expected_from_source, merge_ranks

HIDDEN = 8


def write_rank(root: Path, rank: int, world: int, ids, *, metadata=None, hidden=HIDDEN, dtype="bfloat16", close=True):
    meta = {"target_model": "tiny", "world_size": world} if metadata is None else metadata
    w = eagle_io.ShardWriter(
        root,
        eagle_io.eagle3_schema(hidden, dtype=dtype),
        meta,
        rank=rank,
        world_size=world,
        shard_bytes=1_500,
        threads=1,
    )
    for i in ids:
        sample = make_sample(i, 1 + i % 7, hidden=hidden)
        if dtype != "bfloat16":
            sample = {k: v.to(getattr(torch, dtype)) if v.is_floating_point() else v for k, v in sample.items()}
        w.write(i, sample, key=f"conv-{i}")
    if close:
        w.close()
    return w


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and (a.numel() == 0 or torch.equal(a.view(torch.uint8), b.view(torch.uint8)))
    )


def test_merge_lists_every_rank_shard_in_one_manifest(tmp_path):
    n, world = 30, 3
    for r in range(world):
        write_rank(tmp_path, r, world, [i for i in range(n) if i % world == r])
    report = merge_ranks(tmp_path, expected_ids=range(n))
    assert report.ok and report.written and report.complete and not report.warnings
    assert report.ranks == [f"manifest.r{r:05d}.json" for r in range(world)]
    assert (report.samples, report.missing, report.duplicates) == (n, [], {})
    merged = json.loads((tmp_path / "manifest.json").read_text())
    rank0 = json.loads((tmp_path / "manifest.r00000.json").read_text())
    assert merged.keys() == rank0.keys(), "the same format fields as a writer's manifest"
    for k in ("format", "format_version", "writer", "schema", "metadata", "codec"):
        assert merged[k] == rank0[k], k
    per_rank = [json.loads((tmp_path / f"manifest.r{r:05d}.json").read_text())["shards"] for r in range(world)]
    assert merged["shards"] == [s for shards in per_rank for s in shards], "every rank's shards, in rank order"
    assert merged["complete"] is True and report.shards == len(merged["shards"]) >= 6
    ds = eagle_io.Dataset(tmp_path)
    assert len(ds) == n and eagle_io.Dataset.verify(tmp_path) == []
    for p in range(n):
        item = ds[p]
        want = make_sample(item["sample_id"], 1 + item["sample_id"] % 7, hidden=HIDDEN)
        assert all(same(item[k], want[k]) for k in want)
    before = (tmp_path / "manifest.json").read_bytes()
    again = merge_ranks(tmp_path, expected_ids=range(n))
    assert again.ok and (tmp_path / "manifest.json").read_bytes() == before, "merging again changes nothing"


def test_duplicate_ids_are_reported_and_no_manifest_is_written(tmp_path, capsys):
    write_rank(tmp_path, 0, 2, [0, 2, 4, 6])
    write_rank(tmp_path, 1, 2, [1, 3, 4, 5])  # 4 is rank 0's
    report = merge_ranks(tmp_path)
    assert not report.ok and not report.written and not (tmp_path / "manifest.json").exists()
    assert list(report.duplicates) == [4]
    holders = report.duplicates[4]
    assert len(holders) == 2 and "(manifest.r00000.json)" in holders[0] and "(manifest.r00001.json)" in holders[1]
    assert any("not its share" in w and "[4]" in w for w in report.warnings), report.warnings
    assert merge_cmd.main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "DUPLICATE sample id 4: shards/r00000-" in out and "no merged manifest written" in out


def test_missing_ids_are_reported_against_the_expected_range(tmp_path, capsys):
    write_rank(tmp_path, 0, 2, [0, 2, 4, 8])  # 6 lost
    write_rank(tmp_path, 1, 2, [1, 3, 5, 7, 9, 11])  # 11 beyond the expected range
    report = merge_ranks(tmp_path, expected_ids=range(10))
    assert (report.missing, report.unexpected, report.expected) == ([6], [11], 10) and not report.ok
    assert report.written, "missing ids do not stop the merge: what is there is valid"
    assert len(eagle_io.Dataset(tmp_path)) == 10
    assert merge_cmd.main([str(tmp_path), "--expect-records", "10"]) == 1
    out = capsys.readouterr().out
    assert "MISSING   6" in out and "UNEXPECTED 11" in out and "1 missing" in out
    assert merge_cmd.main([str(tmp_path)]) == 0, "without an expectation, nothing is missing"
    capsys.readouterr()
    assert merge_cmd.main([str(tmp_path), "--expect-records", "10", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["missing"] == [6]


@pytest.mark.parametrize(
    ("rank1", "needle"),
    [
        (
            {"metadata": {"target_model": "other", "world_size": 2}},
            "metadata differs in 'target_model' ('tiny' vs 'other')",
        ),
        ({"metadata": {"target_model": "tiny", "world_size": 2, "max_length": 9}}, "metadata differs in 'max_length'"),
        ({"dtype": "float16"}, "schema tensor 'aux_hidden_states': dtype 'bfloat16' vs 'float16'"),
        ({"hidden": HIDDEN * 2}, "schema tensor 'aux_hidden_states': width 24 vs 48"),
    ],
)
def test_ranks_that_disagree_are_refused_naming_the_key(tmp_path, capsys, rank1, needle):
    write_rank(tmp_path, 0, 2, [0, 2])
    write_rank(tmp_path, 1, 2, [1, 3], **rank1)
    with pytest.raises(eagle_io.IncompatibleDatasetError) as e:
        merge_ranks(tmp_path)
    assert needle in str(e.value) and "manifest.r00001.json" in str(e.value)
    assert not (tmp_path / "manifest.json").exists()
    assert merge_cmd.main([str(tmp_path)]) == 2
    assert "IncompatibleDatasetError" in capsys.readouterr().err


def test_a_live_rank_writer_is_refused(tmp_path):
    write_rank(tmp_path, 0, 2, [0, 2])
    live = write_rank(tmp_path, 1, 2, [1], close=False)
    with pytest.raises(eagle_io.InvalidArgumentError, match=r"still writing manifest\.r00001\.json"):
        merge_ranks(tmp_path)
    live.close()
    assert merge_ranks(tmp_path).ok


def test_a_single_writer_manifest_in_the_root_is_never_overwritten(tmp_path):
    write_rank(tmp_path, 0, 1, [0, 1, 2], metadata={"target_model": "tiny"})  # world_size 1: manifest.json
    write_rank(tmp_path, 1, 2, [3, 5], metadata={"target_model": "tiny"})
    before = (tmp_path / "manifest.json").read_bytes()
    with pytest.raises(eagle_io.IncompatibleDatasetError, match="single-writer dataset shares this root"):
        merge_ranks(tmp_path)
    assert (tmp_path / "manifest.json").read_bytes() == before


def test_a_single_writer_root_is_audited(tmp_path):
    write_rank(tmp_path, 0, 1, [0, 1, 3], metadata={"target_model": "tiny"})
    report = merge_ranks(tmp_path, expected_ids=range(4))
    assert (report.missing, report.written, report.ranks) == ([2], False, [])
    assert report.manifest == str(tmp_path / "manifest.json")


def test_no_manifest_at_all_is_an_error(tmp_path):
    with pytest.raises(eagle_io.InvalidArgumentError, match="no manifest"):
        merge_ranks(tmp_path)


def test_absent_ranks_are_warned_about_also_when_one_rank_is_present(tmp_path, capsys):
    """With only manifest.r00001.json of a world_size-2 run, merge wrote a complete manifest without a word (the
    world_size check needed two rank manifests or more)."""
    write_rank(tmp_path, 1, 2, [1, 3])
    report = merge_ranks(tmp_path)
    assert report.written and report.warnings == [
        "metadata says world_size 2 but 1 rank manifest(s) are absent (manifest.r00000.json): their ids are missing"
    ]
    assert merge_cmd.main([str(tmp_path)]) == 0 and "manifest.r00000.json" in capsys.readouterr().out


def test_a_rank_gap_and_a_rank_beyond_world_size_are_warned_about(tmp_path):
    meta = {"target_model": "tiny", "world_size": 2}
    write_rank(tmp_path, 0, 3, [0], metadata=meta)
    write_rank(tmp_path, 2, 3, [2], metadata=meta)
    warnings = merge_ranks(tmp_path, write=False).warnings
    assert any(
        "metadata says world_size 2 but 1 rank manifest(s) are absent (manifest.r00001.json)" in w for w in warnings
    )
    assert "metadata says world_size 2 but rank(s) [2] are present" in warnings
    other = tmp_path / "no-world"
    write_rank(other, 2, 3, [5], metadata={"target_model": "tiny"})
    assert merge_ranks(other, write=False).warnings == [
        "rank 2 is present but 2 rank manifest(s) are absent (manifest.r00000.json, manifest.r00001.json): their "
        "ids are missing"
    ]


@pytest.mark.parametrize("command", ["inspect", "verify", "report"])
def test_an_unmerged_root_is_named_as_such_not_as_a_missing_manifest(tmp_path, capsys, command):
    """`inspect` / `verify` / `report` of a multi-writer root used to say `ROOT/manifest.json: No such file`."""
    from eagle_io.cli import main

    write_rank(tmp_path, 0, 2, [0, 2])
    write_rank(tmp_path, 1, 2, [1, 3])
    assert main([command, str(tmp_path), "--json"] if command == "report" else [command, str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"eagle-io {command}: InvalidArgumentError: {tmp_path}: no manifest.json, but 2 rank")
    assert "manifest.r00000.json, manifest.r00001.json" in err and f"eagle-io merge {tmp_path}" in err
    with pytest.raises(eagle_io.InvalidArgumentError, match="not merged yet"):
        eagle_io.Dataset(tmp_path)
    assert len(eagle_io.Dataset(tmp_path / "manifest.r00001.json")) == 2  # one rank's manifest still opens
    assert len(eagle_io.ShardDataset([tmp_path])) == 4  # and ShardDataset still reads every rank
    merge_ranks(tmp_path)
    assert main(["inspect", str(tmp_path), "--no-masks"]) == 0


@pytest.fixture(scope="module")
def server() -> ForkServer:
    return shared()


def test_a_crashed_rank_shows_up_in_the_audit_until_it_is_resumed(server, tmp_path):
    """Rank 1 is SIGKILLed after renaming a shard and before listing it (test-only fault injector):
    the merge writes what is valid, marks it incomplete, and names the orphan shard and the missing
    ids; after resuming rank 1 the merge is complete."""
    if not server.has_shim:
        pytest.skip("no C compiler to build the test-only fault injector")
    n, meta = 40, {"target_model": "crash-test", "world_size": 2}
    job = {"root": str(tmp_path), "n": 0, "shard_bytes": 3_000, "world_size": 2, "metadata": meta}
    r0 = server.run("write_dataset", {**job, "rank": 0, "ids": list(range(0, n, 2))})
    assert r0["exit"] == 0 and r0["error"] is None
    r1 = server.run(
        "write_dataset", {**job, "rank": 1, "ids": list(range(1, n, 2))}, fault="kill:rename_after:r00001-000002.eio$:1"
    )
    assert r1["signal"] == signal.SIGKILL and not r1["killed"]
    report = merge_ranks(tmp_path, expected_ids=range(n))
    assert report.written and not report.complete and report.incomplete_ranks == ["manifest.r00001.json"]
    assert report.unlisted_shards == ["shards/r00001-000002.eio"] and report.missing and not report.duplicates
    assert all(i % 2 == 1 for i in report.missing)
    assert len(eagle_io.Dataset(tmp_path)) == n - len(report.missing)
    resumed = server.run("write_dataset", {**job, "rank": 1, "ids": list(range(1, n, 2)), "resume": True})
    assert resumed["error"] is None and resumed["result"]["adopted_shards"] == 1
    report = merge_ranks(tmp_path, expected_ids=range(n))
    assert report.ok and report.complete and not report.unlisted_shards and not report.temp_files
    check_samples(tmp_path, list(range(n)))


def test_generate_ranks_merged_and_audited_against_the_source_dataset(server, tmp_path):
    """Two `eagle-io generate` ranks over the real ShareGPT slice; `eagle-io merge --dataset` re-reads
    the source with the run's tokenizer: every record is either stored or explained by the reason
    generate skipped it. A rank run with a smaller --limit leaves unexplained missing ids: exit 1."""
    built = server.run("build_tiny_model", {"out": str(tmp_path / "model")})
    assert built["error"] is None, built

    def generate(rank: int, limit: int) -> None:
        argv = [
            "--model", built["result"]["path"], "--dataset", str(FIXTURE), "--out", str(tmp_path / "run"),
            "--max-length", "128", "--batch-size", "2", "--threads", "1", "--limit", str(limit),
            "--rank", str(rank), "--world-size", "2", "--no-disk-check", "--ring-bytes", str(4 << 20),
        ]  # fmt: skip
        r = server.run("generate", {"argv": argv})
        assert r["error"] is None and r["result"] == {"rc": 0}, r

    generate(0, 21)
    generate(1, 21)
    merged = server.run("merge_cli", {"argv": [str(tmp_path / "run"), "--dataset", str(FIXTURE), "--limit", "21"]})
    assert merged["result"] == {"rc": 0}, merged["log"]
    log = merged["log"]
    assert "merged    2 rank manifest(s)" in log and "0 missing" in log and "skipped   no_assistant_turn:" in log
    ds = eagle_io.Dataset(tmp_path / "run")
    held = {ds.entry(p).sample_id for p in range(len(ds))}
    expected, why = expected_from_source(FIXTURE, limit=21)
    assert held < expected and set(why) == set(range(21)) - expected, "records the parser itself drops"
    # Rank 1 again, from scratch, with a smaller limit: its share beyond record 10 is now missing.
    for p in (tmp_path / "run").glob("*r00001*"):
        p.unlink()
    for p in (tmp_path / "run" / "shards").glob("r00001-*"):
        p.unlink()
    (tmp_path / "run" / "manifest.json").unlink()
    generate(1, 11)
    audit = server.run("merge_cli", {"argv": [str(tmp_path / "run"), "--dataset", str(FIXTURE), "--limit", "21"]})
    assert audit["result"] == {"rc": 1}, audit["log"]
    lost = sorted(i for i in held if i % 2 == 1 and i >= 11)
    assert lost and f"MISSING   {', '.join(map(str, lost))}" in audit["log"]


def test_expected_ids_from_a_source_with_bad_records(tmp_path):
    good = json.loads(FIXTURE.read_text())[:3]
    lines = [json.dumps(good[0]), "{not json", json.dumps({"conversations": [{"from": "robot", "value": "x"}]})]
    lines += [json.dumps(good[1]), json.dumps(good[2])]
    src = tmp_path / "src.jsonl"
    src.write_text("\n".join(lines) + "\n")
    expected, why = expected_from_source(src)
    assert expected == {0, 3, 4} and why == {1: "invalid_json", 2: "unknown_role"}
    expected, why = expected_from_source(src, limit=3)
    assert expected == {0} and why == {1: "invalid_json", 2: "unknown_role"}


def test_a_merge_that_cannot_write_raises_storage_error_and_leaves_no_manifest(tmp_path, capsys):
    write_rank(tmp_path, 0, 2, [0, 2])
    write_rank(tmp_path, 1, 2, [1, 3])
    (tmp_path / ".manifest.json.tmp").mkdir()  # the temporary name is taken by a directory
    with pytest.raises(eagle_io.StorageError) as e:
        merge_ranks(tmp_path)
    assert e.value.path == str(tmp_path / ".manifest.json.tmp") and e.value.errno == errno.EISDIR
    assert not (tmp_path / "manifest.json").exists()
    assert merge_cmd.main([str(tmp_path)]) == 2
    assert "StorageError" in capsys.readouterr().err
