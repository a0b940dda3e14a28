"""Ctrl-C reaches a caller blocked in the native core (issue 33): a producer waiting on a full capture ring, and a
capture sink's close waiting for its writer to drain, each see ``KeyboardInterrupt`` within a second of SIGINT (the
core asks Python's signal handlers every 50 ms of a wait, src/python/blocking.rs), not after the ring's timeout.
The interrupted call changes nothing: the ring and writer go on, a later close commits, and the dataset verifies."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import eagle_io

# A child blocked in `put` on a full ring: two samples committed first, then one slot holding the whole arena.
RESERVE = """
import sys, time, torch, eagle_io
from eagle_io.capturing.ring import RingSink
w = eagle_io.ShardWriter(sys.argv[1], [eagle_io.TensorSpec("x", "uint8")], {}, threads=1)
sink = RingSink(w, ring_bytes=8192, timeout_s=600.0)
for i in (1, 2):
    assert sink.put(i, {"x": torch.full((100,), i, dtype=torch.uint8)})
held = sink._sink.reserve(sink._sink.arena_span()[1], 600.0, False)  # waits for 1 and 2 to drain
try:
    print("blocked", flush=True)
    sink.put(3, {"x": torch.full((100,), 3, dtype=torch.uint8)})
    print("not interrupted", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
assert 3 not in sink._ids and sink.stats()["ring_slots_in_use"] == 1, "the interrupted put reserved nothing"
sink._sink.commit(held, 0, "", 0, cancelled=True)
assert sink.put(4, {"x": torch.full((100,), 4, dtype=torch.uint8)}), "the ring goes on"
sink.close()
print("closed", flush=True)
"""

# A child blocked in `close` while the sink thread still encodes (zstd level 19: several seconds for 16 MiB).
CLOSE = """
import sys, torch, eagle_io
from eagle_io.capturing.ring import RingSink
spec = eagle_io.TensorSpec("x", "bfloat16", 4096)
w = eagle_io.ShardWriter(sys.argv[1], [spec], {}, threads=1, zstd_level=19, shard_bytes=1 << 20)
sink = RingSink(w, ring_bytes=64 << 20, batch=1)
g = torch.Generator().manual_seed(0)
for i in range(4):
    assert sink.put(i, {"x": torch.randn(512, 4096, generator=g).bfloat16()})
try:
    print("blocked", flush=True)
    sink.close()
    print("not interrupted", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
manifest = sink.close(complete=False)  # the second close waits for the rest and commits it
print("closed", sum(s["samples"] for s in manifest["shards"]), manifest["complete"], flush=True)
"""


def _interrupt(script: str, root) -> tuple[float, list[str]]:
    """Runs `script`, sends SIGINT 0.3 s after it says it is blocked; returns the seconds from the signal to its
    "interrupted" line and all its lines."""
    p = subprocess.Popen([sys.executable, "-c", script, str(root)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "blocked\n"
        time.sleep(0.3)
        p.send_signal(signal.SIGINT)
        sent = time.monotonic()
        line = p.stdout.readline()
        latency = time.monotonic() - sent
        rest, _ = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 0, (line, rest)
    return latency, [line.strip(), *rest.splitlines()]


def _verified(root) -> list[int]:
    assert eagle_io.Dataset.verify(root) == []
    ds = eagle_io.Dataset(root)
    return [ds.entry(p).sample_id for p in range(len(ds))]


def test_sigint_reaches_a_producer_blocked_on_a_full_ring(tmp_path):
    latency, lines = _interrupt(RESERVE, tmp_path)
    assert lines == ["interrupted", "closed"]
    assert latency < 1.0, f"KeyboardInterrupt {latency:.2f} s after SIGINT"
    assert _verified(tmp_path) == [1, 2, 4]


def test_sigint_reaches_a_close_waiting_for_the_writer(tmp_path):
    latency, lines = _interrupt(CLOSE, tmp_path)
    assert lines == ["interrupted", "closed 4 False"], "interrupted while the writer encoded; the second close commits"
    assert latency < 1.0, f"KeyboardInterrupt {latency:.2f} s after SIGINT"
    assert _verified(tmp_path) == [0, 1, 2, 3]
