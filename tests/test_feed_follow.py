"""Training while a capture runs: ``ShardDataset(..., follow=True)`` reads the shards a writer (another process, then
another thread) commits, never an uncommitted one, ends when the manifest is marked complete, gives up on a
stalled capture naming it, and splits samples over ranks and DataLoader workers exactly once."""

from __future__ import annotations

import pickle
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from helpers import jobs

import eagle_io
from eagle_io.errors import CaptureStalledError
from eagle_io.feed import FollowingShardDataset, PaddingCollator, ShardDataset, capture_progress
from eagle_io.store import layout

N = 40
SHARD_BYTES = 6000

CRASHING_WRITER = """
import os, sys, time
sys.path.insert(0, {tests!r})
from helpers import jobs
import eagle_io
w = eagle_io.ShardWriter({root!r}, eagle_io.eagle3_schema(jobs.HIDDEN), jobs.METADATA, shard_bytes={shard_bytes},
                         chunk_bytes=4096, threads=1)
for i in range({n}):
    w.write_batch([(i, jobs.sample(i), "conv-%d" % i)])
deadline = time.monotonic() + 60
while w.stats()["shards_committed"] < 3 and time.monotonic() < deadline:
    time.sleep(0.01)
os._exit(0)  # dies without closing: the open shard is never committed, the manifest stays incomplete
"""


def check_items(items, ids):
    assert [it["sample_id"] for it in items] == list(ids)
    for it in items:
        want = jobs.sample(it["sample_id"])
        assert torch.equal(it["input_ids"], want["input_ids"])
        assert torch.equal(it["loss_mask"], want["loss_mask"].to(torch.int64))
        assert torch.equal(it["aux_hidden_states"], want["aux_hidden_states"])
        assert torch.equal(it["hidden_states"], want["hidden_states"])
        assert it["dataset_index"] == 0


def write_rest(root: Path, first_batch: int, go_on: threading.Event, log: list) -> None:
    """Resumes the capture at ``root``: writes ``first_batch`` missing samples, waits for ``go_on``, writes the
    others up to ``N`` and closes (the manifest is then marked complete)."""
    with eagle_io.ShardWriter(
        root, eagle_io.eagle3_schema(jobs.HIDDEN), jobs.METADATA, shard_bytes=SHARD_BYTES, chunk_bytes=4096,
        threads=1, resume=True,
    ) as w:  # fmt: skip
        todo = [i for i in range(N) if i not in w]
        w.write_batch([(i, jobs.sample(i), f"conv-{i}") for i in todo[:first_batch]])
        log.append("first batch written")
        assert go_on.wait(120), "the reader never got a sample of the first batch"
        for i in todo[first_batch:]:
            w.write_batch([(i, jobs.sample(i), f"conv-{i}")])
    log.append("closed")


def test_follow_a_crashed_then_resumed_capture(tmp_path):
    root = tmp_path / "capture"
    code = CRASHING_WRITER.format(tests=str(Path(__file__).parent), root=str(root), shard_bytes=SHARD_BYTES, n=31)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    manifest = str(root / layout.MANIFEST)
    progress = capture_progress(manifest)
    assert progress is not None and not progress.complete and progress.shards >= 3
    committed = progress.samples

    # The crashed capture: exactly its committed samples, in order, then CaptureStalledError naming the manifest.
    follower = ShardDataset(root, follow=True, poll_s=0.01, timeout_s=0.3)
    assert isinstance(follower, FollowingShardDataset)
    items = []
    with pytest.raises(CaptureStalledError, match="no shard committed and not marked complete") as e:
        for item in follower:
            items.append(item)
    assert e.value.path == manifest and e.value.waited_s > 0.3
    check_items(items, range(committed))

    # Resumed: the follower takes what the writer commits while it writes, and ends when the manifest is complete.
    go_on, log = threading.Event(), []
    writer = threading.Thread(target=write_rest, args=(root, 12, go_on, log))
    writer.start()
    try:
        items = []
        for item in ShardDataset(root, follow=True, poll_s=0.01, timeout_s=120):
            items.append(item)
            if len(items) == committed + 1:
                assert "closed" not in log, "a sample of the running capture arrived before its end"
                go_on.set()
    finally:
        go_on.set()
        writer.join(120)
    assert log == ["first batch written", "closed"]
    check_items(items, range(N))
    assert capture_progress(manifest).complete


def test_follow_waits_for_a_capture_that_has_not_started(tmp_path):
    root = tmp_path / "later"
    got: list = []
    reader = threading.Thread(target=lambda: got.extend(ShardDataset(root, follow=True, poll_s=0.01, timeout_s=120)))
    reader.start()
    jobs.write_dataset(str(root), N, SHARD_BYTES)
    reader.join(120)
    check_items(got, range(N))


@pytest.fixture
def finished(tmp_path):
    jobs.write_dataset(str(tmp_path / "done"), N, SHARD_BYTES)
    return tmp_path / "done"


def test_ranks_and_workers_read_each_sample_once(finished):
    seen = []
    for rank in range(2):
        follower = ShardDataset(finished, follow=True, poll_s=0.01, rank=rank, world_size=2, max_length=8)
        loader = torch.utils.data.DataLoader(
            follower, batch_size=3, collate_fn=PaddingCollator(), num_workers=2, multiprocessing_context="fork",
            timeout=120,
        )  # fmt: skip
        for batch in loader:
            assert batch["input_ids"].shape[1] <= 8
            seen.extend(batch["sample_ids"])
    assert sorted(seen) == list(range(N))


def test_filter_arguments_and_pickling(finished, tmp_path):
    odd = list(ShardDataset(finished, follow=True, filter=lambda info, meta: info.sample_id % 2 == 1))
    assert [it["sample_id"] for it in odd] == list(range(1, N, 2))
    follower = ShardDataset([finished], follow=True, poll_s=0.5, timeout_s=None)
    again = pickle.loads(pickle.dumps(follower))
    assert again.manifests == [str(finished / layout.MANIFEST)] and again.timeout_s is None
    assert [it["sample_id"] for it in again] == list(range(N))
    for bad, match in (({"poll_s": 0}, "poll_s and timeout_s must be > 0"), ({"rank": 2, "world_size": 2}, "rank=2"),
                       ({"on_corrupt": "pad"}, "on_corrupt must be one of")):  # fmt: skip
        with pytest.raises(eagle_io.InvalidArgumentError, match=match):
            ShardDataset(finished, follow=True, **bad)
    other = tmp_path / "other"
    jobs.write_dataset(str(other), 3, SHARD_BYTES, metadata={**jobs.METADATA, "aux_layer_ids": [1, 2, 4]})
    with pytest.raises(eagle_io.IncompatibleDatasetError, match="aux_layer_ids"):
        list(ShardDataset([finished, other], follow=True))


def test_a_sample_truncated_to_no_supervision_is_left_out_and_counted(tmp_path):
    """As the collators do for a ShardDataset batch: 30-token samples supervised from token 20 on, under max_length
    16, are left out and listed in ``unsupervised`` (they trained on nothing, silently, before); one stored with
    no supervised token at all, and not truncated, is the capture's to refuse and is kept."""
    g = torch.Generator().manual_seed(0)
    with eagle_io.ShardWriter(tmp_path, eagle_io.eagle3_schema(jobs.HIDDEN), jobs.METADATA, threads=1) as w:
        for i, (n, first) in enumerate([(30, 20), (30, 3), (10, 10), (30, 20)]):
            mask = torch.zeros(n, dtype=torch.uint8)
            mask[first:] = 1
            hid = torch.randn(n, jobs.HIDDEN, generator=g).bfloat16()
            w.write(i, {"input_ids": torch.randint(0, 99, (n,), generator=g), "loss_mask": mask,
                        "aux_hidden_states": torch.cat([hid] * 3, 1), "hidden_states": hid})  # fmt: skip
    follower = ShardDataset(tmp_path, follow=True, max_length=16, poll_s=0.01)
    assert [it["sample_id"] for it in follower] == [1, 2]
    lost = [(u.item, u.sample_id, u.stored_tokens, u.max_length, u.reason) for u in follower.unsupervised]
    assert lost == [(p, p, 30, 16, "no_supervised_token_within_max_length") for p in (0, 3)]
    assert [it["sample_id"] for it in ShardDataset(tmp_path, follow=True, poll_s=0.01)] == [0, 1, 2, 3]


@pytest.mark.slow
def test_follow_eagle_io_generate_running_in_another_process(tmp_path):
    """(slow: ~1 min on the shared machine, mostly the subprocess's imports) The real writer: `eagle-io generate` (a
    tiny random Llama with SmolLM2's tokenizer, the ShareGPT slice) in a subprocess, followed from its start: the
    follower ends on its own and yields exactly the finished dataset."""
    from test_capture_session import FIXTURE, tiny_target

    from eagle_io.data import load_default_tokenizer

    tok = load_default_tokenizer()
    model, _ = tiny_target(vocab=len(tok))
    model_dir, out = tmp_path / "tiny", tmp_path / "run"
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    argv = ["generate", "--model", str(model_dir), "--dataset", str(FIXTURE), "--out", str(out), "--limit", "10"]
    argv += ["--max-length", "128", "--batch-size", "2", "--threads", "1", "--shard-bytes", "20000"]
    proc = subprocess.Popen([sys.executable, "-m", "eagle_io.cli", *argv], stdout=subprocess.DEVNULL)
    try:
        items = list(ShardDataset(out, follow=True, poll_s=0.02, timeout_s=300))
    finally:
        assert proc.wait(300) == 0
    ds = eagle_io.Dataset(out)
    assert ds.manifest["complete"] and len(ds.manifest["shards"]) >= 3
    assert [it["sample_id"] for it in items] == [ds.entry(p).sample_id for p in range(len(ds))]
    for p, it in enumerate(items):
        want = ds[p]
        assert torch.equal(it["input_ids"], want["input_ids"])
        assert torch.equal(it["aux_hidden_states"], want["aux_hidden_states"])
        assert torch.equal(it["hidden_states"], want["hidden_states"])
