"""Jobs the fork server runs in a child process. Each takes JSON-able keyword arguments and
returns a JSON-able result; they are imported by the server before it forks, so a child starts
writing at once (no import time between the fork and the first byte written)."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import torch

import eagle_io

HIDDEN = 16
METADATA = {"target_model": "crash-test", "aux_layer_ids": [1, 2, 3]}


LONG_TOKENS = 400


def n_tokens(sample_id: int, long_from: int | None = None) -> int:
    """Token count of sample ``sample_id``: 0 for every 17th, else 1..29; ``LONG_TOKENS`` from
    ``long_from`` on."""
    if long_from is not None and sample_id >= long_from:
        return LONG_TOKENS
    return 0 if sample_id % 17 == 5 else 1 + (sample_id * 37) % 29


def sample(sample_id: int, hidden: int = HIDDEN, long_from: int | None = None) -> dict[str, torch.Tensor]:
    """Deterministic EAGLE-3-schema sample, seeded by its id (so a reader can recompute it)."""
    n = n_tokens(sample_id, long_from)
    rng = np.random.default_rng(sample_id)
    states = (rng.standard_normal((n, 4 * hidden)) * 2).astype(np.float32)
    bf16 = torch.from_numpy(states).to(torch.bfloat16)
    return {
        "input_ids": torch.from_numpy(rng.integers(0, 50_000, n, dtype=np.int64)),
        "loss_mask": torch.from_numpy((rng.random(n) > 0.3).astype(np.uint8)),
        "aux_hidden_states": bf16[:, : 3 * hidden].contiguous(),
        "hidden_states": bf16[:, 3 * hidden :].contiguous(),
    }


def write_dataset(
    root: str,
    n: int,
    shard_bytes: int,
    *,
    resume: bool = False,
    hidden: int = HIDDEN,
    threads: int = 1,
    rank: int = 0,
    world_size: int = 1,
    batch: int = 1,
    metadata: dict | None = None,
    ids: list[int] | None = None,
    long_from: int | None = None,
    queue_depth: int = 4,
) -> dict[str, Any]:
    """Writes samples ``ids`` (default ``range(n)``) that the dataset does not hold yet, in order,
    ``batch`` at a time, then closes. Returns what the writer found on open and what it wrote.

    An error propagates; before it does, ``after_error`` records what a further ``write`` and
    ``close`` raise and whether a resuming writer can take the root in the same process."""
    w = eagle_io.ShardWriter(
        root,
        eagle_io.eagle3_schema(hidden),
        METADATA if metadata is None else metadata,
        shard_bytes=shard_bytes,
        chunk_bytes=4096,
        threads=threads,
        queue_depth=queue_depth,
        rank=rank,
        world_size=world_size,
        resume=resume,
    )
    found = w.sample_ids()
    opened = w.stats()
    todo = [i for i in (range(n) if ids is None else ids) if i not in w]
    try:
        for k in range(0, len(todo), batch):
            w.write_batch([(i, sample(i, hidden, long_from), f"conv-{i}") for i in todo[k : k + batch]])
        manifest = w.close()
    except eagle_io.EagleIOError as e:
        e.after_error = _after_error(w, root, hidden, metadata, rank, world_size)
        raise
    return {
        "found": found,
        "written": todo,
        "removed_temp_files": opened["removed_temp_files"],
        "adopted_shards": opened["adopted_shards"],
        "shards": len(manifest["shards"]),
    }


def _after_error(w: eagle_io.ShardWriter, root: str, hidden: int, metadata, rank: int, world: int) -> dict:
    out: dict[str, Any] = {}
    for what, call in (("write", lambda: w.write(10**9, sample(0, hidden))), ("close", w.close)):
        try:
            call()
            out[what] = None
        except eagle_io.EagleIOError as e:
            out[what] = _describe(e)
    try:  # the failed writer object is still alive here, as in a caller that caught the error
        again = eagle_io.ShardWriter(
            root, eagle_io.eagle3_schema(hidden), METADATA if metadata is None else metadata,
            rank=rank, world_size=world, resume=True, threads=1,
        )  # fmt: skip
        again.close()
        out["resume_in_process"] = None
    except eagle_io.EagleIOError as e:
        out["resume_in_process"] = f"{type(e).__name__}: {e}"
    return out


def ring_until_error(root: str, n: int, shard_bytes: int, ring_bytes: int) -> dict[str, Any]:
    """Feeds samples through a capture ring until ``put`` raises (the sink's writer failed);
    returns what ``put`` and ``close`` raised."""
    from eagle_io.capturing.ring import RingSink

    w = eagle_io.ShardWriter(root, eagle_io.eagle3_schema(HIDDEN), METADATA, shard_bytes=shard_bytes, threads=1)
    sink = RingSink(w, ring_bytes=ring_bytes, batch=1, timeout_s=30)
    out: dict[str, Any] = {"put": None, "close": None, "put_ok": 0}
    for i in range(n):
        try:
            sink.put(i, sample(i), key=f"conv-{i}")
            out["put_ok"] += 1
        except eagle_io.EagleIOError as e:
            out["put"] = _describe(e)
            break
        time.sleep(0.002)  # let the sink keep up, so the failure is met by a later put
    try:
        sink.close()
    except eagle_io.EagleIOError as e:
        out["close"] = _describe(e)
    return out


def _describe(e: BaseException) -> dict[str, Any]:
    return {
        "type": type(e).__name__,
        "message": str(e),
        "path": getattr(e, "path", None),
        "errno": getattr(e, "errno", None),
        "storage": isinstance(e, eagle_io.StorageError),
    }


def generate(argv: list[str]) -> dict[str, Any]:
    """``eagle-io generate ARGV`` as the console script runs it (same entry point, one torch thread)."""
    torch.set_num_threads(1)
    from eagle_io.cli import main

    return {"rc": main(["generate", *argv])}


def ring_push(root: str, ring_bytes: int, total_bytes: int, sample_tokens: int, hidden: int) -> dict[str, Any]:
    """Pushes ``total_bytes`` of samples through a capture ring of ``ring_bytes`` and reports the
    growth of peak RSS (ru_maxrss) over the baseline taken after every input tensor exists."""
    import resource

    from eagle_io.capturing.ring import RingSink

    g = torch.Generator().manual_seed(0)
    s = {
        "input_ids": torch.randint(0, 50_000, (sample_tokens,), generator=g),
        "loss_mask": torch.ones(sample_tokens, dtype=torch.uint8),
        "aux_hidden_states": torch.randn(sample_tokens, 3 * hidden, generator=g).to(torch.bfloat16),
        "hidden_states": torch.randn(sample_tokens, hidden, generator=g).to(torch.bfloat16),
    }
    per_sample = sum(t.numel() * t.element_size() for t in s.values())
    w = eagle_io.ShardWriter(root, eagle_io.eagle3_schema(hidden), {}, shard_bytes=8 << 20, threads=1, queue_depth=2)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    sink = RingSink(w, ring_bytes=ring_bytes, batch=2, timeout_s=120)
    n = total_bytes // per_sample
    t0 = time.perf_counter()
    for i in range(n):
        assert sink.put(i, s)
    stats = sink.stats()
    manifest = sink.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    # The instrument itself: 64 MiB touched now must show in ru_maxrss (else the bound proves nothing).
    control = bytearray(64 << 20)
    control[::4096] = b"x" * len(control[::4096])
    control_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    del control
    return {
        "control_growth_bytes": control_peak - peak,
        "baseline_bytes": base,
        "peak_bytes": peak,
        "per_sample_bytes": per_sample,
        "samples": n,
        "pushed_bytes": n * per_sample,
        "stall_seconds": stats["producer_stall_seconds"],
        "high_water_bytes": stats["ring_high_water_bytes"],
        "ring_capacity": stats["ring_capacity"],
        "stored_samples": sum(x["samples"] for x in manifest["shards"]),
        "seconds": time.perf_counter() - t0,
        "pid": os.getpid(),
    }


def build_tiny_model(out: str) -> dict[str, Any]:
    """Builds the tiny model directory (see :mod:`helpers.tiny_model`)."""
    from helpers.tiny_model import build_tiny_model_dir

    torch.set_num_threads(1)
    return {"path": str(build_tiny_model_dir(out))}


def merge_cli(argv: list[str]) -> dict[str, Any]:
    """``eagle-io merge ARGV`` (its output goes to the job's log)."""
    from eagle_io.cli import merge_cmd

    rc = merge_cmd.main(argv)
    return {"rc": rc}


def capture_submit(root: str, samples: list[dict], max_length: int | None = None) -> dict[str, Any]:
    """``eagle_io.capture`` on a tiny random Llama (vocabulary 64): submits each sample
    ``{"index", "tokens", "offset", "mask_tokens"}`` in its own batch; returns, per sample, None
    or the error it raised (type, message, sample_id), and the ids stored."""
    from types import SimpleNamespace

    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=8, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip
    info = {"model_id": "tiny", "num_layers": 8, "hidden_size": 32, "vocab_size": 64}
    model = LlamaForCausalLM(cfg).eval()
    out: dict[str, Any] = {"errors": []}
    with eagle_io.capture(model, root, target_info=info, threads=1, max_length=max_length, ring_bytes=1 << 20) as cap:
        for s in samples:
            n = s["tokens"]
            item = SimpleNamespace(
                index=s["index"],
                id=f"c{s['index']}",
                input_ids=torch.arange(n) % 64 + s.get("offset", 0),
                loss_mask=torch.ones(s.get("mask_tokens", n), dtype=torch.long),
            )
            try:
                cap.submit([item])
                out["errors"].append(None)
            except Exception as e:
                out["errors"].append(
                    {"type": type(e).__name__, "message": str(e), "sample_id": getattr(e, "sample_id", None)}
                )
    ds = eagle_io.Dataset(root)
    out["stored"] = [ds.entry(p).sample_id for p in range(len(ds))]
    out["max_length"] = ds.metadata["max_length"]
    return out
