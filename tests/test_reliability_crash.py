"""Crash safety (issue 6, item 1): a real writer, and `eagle-io generate`, are killed with SIGKILL at
many points; after each kill every committed shard verifies, the dataset opens, only the open shard
is lost, and a resume writes exactly the missing sample ids (no duplicate, no gap).

Kill points come from two sources:
- random delays (seeded, so a failure reproduces) on a writer committing a shard every few samples;
- exact windows, hit with the test-only LD_PRELOAD fault injector (tests/helpers/fault_inject.c; no
  production code knows about it): a torn shard write, before the shard's fsync, between its fsync
  and its rename, after the rename but before the directory fsync and the manifest update, a torn
  manifest temp, before the manifest's fsync, before and after its rename, and before the very first
  manifest exists. A window test asserts the child died *inside* the window (the injector killed it,
  not the timer), so each window is proven reached, not hoped for.

The writers run in children of a fork server (tests/helpers/forkserver.py) that imported eagle_io,
torch and transformers once, so a kill costs milliseconds, not an interpreter start. One test kills
a real `eagle-io generate` process started from its console script.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import zlib
from collections import Counter
from pathlib import Path

import pytest
import torch
from helpers import checks
from helpers.checks import check_samples, on_disk
from helpers.forkserver import ForkServer, shared
from helpers.shard_bytes import layout, shard_entry

import eagle_io

N = 60  # samples per writer run
SHARD_BYTES = 6_000  # a shard every ~3 samples: ~17 commits per run
FIXTURE = Path(__file__).parent / "fixtures" / "data" / "sharegpt_real_slice.json"


@pytest.fixture(scope="module")
def server() -> ForkServer:
    s = shared()
    assert s.threads_at_fork == 1, "the fork server must be single-threaded when it forks"
    return s


def needs_injector(server: ForkServer) -> None:
    if not server.has_shim:
        pytest.skip("no C compiler to build the test-only fault injector (tests/helpers/fault_inject.c)")


def crash_then_resume(server: ForkServer, root: Path, **run) -> tuple[dict, dict, dict]:
    """Runs the writer until it dies (or ends), checks what it left, resumes it, checks the result."""
    killed = server.run("write_dataset", {"root": str(root), "n": N, "shard_bytes": SHARD_BYTES}, **run)
    assert killed["error"] is None, killed
    state = on_disk(root)
    committed = state["listed_ids"] + state["orphan_ids"]
    # Samples are written in id order: what survived is a prefix, so nothing is missing in between.
    assert sorted(committed) == list(range(len(committed)))
    if state.get("complete"):  # only a writer that got through close() marks it complete
        assert sorted(committed) == list(range(N)) and not state["orphans"]
    resumed = server.run("write_dataset", {"root": str(root), "n": N, "shard_bytes": SHARD_BYTES, "resume": True})
    assert resumed["error"] is None and resumed["exit"] == 0, resumed
    r = resumed["result"]
    # The resumed writer knows exactly the committed samples (orphans adopted), and writes the rest.
    assert r["found"] == sorted(committed)
    assert r["written"] == list(range(len(committed), N))
    assert r["removed_temp_files"] == len(state["temps"])
    assert r["adopted_shards"] == len(state["orphans"])
    assert not list((root / "shards").glob(".*.tmp")), "no temp shard survives a resume"
    assert eagle_io.Dataset.verify(root) == []
    assert json.loads((root / "manifest.json").read_text())["complete"] is True
    check_samples(root, list(range(N)))
    return killed, state, r


# ---------------------------------------------------------------------------------------------------
# The Python writer


def test_sigkill_at_random_points_loses_only_the_open_shard(server, tmp_path):
    """Kills at seeded random delays over a whole run (encoding, appending, committing, rewriting the
    manifest). EAGLE_IO_CRASH_POINTS=200 runs a longer campaign."""
    clean = server.run("write_dataset", {"root": str(tmp_path / "clean"), "n": N, "shard_bytes": SHARD_BYTES})
    assert clean["exit"] == 0 and clean["result"]["shards"] >= 10
    duration = clean["seconds"]
    rng = random.Random(6)
    points = int(os.environ.get("EAGLE_IO_CRASH_POINTS", "12"))
    seen: Counter[str] = Counter()
    mid_run = 0
    for k in range(points):
        delay = rng.uniform(0.0, 0.9) * duration
        killed, state, resumed = crash_then_resume(server, tmp_path / f"k{k}", kill_after=delay)
        n_committed = len(resumed["found"])
        mid_run += killed["killed"] and 0 < n_committed < N
        seen["killed" if killed["killed"] else "finished first"] += 1
        seen.update(
            k
            for k, on in [
                ("no manifest yet", not state["manifest"]),
                ("temp shard left", state["temps"]),
                ("orphan shard left", state["orphans"]),
                ("manifest temp left", state["manifest_temp"]),
            ]
            if on
        )
    print(f"\nrandom kill points: {dict(seen)}; {mid_run} with some but not all samples committed")
    assert mid_run >= 1, f"no kill landed mid-run ({dict(seen)}): the delays are too short or too long"


# (fault spec, expected: temp shards left, orphan shards left, manifest exists)
WINDOWS = {
    "torn shard write (mid-record)": ("tear:write:.eio.tmp:2", 1, 0, True),
    "shard written, before its fsync": ("kill:fsync:.eio.tmp:2", 1, 0, True),
    "between shard fsync and rename": ("kill:rename_before:.eio$:2", 1, 0, True),
    "shard renamed, before directory fsync": ("kill:fsync:/shards$:2", 0, 1, True),
    "shard renamed, before manifest update": ("kill:rename_after:.eio$:2", 0, 1, True),
    "starting the next shard": ("kill:open:.eio.tmp:3", 0, 0, True),
    "torn manifest temp write": ("tear:write:.manifest.json.tmp:3", 0, 1, True),
    "manifest temp written, before its fsync": ("kill:fsync:.manifest.json.tmp:3", 0, 1, True),
    "manifest temp fsynced, before rename": ("kill:rename_before:manifest.json$:3", 0, 1, True),
    "manifest renamed, before directory fsync": ("kill:rename_after:manifest.json$:3", 0, 0, True),
    "before the first manifest exists": ("kill:rename_before:manifest.json$:1", 0, 0, False),
}


@pytest.mark.parametrize("window", list(WINDOWS))
def test_sigkill_inside_each_commit_window(server, tmp_path, window):
    needs_injector(server)
    spec, temps, orphans, has_manifest = WINDOWS[window]
    killed, state, _ = crash_then_resume(server, tmp_path / "ds", fault=spec)
    assert killed["signal"] == signal.SIGKILL and not killed["killed"], f"{spec} never triggered: {killed}"
    assert (len(state["temps"]), len(state["orphans"]), state["manifest"]) == (temps, orphans, has_manifest)
    if spec.startswith("tear:write:.manifest"):
        assert state["manifest_temp"], "the torn manifest temp is left, and ignored"


# ---------------------------------------------------------------------------------------------------
# eagle-io generate


@pytest.fixture(scope="module")
def generate_setup(server, tmp_path_factory):
    """A tiny model dir, a 42-record source (the real ShareGPT slice twice) and a clean reference run."""
    base = tmp_path_factory.mktemp("generate")
    built = server.run("build_tiny_model", {"out": str(base / "model")})
    assert built["error"] is None, built
    records = json.loads(FIXTURE.read_text())
    source = base / "source.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records + records))

    def argv(out: Path, *extra: str) -> list[str]:
        return [
            "--model", built["result"]["path"], "--dataset", str(source), "--out", str(out),
            "--max-length", "128", "--batch-size", "1", "--threads", "1", "--shard-bytes", "20000",
            "--ring-bytes", str(4 << 20), "--no-disk-check", *extra,
        ]  # fmt: skip

    ref = base / "reference"
    clean = server.run("generate", {"argv": argv(ref)})
    assert clean["error"] is None and clean["result"] == {"rc": 0}, clean
    ds = eagle_io.Dataset(ref)
    reference = {ds.entry(p).sample_id: ds[p] for p in range(len(ds))}
    assert len(reference) >= 20 and len(ds.manifest["shards"]) >= 10
    return argv, reference


def resume_generate_and_compare(server, argv, reference: dict, out: Path, committed: list[int]) -> None:
    summary = out.parent / "summary.json"
    resumed = server.run("generate", {"argv": argv(out, "--resume", "--summary-json", str(summary))})
    assert resumed["error"] is None and resumed["result"] == {"rc": 0}, resumed
    assert json.loads(summary.read_text())["samples_written"] == len(reference) - len(committed)
    assert eagle_io.Dataset.verify(out) == []
    ds = eagle_io.Dataset(out)
    ids = [ds.entry(p).sample_id for p in range(len(ds))]
    assert len(ids) == len(set(ids)) and set(ids) == set(reference), "no duplicate, no gap"
    for p, sid in enumerate(ids):
        got, want = ds[p], reference[sid]
        assert torch.equal(got["input_ids"], want["input_ids"]) and torch.equal(got["loss_mask"], want["loss_mask"])
        for name in ("aux_hidden_states", "hidden_states"):
            # Other batch-mates pad differently after a resume: at most one bf16 ulp apart, never another sample.
            assert checks.within_one_bf16_ulp(got[name], want[name]), (sid, name)


def committed_after_kill(out: Path, reference: dict) -> list[int]:
    state = on_disk(out)
    committed = state["listed_ids"] + state["orphan_ids"]
    assert len(set(committed)) == len(committed) and set(committed) <= set(reference)
    return committed


@pytest.mark.parametrize(
    "spec", ["kill:rename_after:.eio$:3", "tear:write:.eio.tmp:4"], ids=["orphan shard", "torn temp shard"]
)
def test_generate_killed_in_a_commit_window_then_resume(server, generate_setup, tmp_path, spec):
    needs_injector(server)
    argv, reference = generate_setup
    out = tmp_path / "run"
    killed = server.run("generate", {"argv": argv(out)}, fault=spec)
    assert killed["signal"] == signal.SIGKILL and not killed["killed"], f"{spec} never triggered: {killed}"
    committed = committed_after_kill(out, reference)
    assert 0 < len(committed) < len(reference)
    resume_generate_and_compare(server, argv, reference, out, committed)


def eagle_io_command() -> list[str]:
    script = Path(sys.executable).parent / "eagle-io"
    return [str(script)] if script.exists() else [sys.executable, "-m", "eagle_io.cli"]


def test_eagle_io_generate_process_sigkilled_then_resumed(server, generate_setup, tmp_path):
    """The console script as a user runs it, killed from outside once it has committed a shard."""
    argv, reference = generate_setup
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LD_PRELOAD", "EIO_FAULT")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.Popen(
        [*eagle_io_command(), "generate", *argv(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
    )
    deadline = time.monotonic() + 120
    while not list((out / "shards").glob("r*.eio")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(random.Random(1).uniform(0.0, 0.1))
    proc.send_signal(signal.SIGKILL)
    rc = proc.wait()
    err = proc.stderr.read().decode(errors="replace")
    assert rc == -signal.SIGKILL, f"generate ended before the kill (rc {rc}): {err[-2000:]}"
    committed = committed_after_kill(out, reference)
    assert 0 < len(committed) < len(reference)
    resume_generate_and_compare(server, argv, reference, out, committed)


def test_shard_entry_helper_matches_the_writer(tmp_path, server):
    """The probe manifest above trusts shard_entry(); it must agree with what the writer lists."""
    r = server.run("write_dataset", {"root": str(tmp_path), "n": 8, "shard_bytes": SHARD_BYTES})
    assert r["exit"] == 0
    m = json.loads((tmp_path / "manifest.json").read_text())
    for s in m["shards"]:
        e = shard_entry(tmp_path / s["file"])
        assert {k: e[k] for k in ("file", "samples", "bytes", "index_crc32")} == {
            k: s[k] for k in ("file", "samples", "bytes", "index_crc32")
        }
        lay = layout(tmp_path / s["file"])
        index = lay["data"][lay["index_offset"] : lay["index_offset"] + lay["index_len"]]
        assert zlib.crc32(index) == e["index_crc32"]
