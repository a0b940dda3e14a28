"""Captures written to a real S3-compatible server (s3s-fs, tests/helpers/s3server.py): each shard uploaded as it
commits with bounded staging, a follower of the remote dataset seeing the shards land, resume from the remote
manifest when the staging is gone, a killed upload (no manifest entry at a partial object, resume completes it) and
`verify` listing orphan objects."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest
import torch
from helpers import s3server
from test_object_store import s3, write_dataset  # noqa: F401  (s3: the server fixture)

import eagle_io
from eagle_io import _native
from eagle_io.capturing.options import CaptureOptions
from eagle_io.capturing.store import ForwardSample, SampleStore
from eagle_io.store.manifest import read_manifest

pytestmark = pytest.mark.skipif(s3server.available() is not None, reason=str(s3server.available()))

HIDDEN, LAYERS = 16, [1, 2, 3]
INFO = {"num_layers": 6, "hidden_size": HIDDEN, "vocab_size": 1000, "model_id": "tiny"}


def new_bucket(server) -> str:
    bucket = f"b{uuid.uuid4().hex[:12]}"
    server.bucket(bucket)
    return f"s3://{bucket}/run"


def forward(first: int, n: int, length: int = 24):
    """``n`` samples of ``length`` tokens from id ``first``: the forward's states and rows."""
    g = torch.Generator().manual_seed(first)
    aux = torch.randn(n * length, len(LAYERS) * HIDDEN, generator=g).to(torch.bfloat16)
    final = torch.randn(n * length, HIDDEN, generator=g).to(torch.bfloat16)
    rows = [ForwardSample(first + i, [(first + i + j) % 1000 for j in range(length)], [1] * length, i * length, length)
            for i in range(n)]  # fmt: skip
    return aux, final, rows


def capture(url, staging, ids, **options):
    """Captures the samples ``ids`` (in forwards of 4) into ``url``; returns the store after close."""
    writer = {"staging": staging, "shard_bytes": 6_000, "threads": 1, **options}
    store = SampleStore.create(url, CaptureOptions(target_info=INFO, writer_options=writer), aux_layer_ids=LAYERS)
    for first in ids[::4]:
        store.put_forward(*forward(first, min(4, ids[-1] + 1 - first)))
    store.close()
    return store


def check_remote(url, ids):
    ds = eagle_io.Dataset(url)
    assert ds.manifest["complete"] and sorted(ds[p]["sample_id"] for p in range(len(ds))) == list(ids)
    for p in range(0, len(ds), 5):
        item = ds[p]
        sid = item["sample_id"]
        first = sid - sid % 4
        _, final, _ = forward(first, 4)
        i = sid - first
        assert torch.equal(item["hidden_states"].view(torch.uint8), final[i * 24 : (i + 1) * 24].view(torch.uint8))
    assert eagle_io.Dataset.verify(url) == []
    return ds


def test_capture_to_s3_uploads_each_shard_as_it_commits(s3, tmp_path):  # noqa: F811
    url = new_bucket(s3)
    staging = tmp_path / "stage"
    seen: list[int] = []
    follower = eagle_io.ShardDataset(url, follow=True, poll_s=0.05, timeout_s=120)
    reader = threading.Thread(target=lambda: seen.extend(int(x["sample_id"]) for x in follower))
    reader.start()
    writer = {"staging": staging, "shard_bytes": 6_000, "threads": 1, "staging_bytes": 1}
    store = SampleStore.create(url, CaptureOptions(target_info=INFO, writer_options=writer), aux_layer_ids=LAYERS)
    for first in range(0, 40, 4):
        store.put_forward(*forward(first, 4))
    # Before close: the remote manifest lists committed shards, is not complete, and no staged copy of a listed
    # shard is left (staging_bytes=1: each put waited for the uploads of the shards committed before).
    deadline = time.monotonic() + 60
    while not (remote := read_manifest(f"{url}/manifest.json"))["shards"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert remote["shards"] and not remote["complete"]
    store.close()
    reader.join(timeout=120)
    assert not reader.is_alive() and sorted(seen) == list(range(40)), "the follower saw every sample once"
    ds = check_remote(url, range(40))
    report = store.upload_report
    assert report["uploaded"] == [s["file"] for s in ds.manifest["shards"]] and len(report["uploaded"]) > 2
    assert report["bytes"] == sum(s["bytes"] for s in ds.manifest["shards"])
    assert list((staging / "shards").iterdir()) == [], "every uploaded shard's staged copy is removed"
    assert read_manifest(staging / "manifest.json")["complete"]


def test_resume_continues_the_remote_dataset_without_its_staging(s3, tmp_path):  # noqa: F811
    url = new_bucket(s3)
    capture(url, tmp_path / "a", list(range(16)))
    first = [s["file"] for s in eagle_io.Dataset(url).manifest["shards"]]
    # Another machine: an empty staging directory; the remote manifest and shards are read back.
    store = capture(url, tmp_path / "b", list(range(32)), resume=True)
    assert store.counts["already_done"] == 16 and store.counts["written"] == 16
    ds = check_remote(url, range(32))
    files = [s["file"] for s in ds.manifest["shards"]]
    assert files[: len(first)] == first and len(set(files)) == len(files) > len(first)
    assert store.upload_report["uploaded"] == files[len(first) :]


def test_generate_looks_at_the_remote_dataset_before_loading_a_target(s3, tmp_path, capsys):  # noqa: F811
    """``generate --out s3://...`` refuses a prefix that holds a capture without ``--resume``, and with it fetches
    the remote manifest into the staging, where the resume check reads what the capture was made with."""
    from eagle_io.cli import main

    url = new_bucket(s3)
    capture(url, tmp_path / "a", list(range(8)))
    staging = tmp_path / "stage"
    for backend in ("hf", "sglang"):
        argv = ["generate", "--backend", backend, "--out", url, "--staging", str(staging), "--limit", "1"]
        assert main(argv) == 2
        assert f"{url} already holds a capture ({url}/manifest.json): pass --resume" in capsys.readouterr().err
        assert not staging.exists(), "nothing is fetched without --resume"
    assert main(["generate", "--out", url, "--staging", str(staging), "--limit", "1", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "manifest.json: cannot resume: that capture was made with --model tiny (this run: " in err
    assert err.count("rerun with the options it was captured with") == 1
    assert read_manifest(staging / "manifest.json") == read_manifest(f"{url}/manifest.json")
    assert main(["generate", "--out", f"{url}/manifest.json", "--limit", "1"]) == 2
    assert f"--out {url}/manifest.json: name the dataset's prefix (s3://bucket/run), not a manifest" in (
        capsys.readouterr().err
    )
    # Two DP ranks resuming a one-writer capture would write their shards over its shards.
    argv = ["generate", "--backend", "sglang", "--dp-size", "2", "--out", url, "--staging", str(staging), "--resume"]
    assert main(argv) == 2
    assert f"{url} holds a capture by 1 writer(s) (manifest.json) and this run has 2" in capsys.readouterr().err
    # A staging that is not the remote dataset nor a later state of it: another run's, or the capture went on
    # elsewhere. Refused, naming both, before a target loads.
    other = new_bucket(s3)
    capture(other, tmp_path / "other", list(range(4)))
    assert main(["generate", "--out", other, "--staging", str(staging), "--limit", "1", "--resume"]) == 2
    err = capsys.readouterr().err
    assert f"{staging / 'manifest.json'} is not {other}/manifest.json nor a later state of it" in err


def test_one_writer_refuses_a_prefix_of_dp_ranks_and_each_rank_resumes_its_own_manifest(s3, tmp_path, capsys):  # noqa: F811
    from eagle_io.capturing.sglang.client import committed_ids
    from eagle_io.cli import main

    url = new_bucket(s3)
    for rank in (0, 1):
        capture(url, tmp_path / f"r{rank}", list(range(8 * rank, 8 * rank + 8)), rank=rank, world_size=2)
    assert committed_ids(url) == set(range(16))
    # A one-writer run would name its shards as rank 0's: refused before a target loads, whatever --resume says.
    for extra in ([], ["--resume"]):
        assert main(["generate", "--out", url, "--staging", str(tmp_path / "one"), "--limit", "1", *extra]) == 2
        assert f"{url} holds a capture by 2 writer(s) (manifest.r00000.json, manifest.r00001.json)" in (
            capsys.readouterr().err
        )
    # Rank 1 resumed on another machine (no staging): it continues its own manifest, not manifest.json or rank 0's.
    store = capture(url, tmp_path / "r1-again", list(range(8, 24)), rank=1, world_size=2, resume=True)
    assert store.counts["already_done"] == 8 and store.counts["written"] == 8
    ds = eagle_io.Dataset(f"{url}/manifest.r00001.json")
    assert sorted(ds[p]["sample_id"] for p in range(len(ds))) == list(range(8, 24))
    assert eagle_io.Dataset.verify(f"{url}/manifest.r00001.json") == []
    assert eagle_io.Dataset.verify(f"{url}/manifest.r00000.json") == []
    # A shard a rank manifest lists is missing: committed_ids says so instead of skipping that rank.
    bucket = s3.root / url.split("/")[2]
    next((bucket / "run" / "shards").glob("r00001-*.eio")).unlink()
    with pytest.raises(eagle_io.ObjectStorageError, match=r"shards/r00001-.*\(HTTP status 404\)"):
        committed_ids(url)


def test_a_shard_lost_from_the_staging_before_its_upload_is_named_at_resume(s3, tmp_path):  # noqa: F811
    url = new_bucket(s3)
    capture(url, tmp_path / "a", list(range(8)))
    listed = read_manifest(tmp_path / "a" / "manifest.json")["shards"]
    # The state of a staging whose shard was committed, then lost before its upload (here: its object removed).
    (s3.root / url.split("/")[2] / "run" / listed[-1]["file"]).unlink()
    with pytest.raises(eagle_io.ObjectStorageError, match=r"whose staged copy .* is gone too: it was never uploaded"):
        capture(url, tmp_path / "a", list(range(12)), resume=True)


def test_staging_is_for_object_storage_only(tmp_path):
    with pytest.raises(eagle_io.InvalidArgumentError, match="staging is for an object-storage out_dir"):
        options = CaptureOptions(target_info=INFO, writer_options={"staging": tmp_path / "s"})
        SampleStore.create(tmp_path / "d", options, aux_layer_ids=LAYERS)
    from eagle_io.store.upload import StagedUpload

    with pytest.raises(eagle_io.InvalidArgumentError, match="staging_bytes must be an integer >= 1"):
        StagedUpload(tmp_path / "m.json", "s3://b/run", staging_bytes=0)


def killed_upload(proxy, local, url, stall) -> None:
    """Runs ``upload_dataset(local, url)`` in a child through ``proxy``, SIGKILLs it once a request ``stall``
    matches hangs."""
    proxy.stall, proxy.stalled = stall, threading.Event()
    # The child loads the extension module alone (not the package, which imports torch): a cheap process.
    code = (
        "import importlib.util, sys; s = importlib.util.spec_from_file_location('eagle_io._native', sys.argv[1]); "
        "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); m.upload_dataset(sys.argv[2], sys.argv[3])"
    )
    args = [sys.executable, "-c", code, _native.__file__, str(local / "manifest.json"), url]
    child = subprocess.Popen(args, env={**os.environ, "AWS_ENDPOINT": proxy.endpoint})
    try:
        assert proxy.stalled.wait(120), "the upload never reached the stalled request"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL
    proxy.stall = None


def test_killed_upload_leaves_no_manifest_entry_at_a_partial_object_and_resumes(s3, tmp_path, capsys):  # noqa: F811
    from eagle_io.cli import main
    from eagle_io.store.manifest import manifest_bytes
    from eagle_io.store.remote import orphan_objects, upload_dataset

    local = tmp_path / "local"
    samples = write_dataset(local)
    url = new_bucket(s3)
    manifest = read_manifest(local / "manifest.json")
    files = [s["file"] for s in manifest["shards"]]
    assert len(files) >= 3
    partial = tmp_path / "partial"  # the dataset as it was when its first two shards had committed
    (partial / "shards").mkdir(parents=True)
    for f in files[:2]:
        (partial / f).write_bytes((local / f).read_bytes())
    (partial / "manifest.json").write_bytes(manifest_bytes({**manifest, "shards": manifest["shards"][:2]}))
    assert upload_dataset(partial, url).uploaded == files[:2]
    proxy = s3server.FaultProxy(s3.port)
    try:
        # 1. Killed while a part of the third shard is in flight: the manifest still lists two whole shards, and
        # no object stands under the third shard's name.
        killed_upload(proxy, local, url, lambda m, p: m == "PUT" and files[2] in p and "partNumber" in p)
        ds = eagle_io.Dataset(url)
        assert [s["file"] for s in ds.manifest["shards"]] == files[:2] and eagle_io.Dataset.verify(url) == []
        assert orphan_objects(url) == []
        # 2. Killed after every shard's upload completed, before the manifest's PUT: those shards are orphans, which
        # verify lists (and leaves), still passing the dataset the manifest describes.
        killed_upload(proxy, local, url, lambda m, p: m == "PUT" and p.split("?")[0].endswith("/run/manifest.json"))
        assert len(eagle_io.Dataset(url)) == sum(s["samples"] for s in manifest["shards"][:2])
        want = [(f"{url}/{s['file']}", s["bytes"]) for s in manifest["shards"][2:]]
        assert orphan_objects(url) == want
    finally:
        proxy.stop()
    capsys.readouterr()
    assert main(["verify", url, "--no-values"]) == 0, "orphans do not fail verify"
    out = capsys.readouterr().out
    for u, n in want:
        assert f"ORPHAN {u}: {n:,} bytes that no manifest names" in out
    assert f"orphans   {len(want)} object(s), {sum(n for _, n in want):,} bytes" in out
    assert orphan_objects(url) == want, "verify deleted nothing"
    # 3. Resumed: the orphans are this upload's own shards (same size, same footer and index), so they are not sent
    # again; the manifest goes last; nothing is orphaned any more.
    again = upload_dataset(local, url)
    assert again.skipped == files and again.uploaded == [] and again.bytes == 0
    ds = eagle_io.Dataset(url)
    assert sorted(ds[p]["sample_id"] for p in range(len(ds))) == sorted(samples) and eagle_io.Dataset.verify(url) == []
    assert orphan_objects(url) == []
    assert main(["verify", url, "--no-values"]) == 0
    assert "orphans   0 object(s), 0 bytes" in capsys.readouterr().out


def test_a_shard_is_never_uploaded_over_another_object(s3, tmp_path):  # noqa: F811
    """A prefix whose manifest is gone but whose shard objects stand (another writer's, e.g. an SGLang DP rank's with
    its own manifest), and a dataset whose shards have the same names: a shard identical to the object there (same
    size and tail) is not sent again; the first that differs is refused, naming the object, and nothing there
    changes."""
    from eagle_io.store.remote import upload_dataset

    url = new_bucket(s3)
    write_dataset(tmp_path / "a", n=6)
    write_dataset(tmp_path / "b", n=9)  # the same first samples, one to a shard: shard 0 is a's, shard 1 is not
    upload_dataset(tmp_path / "a", url)
    bucket = s3.root / url.split("/")[2]
    (bucket / "run" / "manifest.json").unlink()
    theirs = {p.name: p.read_bytes() for p in (bucket / "run" / "shards").iterdir()}
    names = sorted(theirs)
    ours = [(tmp_path / "b" / "shards" / n).read_bytes() for n in names[:2]]
    assert ours[0] == theirs[names[0]] and ours[1] != theirs[names[1]]
    with pytest.raises(eagle_io.IncompatibleDatasetError, match=f"{url}/shards/{names[1]}: another object"):
        upload_dataset(tmp_path / "b", url)
    assert {p.name: p.read_bytes() for p in (bucket / "run" / "shards").iterdir()} == theirs
    assert not (bucket / "run" / "manifest.json").exists()


def test_merge_of_a_remote_multi_writer_root(s3, capsys):  # noqa: F811
    from test_merge import write_rank

    from eagle_io.cli import main
    from eagle_io.store.manifest import manifest_bytes
    from eagle_io.store.merge import merge_ranks

    bucket = f"b{uuid.uuid4().hex[:12]}"
    root, url = s3.bucket(bucket) / "run", f"s3://{bucket}/run"  # files written in the server's directory are objects
    for r in range(2):
        write_rank(root, r, 2, [i for i in range(10) if i % 2 == r])
    report = merge_ranks(url, expected_ids=range(10))
    assert report.written and report.manifest == f"{url}/manifest.json" and report.ok
    assert report.ranks == ["manifest.r00000.json", "manifest.r00001.json"]
    ds = eagle_io.Dataset(url)
    assert sorted(ds[p]["sample_id"] for p in range(len(ds))) == list(range(10)) and ds.manifest["complete"]
    # Merging again replaces it (if-match on its ETag); the CLI takes the URL.
    capsys.readouterr()
    assert main(["merge", url, "--expect-records", "10"]) == 0
    assert f"-> {url}/manifest.json" in capsys.readouterr().out
    # A manifest.json listing shards no rank lists (another dataset) is not overwritten.
    m = read_manifest(f"{url}/manifest.json")
    (root / "manifest.json").write_bytes(manifest_bytes({**m, "shards": [{**m["shards"][0], "file": "shards/x.eio"}]}))
    with pytest.raises(eagle_io.IncompatibleDatasetError, match=r"manifest.json lists shards/x.eio"):
        merge_ranks(url)
