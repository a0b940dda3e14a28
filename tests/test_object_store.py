"""Datasets read from a real S3-compatible server (s3s-fs on 127.0.0.1, tests/helpers/s3server.py): bit-exact
reads, the request count per epoch, verify/inspect, ShardDataset, errors naming URL, shard and HTTP status, and a
503 burst retried and counted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest
import torch
from helpers import s3server

import eagle_io
from conftest import make_sample
from eagle_io import _native

pytestmark = pytest.mark.skipif(s3server.available() is not None, reason=str(s3server.available()))


@pytest.fixture
def s3(tmp_path, monkeypatch):
    """A running server; its endpoint and keys in the environment (read when a bucket's client is built)."""
    server = s3server.S3Server(tmp_path / "s3root")
    for k, v in server.env().items():
        monkeypatch.setenv(k, v)
    yield server
    server.stop()


def write_dataset(root, n=12, shard_bytes=8_000):
    samples = {i * 3 + 1: make_sample(i * 3 + 1, [0, 1, 5, 40][i % 4]) for i in range(n)}
    with eagle_io.ShardWriter(
        root, eagle_io.eagle3_schema(32), {"target_model": "tiny"}, shard_bytes=shard_bytes, chunk_bytes=2_048
    ) as w:
        for sid, s in samples.items():
            w.write(sid, s, key=f"conv-{sid}")
    return samples


def served_dataset(server, n=12):
    """A dataset written into a fresh bucket of ``server``: (its s3:// URL, its directory, the samples)."""
    bucket = f"b{uuid.uuid4().hex[:12]}"
    root = server.bucket(bucket) / "run"
    return f"s3://{bucket}/run", root, write_dataset(root, n)


def requests() -> int:
    return _native.storage_stats()["requests"]


def test_dataset_from_s3_is_bit_exact_with_few_requests(s3):
    url, root, samples = served_dataset(s3)
    before = requests()
    ds = eagle_io.Dataset(url)
    shards = len(ds.manifest["shards"])
    opened = requests() - before
    assert shards > 1 and len(ds) == 12
    assert opened <= 1 + 2 * shards, f"{opened} requests to open {shards} shards"
    assert ds.manifest_path == f"{url}/manifest.json"
    local = eagle_io.Dataset(root)
    before = requests()
    for pos in range(len(ds)):
        item, want = ds[pos], local[pos]
        assert item["sample_id"] == want["sample_id"]
        for name, t in samples[item["sample_id"]].items():
            assert torch.equal(item[name].view(torch.uint8), t.view(torch.uint8))
    assert requests() - before == len(ds), "one ranged GET per record"
    assert ds.entry(3) == local.entry(3)


def test_shard_dataset_and_manifest_url(s3):
    url, _, samples = served_dataset(s3)
    sd = eagle_io.ShardDataset(url)
    assert len(sd) == 12
    ids = sorted(sd[i]["sample_id"] for i in range(len(sd)))
    assert ids == sorted(samples)
    assert len(eagle_io.Dataset(f"{url}/manifest.json")) == 12


def test_verify_and_inspect_cli_on_s3(s3):
    url, root, _ = served_dataset(s3)
    env = {**os.environ, **s3.env()}
    cli = [sys.executable, "-m", "eagle_io.cli"]
    out = subprocess.run([*cli, "verify", url, "--no-values"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "OK 12 samples" in out.stdout
    out = subprocess.run([*cli, "inspect", url], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "12" in out.stdout
    # A flipped byte in a record of the served shard: verify names the shard's URL and the sample.
    shard = sorted((root / "shards").iterdir())[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # past the header and schema, before the index: inside a record
    shard.write_bytes(bytes(data))
    out = subprocess.run([*cli, "verify", url, "--no-values"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert f"BAD {url}/shards/{shard.name}: sample id" in out.stdout


def test_missing_bucket_and_shard_name_url_and_status(s3):
    with pytest.raises(eagle_io.StorageError) as e:
        eagle_io.Dataset("s3://no-such-bucket/run")
    assert isinstance(e.value, eagle_io.ObjectStorageError)
    assert e.value.url == "s3://no-such-bucket/run/manifest.json" and e.value.status == 404
    assert "s3://no-such-bucket/run/manifest.json" in str(e.value) and "HTTP status 404" in str(e.value)

    url, root, _ = served_dataset(s3)
    shard = sorted((root / "shards").iterdir())[1]
    shard.unlink()
    with pytest.raises(eagle_io.ObjectStorageError) as e:
        eagle_io.Dataset(url)
    assert e.value.url == f"{url}/shards/{shard.name}" and e.value.status == 404


def test_bad_credentials_are_refused_with_403(s3, monkeypatch):
    url, _, _ = served_dataset(s3)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    # A client is built per bucket and endpoint: another endpoint spelling gets a fresh one with the bad key.
    monkeypatch.setenv("AWS_ENDPOINT", f"http://localhost:{s3.port}")
    with pytest.raises(eagle_io.ObjectStorageError) as e:
        eagle_io.Dataset(url)
    assert e.value.status == 403 and e.value.url == f"{url}/manifest.json"


def test_truncated_object(s3):
    url, root, _ = served_dataset(s3)
    ds = eagle_io.Dataset(url)
    shard = sorted((root / "shards").iterdir())[0]
    size = shard.stat().st_size
    os.truncate(shard, size // 3)
    # After open: the record's ranged GET comes back short, named as a truncated object.
    with pytest.raises(eagle_io.ObjectStorageError) as e:
        for pos in range(len(ds)):
            ds[pos]
    assert e.value.url == f"{url}/shards/{shard.name}" and "truncated object" in str(e.value)
    # At open: no footer where the object ends (as for a local file).
    with pytest.raises(eagle_io.CorruptRecordError) as c:
        eagle_io.Dataset(url)
    assert str(c.value).startswith(f"{url}/shards/{shard.name}: corrupt footer") and "truncated" in str(c.value)


def test_503_burst_is_retried_and_counted(s3, monkeypatch):
    url, _, samples = served_dataset(s3)
    proxy = s3server.FaultProxy(s3.port)
    try:
        monkeypatch.setenv("AWS_ENDPOINT", proxy.endpoint)
        ds = eagle_io.Dataset(url)
        before = _native.storage_stats()
        proxy.fail_next = 3
        item = ds[4]
        after = _native.storage_stats()
        assert proxy.failed == 3
        assert after["retried"] - before["retried"] == 3
        assert after["requests"] - before["requests"] == 4, "three 503s, then the GET that succeeded"
        want = samples[item["sample_id"]]["hidden_states"]
        assert torch.equal(item["hidden_states"].view(torch.uint8), want.view(torch.uint8))
    finally:
        proxy.stop()


def test_dataloader_fork_workers_read_from_s3(s3):
    """Forked workers build their own runtime and clients (the parent's runtime threads do not exist there)."""
    url, _, samples = served_dataset(s3)
    ds = eagle_io.Dataset(url)
    ds[0]  # the parent has used its runtime before forking
    loader = torch.utils.data.DataLoader(
        ds, batch_size=None, num_workers=2, multiprocessing_context="fork", timeout=120
    )
    seen = {}
    for item in loader:
        seen[item["sample_id"]] = item["aux_hidden_states"]
    assert sorted(seen) == sorted(samples)
    for sid, t in seen.items():
        assert torch.equal(t.view(torch.uint8), samples[sid]["aux_hidden_states"].view(torch.uint8))


def test_upload_resumes_without_resending_and_refuses_another_dataset(s3, tmp_path):
    from eagle_io.store.manifest import manifest_bytes, read_manifest
    from eagle_io.store.remote import upload_dataset

    local = tmp_path / "local"
    samples = write_dataset(local)
    bucket = f"b{uuid.uuid4().hex[:12]}"
    s3.bucket(bucket)
    url = f"s3://{bucket}/run"
    manifest = read_manifest(local / "manifest.json")
    files = [s["file"] for s in manifest["shards"]]
    # An interrupted upload: a staging copy whose manifest lists only the first two shards.
    partial = tmp_path / "partial"
    (partial / "shards").mkdir(parents=True)
    for f in files[:2]:
        (partial / f).write_bytes((local / f).read_bytes())
    (partial / "manifest.json").write_bytes(manifest_bytes({**manifest, "shards": manifest["shards"][:2]}))
    first = upload_dataset(partial, url)
    assert first.uploaded == files[:2] and first.skipped == []
    assert len(eagle_io.Dataset(url).manifest["shards"]) == 2
    second = upload_dataset(local, url)
    assert second.skipped == files[:2] and second.uploaded == files[2:]
    assert second.bytes == sum(s["bytes"] for s in manifest["shards"][2:])
    ds = eagle_io.Dataset(url)
    assert len(ds) == len(samples)
    for pos in range(len(ds)):
        item = ds[pos]
        want = samples[item["sample_id"]]["aux_hidden_states"]
        assert torch.equal(item["aux_hidden_states"].view(torch.uint8), want.view(torch.uint8))
    assert upload_dataset(local, url).uploaded == []
    # Another dataset's manifest at the same prefix is not overwritten.
    other = tmp_path / "other"
    write_dataset(other, n=5)
    with pytest.raises(eagle_io.IncompatibleDatasetError, match="not an earlier state"):
        upload_dataset(other, url)
    assert len(eagle_io.Dataset(url)) == len(samples)


def test_generate_out_s3_uploads_and_resumes(s3, tmp_path, capsys):
    from helpers.tiny_model import FIXTURE, build_tiny_model_dir

    from eagle_io.cli import main

    model = build_tiny_model_dir(tmp_path / "tiny")
    bucket = f"b{uuid.uuid4().hex[:12]}"
    s3.bucket(bucket)
    url = f"s3://{bucket}/run"
    args = ["generate", "--model", str(model), "--dataset", str(FIXTURE), "--out", url, "--threads", "1",
            "--staging", str(tmp_path / "stage"), "--limit", "6", "--max-length", "64"]  # fmt: skip
    assert main([*args, "--summary-json", str(tmp_path / "s.json")]) == 0
    s = json.loads((tmp_path / "s.json").read_text())
    ds = eagle_io.Dataset(url)
    assert s["upload"]["url"] == url and s["upload"]["uploaded"] == [x["file"] for x in ds.manifest["shards"]]
    assert len(ds) == s["samples_written"] > 0 and ds.manifest["complete"]
    # Each shard was uploaded as it committed, then its staged copy removed.
    assert list((tmp_path / "stage" / "shards").iterdir()) == []
    assert eagle_io.Dataset.verify(url) == []
    capsys.readouterr()
    # Resumed: nothing new to capture, nothing sent again.
    assert main([*args, "--resume"]) == 0
    assert "upload    " + url + ": 0 shard(s), 0 bytes uploaded" in capsys.readouterr().out


def test_loss_mask_figures_of_an_s3_dataset(s3):
    """inspect and report read the loss masks of an s3:// dataset through the native reader (each record fetched,
    checksummed, only its mask decoded; a batch's records coalesced into few GETs): the figures equal the local
    ones (inspect said "local datasets only", report failed)."""
    from eagle_io.report.figures import build_figures
    from eagle_io.store.masks import mask_counts

    url, root, _ = served_dataset(s3)
    local = mask_counts(root)
    before = requests()
    remote = mask_counts(url)
    shards = len(eagle_io.Dataset(root).manifest["shards"])
    assert requests() - before <= 1 + 3 * shards, "index reads plus one coalesced GET per shard"
    assert remote.supervised.tolist() == local.supervised.tolist() and (local.supervised >= 0).all()
    assert remote.sample_ids.tolist() == local.sample_ids.tolist() and remote.unreadable == []
    env = {**os.environ, **s3.env()}
    out = subprocess.run([sys.executable, "-m", "eagle_io.cli", "inspect", url, "--json"], env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    m = json.loads(out.stdout)["loss_mask"]
    assert m["supervised_tokens"] == int(local.supervised.sum()) and m["unreadable"] == 0
    fig = build_figures(url, sample=4)
    assert fig["loss_mask"]["samples_read"] == len(local.supervised)
    assert fig["loss_mask"]["supervised_tokens"] == int(local.supervised.sum())
