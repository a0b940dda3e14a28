"""(slow) The distributed training feed under ``torchrun --nproc-per-node 2`` (gloo, CPU) on a real dataset (the
embedded SmolLM2 over 10 ShareGPT records, several shards) that ``eagle-io generate --out s3://...`` wrote to the
real local object store (s3s-fs) and ``verify`` checked there; both ranks read it from the store. Per epoch the
union of the samples the two ranks trained on is the dataset, each sample once; a job SIGKILLed mid-epoch and
started again from its checkpoints continues exactly (each rank's sequence equals the uninterrupted run's: nothing
repeated, lost or reordered). The rank program is tests/helpers/torchrun_feed.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import eagle_io
from eagle_io.cli import main

pytestmark = pytest.mark.slow

HELPER = Path(__file__).resolve().parent / "helpers" / "torchrun_feed.py"


@pytest.fixture(scope="module")
def real_dataset(tmp_path_factory):
    """``(s3:// URL, sorted sample ids)`` of the generated dataset; the server's endpoint and keys are in
    ``os.environ`` for the module (the torchrun ranks inherit them)."""
    from helpers import s3server

    if s3server.available() is not None:
        pytest.skip(str(s3server.available()))
    tmp = tmp_path_factory.mktemp("torchrun")
    server = s3server.S3Server(tmp / "s3root")
    saved = {k: os.environ.get(k) for k in server.env()}
    os.environ.update(server.env())
    try:
        server.bucket("feed")
        url = "s3://feed/run"
        args = ["generate", "--out", url, "--staging", str(tmp / "stage"), "--limit", "10", "--max-length", "64"]
        assert main([*args, "--batch-size", "5", "--shard-bytes", "300000", "--skip-bad-records"]) == 0
        assert eagle_io.Dataset.verify(url) == []
        ds = eagle_io.Dataset(url)
        assert len(ds) >= 6 and len(ds.manifest["shards"]) >= 3
        yield url, sorted(ds.entry(p).sample_id for p in range(len(ds)))
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def torchrun(dataset: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    out.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(HELPER)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([*cmd, dataset, str(out), *extra], env=env, capture_output=True, text=True, timeout=600)


def results(out: Path) -> list[dict]:
    return [json.loads((out / f"seen-r{r}.json").read_text()) for r in range(2)]


def test_two_ranks_cover_every_sample_once_per_epoch_and_a_killed_job_resumes_exactly(real_dataset, tmp_path):
    dataset, ids = real_dataset
    full = torchrun(dataset, tmp_path / "full")
    assert full.returncode == 0, full.stderr[-3000:]
    ranks = [r["epochs"] for r in results(tmp_path / "full")]
    for epoch in ("0", "1"):
        union = ranks[0][epoch] + ranks[1][epoch]
        assert sorted(union) == ids, f"epoch {epoch}: every sample exactly once over the two ranks"
        assert ranks[0][epoch] and ranks[1][epoch]
    assert ranks[0]["0"] + ranks[1]["0"] != ranks[0]["1"] + ranks[1]["1"], "a new order each epoch"

    killed = torchrun(dataset, tmp_path / "resumed", "--kill-at", "1")
    assert killed.returncode != 0, "rank 0 killed itself after step 1: torchrun reports the failure"
    assert not (tmp_path / "resumed" / "seen-r0.json").exists()
    resumed = torchrun(dataset, tmp_path / "resumed")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    again = results(tmp_path / "resumed")
    assert [r["epochs"] for r in again] == ranks, "the resumed job trained on exactly what the uninterrupted one did"
    for r in range(2):  # it started from its checkpoints, mid-epoch 0 (rank 1 is blocked in step 2's all-reduce)
        assert 0 < again[r]["resumed_after"] < len(ranks[r]["0"]), again[r]
