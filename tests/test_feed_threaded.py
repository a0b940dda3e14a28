"""``eagle_io.feed.Loader`` (issue 25): the threaded loader's batches equal a DataLoader's for every collator and
sampler (``follow=True`` included), mid-epoch resume over two ranks gives every sample exactly once, the buffer-reuse
contract is enforced in debug mode, a corrupt record raises in the consumer naming the sample, shutdown leaves no
thread behind (break, an exception, a real SIGINT while waiting), and the pinned / device path (CUDA only) and its
CPU fallback."""

from __future__ import annotations

import json
import signal
import threading
import warnings
from collections import Counter

import pytest
import torch
from helpers.checks import damage_record

import eagle_io
from conftest import FEED_LENGTHS as LENGTHS
from conftest import flat, write_samples
from eagle_io.errors import BatchRecycledError
from eagle_io.feed import (
    LengthGroupedBatchSampler,
    Loader,
    PackingCollator,
    PaddingCollator,
    RankSampler,
    ShardDataset,
)

H = 8


def loader_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == "eagle-io-loader"]


def cloned(batch: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


CASES = {
    "padding, batch_size": (lambda ds: {"batch_size": 4}, PaddingCollator),
    "padding, pad multiple, drop_last": (lambda ds: {"batch_size": 3, "drop_last": True},
                                         lambda: PaddingCollator(pad_to_multiple_of=8, pad_token_id=7)),
    "padding, length-grouped": (lambda ds: {"batch_sampler": LengthGroupedBatchSampler(ds.lengths(), batch_size=5,
                                                                                       seed=1)}, PaddingCollator),
    "packing, token budget": (lambda ds: {"batch_sampler": LengthGroupedBatchSampler(ds.lengths(), max_tokens=48,
                                                                                     seed=2)},
                              lambda: PackingCollator(48)),
    "packing, unpadded, rank split": (lambda ds: {"batch_sampler": LengthGroupedBatchSampler(
        ds.lengths(), max_tokens=40, rank=1, world_size=2, seed=3, uneven="split")},
                                      lambda: PackingCollator(40, pad_to_max_tokens=False)),
    "padding, RankSampler": (lambda ds: {"sampler": RankSampler(ds, rank=0, world_size=3, seed=4), "batch_size": 2},
                             PaddingCollator),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_batches_equal_the_dataloaders_for_every_collator_and_sampler(feed_dataset, case):
    root, _ = feed_dataset
    ds = ShardDataset(root)
    make_args, make_collator = CASES[case]
    expected = list(torch.utils.data.DataLoader(ds, collate_fn=make_collator(), **make_args(ds)))
    got = [cloned(b) for b in Loader(ds, collate_fn=make_collator(), prefetch=2, **make_args(ds))]
    assert len(got) == len(expected) > 1
    for a, b in zip(got, expected, strict=True):
        assert_same(a, b)
    assert loader_threads() == []


def test_follow_batches_equal_the_dataloaders_and_resume_per_capture(feed_dataset):
    root, _ = feed_dataset
    expected = list(torch.utils.data.DataLoader(ShardDataset(root, follow=True), batch_size=6,
                                                collate_fn=PaddingCollator()))  # fmt: skip
    loader = Loader(ShardDataset(root, follow=True, poll_s=0.05), batch_size=6)
    got, state = [], None
    for k, b in enumerate(loader):
        got.append(cloned(b))
        if k == 2:
            state = loader.state_dict()
    assert len(got) == len(expected) == 7  # 40 samples: 6 of 6, then 4
    for a, b in zip(got, expected, strict=True):
        assert_same(a, b)
    assert state["follow"] == [18] and state["batches"] == 3
    resumed = Loader(ShardDataset(root, follow=True, poll_s=0.05), batch_size=6)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    rest = [cloned(b) for b in resumed]
    assert [b["sample_ids"] for b in rest] == [b["sample_ids"] for b in got[3:]]


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals need the main thread")
def test_a_real_sigint_while_waiting_for_a_batch_reaches_the_loop_and_stops_the_thread(tmp_path):
    """Ctrl-C while the consumer waits in next() (the producer polls a capture that has not started)."""
    loader = Loader(ShardDataset(tmp_path / "not-yet", follow=True, poll_s=0.05), batch_size=2)
    main = threading.main_thread().ident
    timer = threading.Timer(0.3, signal.pthread_kill, (main, signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        for _ in loader:
            pass
    timer.join()
    assert loader_threads() == [], "stopped before the KeyboardInterrupt left next()"


def test_mid_epoch_resume_over_two_ranks_gives_every_sample_once(feed_dataset):
    root, _ = feed_dataset
    ds = ShardDataset(root)

    def make(rank):
        sampler = LengthGroupedBatchSampler(ds.lengths(), batch_size=3, rank=rank, world_size=2, seed=5, uneven="split")
        sampler.set_epoch(1)
        return Loader(ds, batch_sampler=sampler, prefetch=3)

    for stop_at in ([2, 4], [0, 6]):  # each rank checkpoints at its own step, with batches decoded ahead
        seen = []
        for rank, s in enumerate(stop_at):
            full = [b["sample_ids"] for b in make(rank)]
            loader, head = make(rank), []
            it = iter(loader)
            for _ in range(s):
                head.append(next(it)["sample_ids"])
            state = json.loads(json.dumps(loader.state_dict()))
            del it  # the job dies here; its thread is stopped and joined
            assert loader_threads() == []
            assert state["batches"] == s and state["sampler"]["step"] == s
            resumed = make(rank)
            resumed.load_state_dict(state)
            assert resumed.state_dict() == state
            tail = [b["sample_ids"] for b in resumed]
            assert head + tail == full, "the resumed run continues exactly where the checkpoint was"
            seen += flat(head + tail)
        assert Counter(seen) == Counter(range(1000, 1040)), "every sample exactly once over the two ranks"


def test_resume_through_a_plain_sampler_and_after_a_finished_epoch(feed_dataset):
    root, _ = feed_dataset
    ds = ShardDataset(root)
    loader = Loader(ds, batch_size=7)
    it = iter(loader)
    first = [next(it)["sample_ids"] for _ in range(2)]
    state = loader.state_dict()
    assert state == {"batches": 2, "finished": False, "sampler": None, "follow": None, "dataset": state["dataset"]}
    assert len(state["dataset"]) == 64, "the state carries the data's fingerprint"
    it.close()
    again = Loader(ds, batch_size=7)
    again.load_state_dict(state)
    assert flat(first) + flat(b["sample_ids"] for b in again) == list(range(1000, 1040))
    # shuffle=True: a new order per iteration; a state saved at the end of one starts the next epoch
    shuffled = Loader(ds, batch_size=8, shuffle=True, seed=9)
    epoch0 = [b["sample_ids"] for b in shuffled]
    end = shuffled.state_dict()
    assert end["finished"] and end["sampler"]["epoch"] == 0
    epoch1 = [b["sample_ids"] for b in shuffled]
    assert sorted(flat(epoch0)) == sorted(flat(epoch1)) and epoch0 != epoch1
    other = Loader(ds, batch_size=8, shuffle=True, seed=9)
    other.load_state_dict(end)
    assert [b["sample_ids"] for b in other] == epoch1
    with pytest.raises(eagle_io.InvalidArgumentError, match="seed"):
        wrong = Loader(ds, batch_size=8, shuffle=True, seed=10)
        wrong.load_state_dict(end)
        iter(wrong)
    with pytest.raises(eagle_io.InvalidArgumentError, match="not a Loader state"):
        loader.load_state_dict({"epoch": 0})


@pytest.mark.parametrize("keep", [1, 2])
def test_debug_mode_catches_a_batch_used_after_its_buffers_were_reused(feed_dataset, keep):
    root, samples = feed_dataset
    # batch 0: 4 long samples; then 1-token batches, so a reused slot's tail keeps its poison
    batches = [[1, 3, 5, 7]] + [[0]] * 4
    loader = Loader(ShardDataset(root), batch_sampler=batches, keep=keep, prefetch=1, debug=True)
    it = iter(loader)
    b0 = next(it)
    row = b0["hidden_states"][1]  # a view made while the batch is valid
    aliases = {"detach": b0["loss_mask"].detach(), "data": b0["lengths"].data}  # the slot's memory, not views
    kept = b0["aux_hidden_states"].clone()
    raw = b0["input_ids"].numpy()  # around torch: not guarded, poisoned instead
    n = samples[1003]["hidden_states"].shape[0]
    assert torch.equal(row[:n], samples[1003]["hidden_states"])
    for _ in range(keep - 1):
        next(it)
        assert torch.equal(b0["aux_hidden_states"], kept), "still valid: fewer than `keep` batches taken since"
    next(it)
    with pytest.raises(BatchRecycledError, match=r"batch 0's 'hidden_states' .* valid until"):
        row.sum()
    with pytest.raises(BatchRecycledError, match="aux_hidden_states"):
        torch.equal(b0["aux_hidden_states"], kept)
    for how, alias in aliases.items():
        with pytest.raises(BatchRecycledError, match=r"loss_mask|lengths"):
            alias.sum()
            pytest.fail(f"a {how} alias of the recycled slot escaped the guard")
    n = samples[1001]["aux_hidden_states"].shape[0]
    assert torch.equal(kept[0, :n], samples[1001]["aux_hidden_states"]), "a clone is the caller's own"
    next(it)  # batch 1 + keep: decoded into batch 0's slot, poisoned first
    flat_ids = raw.reshape(-1)
    assert flat_ids[0] == samples[1000]["input_ids"][0] and (flat_ids[1:] == -1).all()
    it.close()
    assert loader_threads() == []


def test_a_corrupt_record_raises_in_the_consumer_naming_the_sample(tmp_path):
    root = tmp_path / "ds"
    write_samples(root, 2000, LENGTHS[:16], H)
    path, off, length = damage_record(root, 2009)
    got = []
    with pytest.raises(eagle_io.CorruptRecordError) as e:
        for b in Loader(ShardDataset(root), batch_size=4, prefetch=2):
            got.append(b["sample_ids"])
    assert (e.value.sample_id, e.value.path) == (2009, path) and off <= e.value.offset < off + length
    assert "sample id 2009" in str(e.value)
    assert got == [[2000, 2001, 2002, 2003], [2004, 2005, 2006, 2007]], "batches before the bad one arrive"
    assert loader_threads() == []
    skipping = Loader(ShardDataset(root, on_corrupt="skip"), batch_size=4)
    batches = [(b["sample_ids"], [s["sample_id"] for s in b["skipped"]]) for b in skipping]
    assert batches[2] == ([2008, 2010, 2011], [2009])


def test_shutdown_leaves_no_thread_on_break_exception_or_collection(feed_dataset):
    root, _ = feed_dataset
    loader = Loader(ShardDataset(root), batch_size=2, prefetch=4)
    for k, _ in enumerate(loader):
        if k == 1:
            break
    assert loader_threads() == []
    with pytest.raises(KeyboardInterrupt):
        for _ in loader:
            assert loader_threads() == ["eagle-io-loader"]
            raise KeyboardInterrupt  # Ctrl-C in the loop body
    assert loader_threads() == []
    it = iter(loader)
    next(it)
    again = iter(loader)  # a new iteration closes the previous one
    assert loader_threads() == ["eagle-io-loader"]
    assert list(it) == [], "the closed pass yields nothing more"
    loader.close()
    assert loader_threads() == []
    del again
    iter(loader)  # dropped before its first batch
    assert loader_threads() == []
    assert len(loader) == 20


def test_cpu_fallback_of_pinned_and_device_options(feed_dataset):
    root, _ = feed_dataset
    ds = ShardDataset(root)
    expected = [cloned(b) for b in Loader(ds, batch_size=5)]
    if torch.cuda.is_available():
        pytest.skip("CUDA present: test_pinned_device_path covers these options")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pinned = Loader(ds, batch_size=5, pin_memory=True)
    assert any("not pinned" in str(w.message) for w in caught) and not pinned.pin_memory
    for a, b in zip([cloned(b) for b in pinned], expected, strict=True):
        assert_same(a, b)
    on_cpu = Loader(ds, batch_size=5, device="cpu")
    assert on_cpu.device is None
    for a, b in zip([cloned(b) for b in on_cpu], expected, strict=True):
        assert_same(a, b)
    with pytest.raises(eagle_io.InvalidArgumentError, match="CUDA is not available"):
        Loader(ds, batch_size=5, device="cuda")
    with pytest.raises(eagle_io.InvalidArgumentError, match="mutually exclusive"):
        Loader(ds, batch_size=5, batch_sampler=[[0]])


def test_a_cuda_device_this_process_does_not_have_is_refused_when_the_loader_is_built(feed_dataset, monkeypatch):
    """``device="cuda:3"`` on a one-GPU process was accepted, and the first pass failed in torch.cuda.Stream with a
    RuntimeError ("invalid device ordinal"), not the InvalidArgumentError the docstring promises at construction."""
    root, _ = feed_dataset
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with pytest.raises(eagle_io.InvalidArgumentError, match=r"'cuda:3': this process sees 1 CUDA device\(s\)"):
        Loader(ShardDataset(root), batch_size=5, device="cuda:3")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: pinned buffers and a side stream")
def test_pinned_device_path(feed_dataset):
    root, _ = feed_dataset
    ds = ShardDataset(root)
    sampler = LengthGroupedBatchSampler(ds.lengths(), max_tokens=48, seed=2)
    expected = list(torch.utils.data.DataLoader(ds, batch_sampler=sampler, collate_fn=PackingCollator(48)))
    pinned = Loader(ds, batch_sampler=sampler, collate_fn=PackingCollator(48), pin_memory=True)
    for b, e in zip(pinned, expected, strict=True):
        assert b["hidden_states"].is_pinned() and b["cu_seqlens"].is_pinned()
        gpu = b["hidden_states"].to("cuda", non_blocking=True)  # the buffer is reused only after this copy
        assert torch.equal(gpu.cpu(), e["hidden_states"])
    on_device = Loader(ds, batch_sampler=sampler, collate_fn=PackingCollator(48), device="cuda", prefetch=3)
    assert on_device.pin_memory
    for b, e in zip(on_device, expected, strict=True):
        assert b["aux_hidden_states"].device.type == "cuda" and b["sample_ids"] == e["sample_ids"]
        torch.cuda.current_stream().synchronize()
        assert all(torch.equal(b[k].cpu(), e[k]) for k in ("input_ids", "aux_hidden_states", "cu_seqlens"))
    assert loader_threads() == []


@pytest.mark.parametrize("set_epoch", [True, False])
def test_a_state_saved_at_the_end_of_a_drop_last_epoch_resumes_the_next_one(feed_dataset, set_epoch):
    """40 items in batches of 6 with drop_last: the state after the last batch had the sampler at item 36 of 40,
    so a resumed ``set_epoch(1)`` loop ran the dropped tail of epoch 0 (nothing) instead of epoch 1; without
    ``set_epoch`` the next pass (the same epoch again) was empty too."""
    root, _ = feed_dataset
    ds = ShardDataset(root)

    def epochs(state=None, first=0, count=2):
        sampler = RankSampler(ds, seed=3)
        loader = Loader(ds, sampler=sampler, batch_size=6, drop_last=True)
        if state is not None:
            loader.load_state_dict(json.loads(json.dumps(state)))
        out = []
        for epoch in range(first, first + count):
            if set_epoch:
                sampler.set_epoch(epoch)
            out.append([b["sample_ids"] for b in loader])
        return out, loader.state_dict()

    full, _ = epochs()
    (first,), end = epochs(count=1)
    assert end["finished"] and first == full[0] and len(first) == 6
    resumed, _ = epochs(end, first=1, count=1)
    assert resumed == full[1:], "the resumed run goes on with the next pass, whole"


def test_closing_a_followed_pass_from_another_thread_keeps_its_resume_point(tmp_path):
    """A followed capture still running; the consumer waits in next() on another thread and the loader is closed
    (a preemption handler): the pass ends, but the captures did not, so the state is not ``finished`` (it was, and
    a resume started again at position 0, repeating every sample taken)."""
    from conftest import make_sample

    root = tmp_path / "running"
    with eagle_io.ShardWriter(root, eagle_io.eagle3_schema(H), {}, shard_bytes=2_000, threads=1) as w:
        for sid in range(100, 106):
            w.write(sid, make_sample(sid, 5, hidden=H), key="")
        loader = Loader(ShardDataset(root, follow=True, poll_s=0.02), batch_size=2)
        taken, waiting = [], threading.Event()

        def consume():
            for b in loader:
                taken.append(b["sample_ids"])
                if len(taken) == 2:
                    waiting.set()

        consumer = threading.Thread(target=consume)
        consumer.start()
        assert waiting.wait(10)
        loader.close()
        consumer.join(10)
        assert not consumer.is_alive() and loader_threads() == []
        state = loader.state_dict()
    assert taken == [[100, 101], [102, 103]]
    assert state == {"batches": 2, "finished": False, "sampler": None, "follow": [4], "dataset": None}
    resumed = Loader(ShardDataset(root, follow=True, poll_s=0.02), batch_size=2)
    resumed.load_state_dict(state)
    assert [b["sample_ids"] for b in resumed] == [[104, 105]]


def test_passes_after_a_mid_epoch_resume_run_whole(feed_dataset):
    """A loop without set_epoch (one fixed order) resumed mid-epoch: the resumed pass ends the epoch, and every
    later pass is whole again (the sampler's start step held for good, so each later pass skipped the first 9)."""
    root, _ = feed_dataset
    ds = ShardDataset(root)

    def make():
        return Loader(ds, sampler=RankSampler(ds, shuffle=False), batch_size=3)

    whole = [b["sample_ids"] for b in make()]
    first = make()
    it = iter(first)
    head = [next(it)["sample_ids"] for _ in range(3)]
    state = first.state_dict()
    it.close()
    resumed = make()
    resumed.load_state_dict(state)
    assert head + [b["sample_ids"] for b in resumed] == whole
    assert [b["sample_ids"] for b in resumed] == whole and len(resumed) == len(whole) == 14


def test_items_truncated_to_no_supervision_are_left_out_of_ring_batches_as_of_dataloader_ones(tmp_path):
    """Items ``max_length`` cuts to no supervised token are left out and the batch rebuilt from the kept rows; in a
    Loader the rebuilt batch comes from the same ring slot as the first one, so the kept rows must be copied out
    before it is allocated (they were copied from the slot into itself, overlapping: wrong values)."""
    g = torch.Generator().manual_seed(5)
    schema = eagle_io.eagle3_schema(H)
    with eagle_io.ShardWriter(tmp_path, schema, {}, threads=1) as w:
        for i in range(12):
            n = 20 + i
            mask = torch.zeros(n, dtype=torch.uint8)
            mask[18 if i % 3 == 0 else 2 :] = 1  # every third item supervised only past token 16
            hid = torch.randn(n, H, generator=g).bfloat16()
            aux = torch.randn(n, 3 * H, generator=g).bfloat16()
            w.write(
                i, {"input_ids": torch.arange(n), "loss_mask": mask, "aux_hidden_states": aux, "hidden_states": hid}
            )
    ds = ShardDataset(tmp_path, max_length=16)
    expected = list(torch.utils.data.DataLoader(ds, batch_size=4, collate_fn=PaddingCollator()))
    got = [cloned(b) for b in Loader(ds, batch_size=4, collate_fn=PaddingCollator(), prefetch=1)]
    assert [len(b["unsupervised"]) for b in got] == [2, 1, 1] == [len(b["unsupervised"]) for b in expected]
    for a, b in zip(got, expected, strict=True):
        assert_same(a, b)
    assert sorted(sid for b in got for sid in b["sample_ids"]) == [i for i in range(12) if i % 3]
