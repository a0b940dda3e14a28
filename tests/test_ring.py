"""The capture ring: samples in, shards out; backpressure with a timeout, or drop-and-count."""

from __future__ import annotations

import pytest
import torch

import eagle_io
from conftest import make_sample
from eagle_io.capturing.ring import RingSink
from eagle_io.errors import ArgumentTypeError


def test_ring_roundtrip_in_order(tmp_path):
    w = eagle_io.ShardWriter(tmp_path, eagle_io.eagle3_schema(32), {}, threads=2, shard_bytes=20_000)
    sink = RingSink(w, ring_bytes=64 * 1024, batch=4)
    samples = {i: make_sample(i, [1, 0, 30, 200][i % 4]) for i in range(40)}
    for i, s in samples.items():
        assert sink.put(i, s, key=f"k{i}")
    stats = sink.stats()
    manifest = sink.close()
    assert stats["ring_high_water_bytes"] <= stats["ring_capacity"] == 64 * 1024
    assert sum(s["samples"] for s in manifest["shards"]) == 40
    ds = eagle_io.Dataset(tmp_path)
    assert [ds.entry(p).sample_id for p in range(40)] == list(range(40)), "ring keeps commit order"
    for p in range(40):
        item = ds[p]
        for name, t in samples[p].items():
            assert torch.equal(
                item[name].view(torch.uint8) if t.numel() else item[name], t.view(torch.uint8) if t.numel() else t
            )


def test_full_ring_times_out_or_drops_and_counts(tmp_path):
    w = eagle_io.ShardWriter(tmp_path, eagle_io.eagle3_schema(32), {}, threads=1)
    sink = RingSink(w, ring_bytes=8192, timeout_s=0.2)
    held = sink._sink.reserve(4096, 1.0, False)  # a slot whose copy never completes blocks the consumer
    assert held is not None
    sample = make_sample(1, 10)  # 10 tokens x 265 bytes = 2650 bytes
    assert sink.put(1, sample)
    with pytest.raises(eagle_io.RingTimeoutError, match="not keeping up"):
        sink.put(2, sample)
    dropper = RingSink.__new__(RingSink)
    dropper.__dict__.update(sink.__dict__, _drop=True)
    assert dropper.put(3, sample) is False
    stats = sink.stats()
    assert stats["dropped_samples"] == 1 and stats["producer_stall_seconds"] >= 0.2
    sink._sink.commit(held, 0, "", 0, cancelled=True)
    manifest = sink.close()
    assert sum(s["samples"] for s in manifest["shards"]) == 1


def test_ring_refuses_bad_samples(tmp_path):
    w = eagle_io.ShardWriter(tmp_path, eagle_io.eagle3_schema(32), {}, threads=1)
    sink = RingSink(w, ring_bytes=4096)
    bad = make_sample(1, 4)
    bad["hidden_states"] = bad["hidden_states"].float()
    with pytest.raises(eagle_io.SchemaError, match="hidden_states"):
        sink.put(1, bad)
    with pytest.raises(eagle_io.InvalidArgumentError, match="does not fit"):
        sink.put(2, make_sample(2, 100))
    with pytest.raises(eagle_io.InvalidArgumentError, match="capture sink"):
        w.write(3, make_sample(3, 2))
    assert sink.close()["shards"] == []


def test_a_slot_exports_only_its_own_bytes_and_none_after_commit(tmp_path):
    """Python writes the ring through one reserved slot at a time: the view is exactly the slot's bytes, the
    arena itself exports nothing, and a handed-back slot gives no new view and cannot be committed twice."""
    w = eagle_io.ShardWriter(tmp_path, [eagle_io.TensorSpec("x", "uint8")], {}, threads=1)
    sink = RingSink(w, ring_bytes=8192)
    with pytest.raises(TypeError):
        memoryview(sink._sink)  # no whole-arena export
    a, b = sink._sink.reserve(100, 1.0, False), sink._sink.reserve(300, 1.0, False)
    va, vb = memoryview(a), memoryview(b)
    assert (len(a), va.nbytes, va.readonly, vb.nbytes) == (100, 100, False, 300)
    torch.frombuffer(a, dtype=torch.uint8).fill_(7)
    torch.frombuffer(b, dtype=torch.uint8).fill_(9)
    assert set(va.tobytes()) == {7} and set(vb.tobytes()) == {9}, "slots are disjoint"
    del va, vb
    sink._sink.commit(a, 5, "", 100)
    with pytest.raises(eagle_io.RingSlotError, match=r"ring slot \d+ was committed") as info:
        memoryview(a)
    assert isinstance(info.value, BufferError), "the buffer protocol's class, for callers that catch it"
    with pytest.raises(eagle_io.InvalidArgumentError, match="already committed"):
        sink._sink.commit(a, 5, "", 100)
    sink._sink.commit(b, 6, "", 300)
    sink.close()
    ds = eagle_io.Dataset(tmp_path)
    assert [ds[p]["x"].unique().tolist() for p in range(2)] == [[7], [9]]


def test_commit_refuses_another_sinks_slot_and_a_wrong_token_count(tmp_path):
    """Both used to be taken: slot ids are per ring, so another sink's slot 0 committed this ring's slot 0 bytes
    under the wrong sample id, and a token count that did not fill the slot killed the sink thread, failing every
    later sample. Both are now refused at commit; the slot stays reserved and the capture goes on."""
    schema = [eagle_io.TensorSpec("x", "uint8", 10)]
    one = RingSink(eagle_io.ShardWriter(tmp_path / "one", schema, {}, threads=1), ring_bytes=8192)
    two = RingSink(eagle_io.ShardWriter(tmp_path / "two", schema, {}, threads=1), ring_bytes=8192)
    mine, theirs = one._sink.reserve(30, 1.0, False), two._sink.reserve(30, 1.0, False)
    torch.frombuffer(mine, dtype=torch.uint8).fill_(1)
    torch.frombuffer(theirs, dtype=torch.uint8).fill_(2)
    with pytest.raises(eagle_io.InvalidArgumentError, match="reserved by another capture sink"):
        one._sink.commit(theirs, 7, "", 3)
    with pytest.raises(eagle_io.SchemaError, match="holds 30 bytes; 4 tokens of the schema need 40") as e:
        one._sink.commit(mine, 8, "", 4)
    assert e.value.sample_id == 8
    one._sink.commit(mine, 8, "", 3)
    two._sink.commit(theirs, 7, "", 3)
    assert one.put(9, {"x": torch.full((2, 10), 5, dtype=torch.uint8)})  # the sink is alive
    one.close()
    two.close()
    a, b = eagle_io.Dataset(tmp_path / "one"), eagle_io.Dataset(tmp_path / "two")
    assert [(a.entry(p).sample_id, a[p]["x"].unique().tolist()) for p in range(len(a))] == [(8, [1]), (9, [5])]
    assert [(b.entry(p).sample_id, b[p]["x"].unique().tolist()) for p in range(len(b))] == [(7, [2])]


def test_bad_puts_are_refused_at_put_and_the_ring_goes_on(tmp_path):
    """A duplicate id used to pass put() and stop the sink thread later, losing the valid samples of its batch
    (the error came out of close()); a negative id, a list, a missing tensor or an int key raised OverflowError,
    AttributeError, KeyError or TypeError."""
    w = eagle_io.ShardWriter(tmp_path, eagle_io.eagle3_schema(32), {}, threads=1)
    sink = RingSink(w, ring_bytes=1 << 16, batch=4)
    s = make_sample(1, 5)
    assert sink.put(1, s)
    bad = [
        (1, s, "", eagle_io.SchemaError, "already in the dataset"),
        (-1, s, "", eagle_io.SchemaError, r"integers in \[0, 2\*\*64\)"),
        (1 << 64, s, "", eagle_io.SchemaError, "integers"),
        (True, s, "", eagle_io.SchemaError, "integers"),
        (2, {**s, "input_ids": [1, 2, 3, 4, 5]}, "", eagle_io.SchemaError, "'input_ids' is a list"),
        (2, {**s, "input_ids": torch.tensor(5)}, "", eagle_io.SchemaError, "'input_ids' is 0-d"),
        (2, {k: v for k, v in s.items() if k != "hidden_states"}, "", eagle_io.SchemaError, "'hidden_states' is miss"),
        (2, s, 5, ArgumentTypeError, "key must be a str"),
    ]
    for sid, tensors, key, cls, match in bad:
        with pytest.raises(cls, match=match):
            sink.put(sid, tensors, key=key)
    assert sink.put(2, make_sample(2, 3))
    manifest = sink.close()
    assert sum(x["samples"] for x in manifest["shards"]) == 2
    assert [eagle_io.Dataset(tmp_path).entry(p).sample_id for p in range(2)] == [1, 2]


def test_resumed_ids_are_refused_at_put_and_timeouts_are_checked(tmp_path):
    with eagle_io.ShardWriter(tmp_path, eagle_io.eagle3_schema(32), {}, threads=1) as w:
        w.write(4, make_sample(4, 2))
    for bad in (float("nan"), -1.0, "5", None):
        w = eagle_io.ShardWriter(tmp_path, eagle_io.eagle3_schema(32), {}, threads=1, resume=True)
        with pytest.raises(eagle_io.InvalidArgumentError, match="timeout_s must be a number"):
            RingSink(w, timeout_s=bad)
        w.close()
    w = eagle_io.ShardWriter(tmp_path, eagle_io.eagle3_schema(32), {}, threads=1, resume=True)
    sink = RingSink(w, ring_bytes=4096, timeout_s=float("inf"))  # used to panic in the core (PanicException)
    with pytest.raises(eagle_io.SchemaError, match="sample 4: this sample id is already in the dataset"):
        sink.put(4, make_sample(4, 2))
    assert sink.put(5, make_sample(5, 2))
    assert sum(x["samples"] for x in sink.close()["shards"]) == 2


def test_sink_bindings_refuse_out_of_range_ints_naming_the_argument(tmp_path):
    """`CaptureSink.commit(..., fp8_clamped=-1)` (and every other count or size of the sink's bindings given a
    negative or too large int) raised a builtin OverflowError naming nothing; a NaN or infinite `reserve` timeout
    panicked in the core. Each is refused before anything changes: the slot stays reserved and the sink runs on."""
    from eagle_io import _native

    w = eagle_io.ShardWriter(tmp_path / "a", eagle_io.eagle3_schema(32), {}, threads=1)
    sink = RingSink(w, ring_bytes=1 << 16)
    raw = sink._sink
    slot = raw.reserve(265, 1.0, False)  # one token of the schema
    calls = [
        (lambda: raw.commit(slot, 1, "", 1, fp8_clamped=-1), "fp8_clamped", -1),
        (lambda: raw.commit(slot, 1, "", 1, fp8_clamped=1 << 64), "fp8_clamped", 1 << 64),
        (lambda: raw.commit(slot, 1, "", -1), "n_tokens", -1),
        (lambda: raw.commit(slot, -1, "", 1), "sample_id", -1),
        (lambda: raw.commit(slot, 1 << 64, "", 1), "sample_id", 1 << 64),
        (lambda: raw.reserve(-1, 1.0, False), "nbytes", -1),
        (lambda: raw.reserve(1 << 70, 1.0, False), "nbytes", 1 << 70),
    ]
    for call, name, value in calls:
        match = rf"^{name} must be an integer in \[0, 2\*\*64\), not {value}$"
        with pytest.raises(eagle_io.InvalidArgumentError, match=match):
            call()
    for bad in (float("nan"), float("inf")):
        with pytest.raises(eagle_io.InvalidArgumentError, match="timeout_s must be a finite number of seconds"):
            raw.reserve(16, bad, False)
    with pytest.raises(ArgumentTypeError, match="n_tokens must be an int, not str"):
        raw.commit(slot, 1, "", "1")
    w2 = eagle_io.ShardWriter(tmp_path / "b", eagle_io.eagle3_schema(32), {}, threads=1)
    for args, name in (((-1, 4), "ring_bytes"), ((1 << 16, -4), "batch")):
        with pytest.raises(eagle_io.InvalidArgumentError, match=f"^{name} must be an integer"):
            _native.CaptureSink(w2._native, *args)
    w2.close()  # the refused constructors left the writer usable
    memoryview(slot)[:] = bytes(265)  # the slot is still reserved: fill and commit it
    raw.commit(slot, 1, "", 1)
    assert sum(x["samples"] for x in sink.close()["shards"]) == 1
