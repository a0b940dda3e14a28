"""What a refused or failed run leaves behind (issue 47, kinds 4 and 6): a refusal creates nothing (no ``shards/``, no
lock, no directory), a run that stored nothing says so, exits non-zero and leaves no dataset that looks finished
(nothing a retry into the same ``--out`` trips on), an interrupted run's record counts add up, and what can be
checked before the work (the paths a command writes, the ``--dataset`` it reads) is checked first, while nothing is
loaded or written yet."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.tiny_model import FIXTURE, build_tiny_model_dir

import eagle_io
from eagle_io.cli import main
from eagle_io.data import iter_conversations
from eagle_io.errors import IncompatibleDatasetError, InvalidArgumentError, StorageError
from eagle_io.store import layout
from eagle_io.store.schema import eagle3_schema

SCHEMA = eagle3_schema(8, 1, "bfloat16")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(build_tiny_model_dir(tmp_path_factory.mktemp("tiny")))


def generate(model_dir, dataset, out, *more):
    return ["generate", "--model", model_dir, "--dataset", str(dataset), "--out", str(out), "--threads", "1", *more]


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_the_writer_lock_name_is_the_cores():
    # layout.lock_name spells src/layout.rs's lock_name: a Footprint takes back exactly the file the core made
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        eagle_io.ShardWriter(d, SCHEMA, {}, rank=1, world_size=2).close()
        assert layout.lock_name("manifest.r00001.json") in os.listdir(d)


def test_a_refused_writer_creates_nothing(tmp_path):
    # another dataset's manifest there, no resume: the core made shards/ and a lock before it looked
    held = tmp_path / "held"
    held.mkdir()
    (held / "manifest.json").write_text("{}")
    with pytest.raises(InvalidArgumentError, match="already holds data of this writer"):
        eagle_io.ShardWriter(held, SCHEMA, {"run": 1})
    assert tree(held) == ["manifest.json"]

    # a resume with other metadata: refused after the lock of another rank's manifest was made
    ds = tmp_path / "ds"
    eagle_io.ShardWriter(ds, SCHEMA, {"run": 1}, rank=0, world_size=2).close()
    before = tree(ds)
    with pytest.raises(InvalidArgumentError, match="already holds data of this writer"):
        eagle_io.ShardWriter(ds, SCHEMA, {"run": 2}, rank=0, world_size=2)
    with pytest.raises(IncompatibleDatasetError, match="metadata differs"):
        eagle_io.ShardWriter(ds, SCHEMA, {"run": 2}, rank=0, world_size=2, resume=True)
    assert tree(ds) == before

    # a root that did not exist, refused: neither it nor the parents made for it are left
    ds.joinpath(layout.SHARD_DIR, "r00000-000000.eio").write_bytes(b"not a shard")
    new = tmp_path / "a" / "b" / "new"
    (tmp_path / "a").mkdir()
    with pytest.raises(InvalidArgumentError, match="zstd_level"):
        eagle_io.ShardWriter(new, SCHEMA, {}, zstd_level=99)
    assert not (tmp_path / "a" / "b").exists()


def test_a_capture_that_fails_while_starting_leaves_no_manifest_that_says_done(tmp_path, monkeypatch, capsys):
    # the ring that cannot be made (pinned memory refused, an allocation failing) after the writer opened: the writer,
    # dropped unclosed, marked its manifest complete over zero samples, and the retry was refused
    from test_capture_session import samples, tiny_target

    from eagle_io.capturing import store as store_mod

    def no_ring(*args, **kwargs):
        raise eagle_io.errors.StorageError("the capture ring cannot be allocated (injected)")

    model, info = tiny_target()
    with eagle_io.capture(model, tmp_path / "kept", target_info=info, threads=1) as cap:
        cap.submit(samples([5, 6]))
    before = tree(tmp_path / "kept")
    monkeypatch.setattr(store_mod, "RingSink", no_ring)
    with pytest.raises(StorageError, match="injected"):  # the Python API: a new dataset
        eagle_io.capture(model, tmp_path / "new", target_info=info, threads=1)
    assert not (tmp_path / "new").exists()
    with pytest.raises(StorageError, match="injected"):  # resuming: the dataset stays, marked incomplete
        eagle_io.capture(model, tmp_path / "kept", target_info=info, threads=1, resume=True)
    assert tree(tmp_path / "kept") == before and len(eagle_io.Dataset(tmp_path / "kept")) == 2
    assert json.loads((tmp_path / "kept" / "manifest.json").read_text())["complete"] is False
    model_dir = str(build_tiny_model_dir(tmp_path / "tiny"))  # the command line
    assert main(generate(model_dir, FIXTURE, tmp_path / "cli", "--limit", "4", "--max-length", "128")) == 2
    assert "StorageError: the capture ring cannot be allocated (injected)" in capsys.readouterr().err
    assert not (tmp_path / "cli").exists()


def test_taking_back_never_touches_another_writers_files(tmp_path):
    # rank 1 of 2 stored nothing while rank 0, started after it, writes beside it in the same new root: rank 1 takes
    # back its own manifest, lock and shards, never rank 0's (deleting rank 0's open temp shard would fail its commit)
    root = tmp_path / "root"
    footprint = layout.Footprint(root)
    shards = root / layout.SHARD_DIR
    shards.mkdir(parents=True)
    mine = ["manifest.r00001.json", layout.lock_name("manifest.r00001.json")]
    theirs = ["manifest.r00000.json", layout.lock_name("manifest.r00000.json")]
    for name in [*mine, *theirs]:
        (root / name).write_text("{}")
    for name in ["r00000-000000.eio", ".r00000-000001.eio.tmp", "r00001-000000.eio", ".r00001-000001.eio.tmp"]:
        (shards / name).write_bytes(b"x")
    footprint.take_back([*mine, layout.SHARD_DIR], shards_of=[1])
    assert tree(root) == sorted([*theirs, "shards", "shards/r00000-000000.eio", "shards/.r00000-000001.eio.tmp"])
    footprint.take_back([*theirs, layout.SHARD_DIR], shards_of=[0])  # the last one out leaves nothing
    assert not root.exists()


def test_a_generate_whose_every_record_is_refused_leaves_no_dataset_and_a_retry_works(model_dir, tmp_path, capsys):
    # into a new directory, and into one the user already had (its file stays, nothing else is added)
    kept = tmp_path / "mine"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    for out in (tmp_path / "new", kept):
        rc = main(generate(model_dir, FIXTURE, out, "--limit", "6", "--max-length", "4", "--summary-json",
                           str(tmp_path / "s.json")))  # fmt: skip
        stdout, err = capsys.readouterr()
        assert rc == 1
        assert err.strip().splitlines()[-1] == (
            "eagle-io generate: no sample written: all 6 records read were skipped (empty_loss_mask 6); the main "
            "reason, empty_loss_mask (6 records): no assistant token lies within --max-length 4: raise --max-length; "
            f"nothing was kept in {out}"
        )
        assert "manifest  none kept: the run stored no sample" in stdout
        summary = json.loads((tmp_path / "s.json").read_text())
        assert summary["samples_written"] == 0 and summary["manifest"] is None and summary["capture_log"] is None
        assert (tree(out) if out.exists() else None) == (["notes.txt"] if out == kept else None)
        # the retry with a working --max-length needs no --resume and no other --out
        assert main(generate(model_dir, FIXTURE, out, "--limit", "6", "--max-length", "128")) == 0
        assert len(eagle_io.Dataset(out)) == 6
        capsys.readouterr()


def test_a_generate_that_fails_before_its_first_commit_leaves_nothing_and_one_that_committed_keeps_it(
    model_dir, tmp_path, capsys
):
    # a record the source cannot parse, first: the capture fails before anything is committed
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"conversations": "not a list"}\n')
    out = tmp_path / "out"
    assert main(generate(model_dir, bad, out)) == 2
    assert "DatasetFormatError" in capsys.readouterr().err and not out.exists()
    # a bad record after 30 good ones: the first window (8 batches of 2) was committed before it was read; that
    # stays, incomplete, for --resume (also test_reliability_inputs.py::test_generate_commits_the_batches_before_...)
    answer = "an answer long enough to fill a few rows of states"
    good = [{"conversations": [{"from": "human", "value": f"q {i}?"}, {"from": "gpt", "value": answer}]}
            for i in range(30)]  # fmt: skip
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(json.dumps(r) + "\n" for r in good) + '{"conversations": 3}\n')
    rc = main(generate(model_dir, mixed, out, "--max-length", "64", "--batch-size", "2", "--shard-bytes", "1"))
    assert rc == 2 and "DatasetFormatError" in capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is False and len(manifest["shards"]) >= 16


def test_a_failed_transcode_leaves_nothing_a_retry_trips_on(small_dataset, tmp_path, monkeypatch, capsys):
    # a record of the last shard damaged: the transcode fails after shards were committed (one per batch here); the
    # part written was left, incomplete, and refused the retry ("already holds data of this writer")
    import functools

    from eagle_io.errors import CorruptRecordError
    from eagle_io.store import transcode as transcode_mod

    root, _ = small_dataset
    monkeypatch.setattr(transcode_mod, "ShardWriter", functools.partial(eagle_io.ShardWriter, shard_bytes=1))
    last = sorted((root / layout.SHARD_DIR).iterdir())[-1]
    original = last.read_bytes()
    data = bytearray(original)
    data[len(data) // 3] ^= 0xFF
    last.write_bytes(bytes(data))
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    for dst in (tmp_path / "new", kept):
        with pytest.raises(CorruptRecordError):  # the Python API
            transcode_mod.transcode(root, dst, "fp8")
        assert (tree(dst) if dst.exists() else None) == (["notes.txt"] if dst == kept else None)
        assert main(["transcode", str(root), "--out", str(dst), "--precision", "fp8"]) == 2  # the command line
        assert "CorruptRecordError" in capsys.readouterr().err
        assert (tree(dst) if dst.exists() else None) == (["notes.txt"] if dst == kept else None)
    last.write_bytes(original)
    assert main(["transcode", str(root), "--out", str(kept), "--precision", "fp8"]) == 0  # repaired: the retry works
    assert len(eagle_io.Dataset(kept)) == 12 and (kept / "notes.txt").read_text() == "mine"


def test_interrupted_counts_add_up():
    from eagle_io.cli.generate_summary import human_summary

    # 120 written, 30 skipped by the source and 13 by the capture: an interrupted `generate --server` printed "159
    # read" for them (the records the batching window read ahead were left out of "read", not of "skipped"); with
    # every record read counted (163) the line adds up, and records read but not captured are said
    summary = {"samples_written": 120, "tokens_written": 1, "total_seconds": 1, "capture_seconds": 1, "raw_bytes": 1,
               "stored_bytes": 1, "ratio": 1.0, "records_read": 163, "already_committed_skipped": 0,
               "records_skipped": {"no_assistant_turn": 30}, "nonfinite_skipped": 13, "manifest": "m",
               "interrupted": {"signal": "SIGINT", "exit_code": 130}}  # fmt: skip
    line = next(x for x in human_summary(summary).splitlines() if x.startswith("records"))
    assert (
        line == "records   163 read: 120 written, 0 already committed, 43 skipped (no_assistant_turn 30, "
        "nonfinite_states 13)"
    )
    summary["records_read"] = 170  # 7 records read and not captured when the run stopped
    line = next(x for x in human_summary(summary).splitlines() if x.startswith("records"))
    assert line.endswith("43 skipped (no_assistant_turn 30, nonfinite_states 13), 7 not captured (interrupted)")


# Kind 6: options that can be checked before the work are checked first.


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "--out", "{f}/sub"], "--out {f}/sub: {f} is a file, not a directory; pass a path in a directory"),
        (["generate", "--out", "{d}/o", "--dataset", "{d}/nope.json"],
         "--dataset {d}/nope.json: cannot read it (No such file or directory); pass a ShareGPT / OpenAI-messages JSON "
         "or JSONL file"),
        (["generate", "--out", "{d}/o", "--dataset", "{d}"],
         "--dataset {d}: cannot read it (Is a directory); pass a ShareGPT / OpenAI-messages JSON or JSONL file"),
        (["generate", "--out", "{d}/o", "--summary-json", "{d}/no/s.json"],
         "--summary-json {d}/no/s.json: its directory {d}/no does not exist; create it first, or pass a path in an "
         "existing one"),
        (["report", "{d}", "--out", "{d}/missing/r.html"],
         "--out {d}/missing/r.html: its directory {d}/missing does not exist; create it first, or pass a path in an "
         "existing one"),
        (["report", "{d}", "--out", "{d}"], "--out {d}: is a directory; pass the name of the file to write"),
        (["report", "s3://eagle-io-nowhere/run"],
         "s3://eagle-io-nowhere/run is in object storage: pass --out FILE.html (or --json)"),
        (["vocab-map", "{d}", "--draft-vocab-size", "3", "--out", "{f}/v.pt"],
         "--out {f}/v.pt: {f} is a file, not a directory; pass a path in a directory"),
        (["transcode", "{d}", "--precision", "fp8", "--out", "{f}"],
         "--out {f}: is a file, not a directory; pass a directory (new or existing)"),
        (["train-draft", "{d}", "--target-model", "{d}", "--out", "{f}"],
         "--out {f}: is a file, not a directory; pass a directory (new or existing)"),
        (["import-specforge", "{d}", "--out", "{f}/x"], "--out {f}/x: {f} is a file, not a directory"),
        (["export-speculators", "{d}", "--out", "{f}"], "--out {f}: is a file, not a directory"),
        (["train-draft", "{d}", "--target-model", "{d}", "--out", "{d}/o", "--vocab-map", "{d}/m.pt"],
         "--vocab-map {d}/m.pt: cannot read it (No such file or directory); pass a vocab map (eagle-io vocab-map --out "
         "FILE)"),
        (["eval-draft", "--draft", "{d}", "--dataset", "{d}", "--prompts-file", "{d}/p.jsonl"],
         "--prompts-file {d}/p.jsonl: cannot read it (No such file or directory); pass a file of prompts"),
        (["merge", "{d}", "--dataset", "{d}/src.json"],
         "--dataset {d}/src.json: cannot read it (No such file or directory); pass the source dataset given to "
         "generate"),
    ],
    ids=["generate-out-under-a-file", "generate-missing-dataset", "generate-dataset-a-directory",
         "generate-summary-json-missing-dir", "report-out-missing-dir", "report-out-a-directory", "report-of-s3",
         "vocab-map-out-under-a-file", "transcode-out-a-file", "train-draft-out-a-file", "import-specforge-out",
         "export-speculators-out", "train-draft-missing-vocab-map", "eval-draft-missing-prompts-file",
         "merge-missing-dataset"],
)  # fmt: skip
def test_paths_are_checked_before_anything_is_loaded_or_written(tmp_path, argv, message):
    # the dataset directory given to report/vocab-map/... holds no dataset: a late check would name that instead
    d, f = tmp_path / "d", tmp_path / "afile"
    d.mkdir()
    f.write_text("mine")
    argv = [a.format(d=d, f=f) for a in argv]
    done = subprocess.run([sys.executable, "-m", "eagle_io.cli", *argv], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and message.format(d=d, f=f) in done.stderr
    assert sorted(os.listdir(tmp_path)) == ["afile", "d"] and f.read_text() == "mine" and not os.listdir(d)
    assert "target " not in done.stdout  # generate refused before loading its target


def test_a_report_whose_default_page_cannot_be_written_is_refused_before_its_figures(small_dataset, capsys):
    root, _ = small_dataset
    (root / "report.html").mkdir()  # where the page goes by default: the write failed after every figure
    assert main(["report", str(root)]) == 2
    out, err = capsys.readouterr()
    assert err.strip() == (
        f"eagle-io report: InvalidArgumentError: the report (default --out) {root / 'report.html'}: is a directory; "
        "pass the name of the file to write"
    )
    assert "report    " not in out and not list((root / "report.html").iterdir())
    assert main(["report", str(root), "--json"]) == 0  # no page asked for: nothing to check
    assert json.loads(capsys.readouterr().out)["dataset"] == str(root / "manifest.json")


def test_a_missing_source_is_a_storage_error_through_the_python_api(tmp_path):
    with pytest.raises(StorageError, match=r"cannot read the dataset .*nope\.json: No such file or directory") as e:
        next(iter_conversations(tmp_path / "nope.json"))
    assert e.value.path == str(tmp_path / "nope.json") and e.value.errno == 2


def test_a_refused_or_failed_specforge_export_leaves_nothing(small_dataset, tmp_path, capsys):
    # a file of the last sample already there (another export): the export wrote every earlier sample's file, then
    # refused; a --draft-vocab-size it cannot honour was refused after the last file; a damaged record left the part
    from eagle_io.errors import CorruptRecordError
    from eagle_io.interop.specforge import export_specforge, list_specforge_files

    root, _ = small_dataset
    export_specforge(root, tmp_path / "all")
    files = sorted(p for _, p in list_specforge_files(tmp_path / "all")[0])
    held = tmp_path / "held"
    last = Path(files[-1].replace(str(tmp_path / "all"), str(held)))
    last.parent.mkdir(parents=True)
    last.write_bytes(b"another export's file")
    with pytest.raises(InvalidArgumentError, match=f"{re.escape(str(last))} exists"):
        export_specforge(root, held)
    assert tree(held) == [str(last.parent.relative_to(held)), str(last.relative_to(held))]
    with pytest.raises(InvalidArgumentError, match="cannot tell the target vocabulary size"):  # no vocab_size
        export_specforge(root, tmp_path / "v", draft_vocab_size=8)
    assert not (tmp_path / "v").exists()
    assert main(["export-specforge", str(root), "--out", str(tmp_path / "v"), "--draft-vocab-size", "8"]) == 2
    assert "cannot tell the target vocabulary size" in capsys.readouterr().err and not (tmp_path / "v").exists()
    shard = sorted((root / layout.SHARD_DIR).iterdir())[-1]
    data = bytearray(shard.read_bytes())
    data[len(data) // 3] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError):
        export_specforge(root, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
