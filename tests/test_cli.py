"""`eagle-io inspect` and `eagle-io verify` on datasets the tests wrote."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers.shard_bytes import layout

from eagle_io.cli import main


def test_inspect_reports_totals(small_dataset, capsys):
    root, samples = small_dataset
    assert main(["inspect", str(root), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["samples"] == len(samples) == 12
    assert s["tokens"] == sum(t["input_ids"].shape[0] for t in samples.values())
    assert s["complete"] is True and s["metadata"] == {"target_model": "tiny"}
    assert s["ratio"] == round(s["raw_bytes"] / s["stored_bytes"], 4)
    assert main(["inspect", str(root)]) == 0
    assert "samples   12 in" in capsys.readouterr().out


def test_verify_ok_then_lists_every_bad_record(small_dataset, capsys):
    root, _ = small_dataset
    assert main(["verify", str(root)]) == 0
    assert "OK 12 samples" in capsys.readouterr().out
    manifest = json.loads((root / "manifest.json").read_text())
    shards = [root / s["file"] for s in manifest["shards"]]
    for shard in shards[:2]:  # corrupt the first record of two shards
        lay = layout(shard)
        data = bytearray(lay["data"])
        data[lay["data_start"] + 30] ^= 0xFF
        shard.write_bytes(bytes(data))
    # Through the installed console script, as a user runs it.
    r = subprocess.run([sys.executable, "-m", "eagle_io.cli", "verify", str(root)], capture_output=True, text=True)
    assert r.returncode == 1
    bad = [line for line in r.stdout.splitlines() if line.startswith("BAD ")]
    assert len(bad) == 2 and all("sample id" in b and "byte offset" in b for b in bad)
    assert "2 bad record(s)" in r.stdout


def test_errors_exit_2_with_a_message(tmp_path, capsys):
    assert main(["inspect", str(tmp_path)]) == 2
    assert "StorageError" in capsys.readouterr().err


def test_output_piped_into_a_reader_that_left_ends_quietly_with_sigpipe_status(small_dataset):
    """``eagle-io inspect DS | head -1``: the reader goes, the next write breaks the pipe; the command ends as a shell's
    tools do (128 + SIGPIPE), with no traceback (was: BrokenPipeError, a traceback from inspect_cmd, exit 1)."""
    import os
    import signal

    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has already left
    try:
        r = subprocess.run([sys.executable, "-m", "eagle_io.cli", "inspect", str(small_dataset[0])], stdout=write_end,
                           stderr=subprocess.PIPE, text=True, timeout=120)  # fmt: skip
    finally:
        os.close(write_end)
    assert (r.returncode, r.stderr) == (128 + signal.SIGPIPE, "")
