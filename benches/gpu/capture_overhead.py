"""Capture overhead at production width: a random-initialised Llama-architecture target (hidden 7,168, 3 aux layers
-> 21,504-wide rows, bf16) runs prefill batches with and without eagle-io's capture through the pinned CUDA ring.

Phases (each timed with CUDA events / wall clock, one JSON object out):

* ``forward``: the base model's forward alone, ``--batches`` batches of ``--batch x --seq-len`` tokens.
* ``capture``: the same batches through ``eagle_io.capture`` (forward hooks, one device sync per forward for the
  NaN/Inf policy, side-stream device-to-host copies into the pinned ring, event-completed commits), with a ring
  large enough not to fill: ``overhead`` = capture time per batch / forward time per batch - 1 (target < 2%).
* ``sustained``: the capture again until ``--sustain-s`` seconds, then close (drain + commit): tokens/s and GB/s
  of bf16 states into committed shards with ``--threads`` encode threads, ring high-water, producer stall.
  Then ``Dataset.verify`` over everything written.
* ``fp8_capture`` and ``fp8_sustained``: the same two phases with ``precision="fp8"`` (``--fp8-sustain-s``; 0 skips
  both): the ring quantises the states on the GPU before the copy (``eagle_io.store.fp8.quantize_rows``: about half
  the bytes cross PCIe, ``fp8_committed_bytes_vs_bf16``) and the writer stores them as given.

Usage (on the lent GPU machine, from the repository root with the built extension importable)::

    python benches/gpu/capture_overhead.py --out "$OUT"            # ~5 minutes on one H200, 16 cores
    python benches/gpu/capture_overhead.py --smoke --out /tmp/x    # tiny widths on CPU: the script still works

Writes ``capture_overhead.json`` in ``--out`` and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for the dataset and capture_overhead.json")
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--layers", type=int, default=8, help="decoder layers (aux ids: SGLang's default [2, N//2, N-3])")
    p.add_argument("--heads", type=int, default=56)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--intermediate", type=int, default=18432)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch", type=int, default=4, help="samples per prefill forward")
    p.add_argument("--seq-len", type=int, default=2048, help="tokens per sample")
    p.add_argument("--batches", type=int, default=12, help="timed batches per phase")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="encode threads")
    p.add_argument("--ring-gib", type=float, default=16.0, help="capture ring size in the overhead phase")
    p.add_argument("--sustain-s", type=float, default=60.0, help="length of the sustained phase")
    p.add_argument("--fp8-sustain-s", type=float, default=30.0, help="length of the FP8 sustained phase (0: no FP8)")
    p.add_argument("--smoke", action="store_true", help="tiny widths on whatever device: checks the script runs")
    args = p.parse_args(argv)
    if args.smoke:
        args.hidden, args.layers, args.heads, args.kv_heads, args.intermediate, args.vocab = 64, 8, 4, 2, 128, 256
        args.batch, args.seq_len, args.batches, args.warmup, args.ring_gib, args.sustain_s = 2, 32, 3, 1, 0.0625, 0.5
        args.fp8_sustain_s = min(args.fp8_sustain_s, 0.5)
    return args


def build_target(args: argparse.Namespace, device: torch.device):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        intermediate_size=args.intermediate,
        vocab_size=args.vocab,
        max_position_embeddings=max(4096, args.seq_len),
    )
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    info = {"model_id": "random-llama", "architecture": "LlamaForCausalLM", "num_layers": args.layers,
            "hidden_size": args.hidden, "vocab_size": args.vocab}  # fmt: skip
    return model, info


def batches(args: argparse.Namespace, start: int):
    """Endless batches of ``--batch`` samples, ids from ``start`` on, each ``--seq-len`` random tokens."""
    g = torch.Generator().manual_seed(start)
    i = start
    while True:
        out = []
        for _ in range(args.batch):
            ids = torch.randint(0, args.vocab, (args.seq_len,), generator=g)
            out.append(SimpleNamespace(index=i, id=f"s{i}", input_ids=ids, loss_mask=torch.ones_like(ids)))
            i += 1
        yield out


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_forward(model, args, device) -> float:
    """Seconds per batch of the base model's forward alone (the capture's hooks also run the base model)."""
    it = batches(args, 0)
    with torch.no_grad():
        for n in range(args.warmup + args.batches):
            if n == args.warmup:
                sync(device)
                t0 = time.perf_counter()
            ids = torch.stack([s.input_ids for s in next(it)]).to(device)
            model.model(input_ids=ids)
        sync(device)
    return (time.perf_counter() - t0) / args.batches


def time_capture(
    model, info, args, device, out: Path, *, ring_bytes: int, seconds: float | None, precision: str | None = None
) -> dict:
    """Captures batches (``--batches`` after warm-up, or for ``seconds``); returns timings and the stats."""
    import eagle_io

    it = batches(args, 1 << 20 if seconds is None else 1 << 30)
    cap = eagle_io.capture(
        model, out, target_info=info, threads=args.threads, ring_bytes=ring_bytes, precision=precision
    )
    n_batches, t0 = 0, None
    with cap:
        for n in range(10**9):
            if n == args.warmup:
                sync(device)
                t0 = time.perf_counter()
            cap.submit(next(it))
            if n >= args.warmup:
                n_batches += 1
                if seconds is None and n_batches == args.batches:
                    break
                if seconds is not None and time.perf_counter() - t0 >= seconds:
                    break
        sync(device)
        submit_s = time.perf_counter() - t0
    closed_s = time.perf_counter() - t0  # includes draining the ring and committing the last shard
    stats = cap.stats()
    return {"batches": n_batches, "submit_seconds": submit_s, "closed_seconds": closed_s, "stats": stats}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import eagle_io

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not args.smoke:
        print("capture_overhead: needs a CUDA device (or --smoke)", file=sys.stderr)
        return 3
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model, info = build_target(args, device)
    tokens_per_batch = args.batch * args.seq_len
    row_bytes = (3 + 1) * args.hidden * 2
    forward_s = time_forward(model, args, device)
    small = time_capture(model, info, args, device, out / "overhead", ring_bytes=int(args.ring_gib * 2**30),
                         seconds=None)  # fmt: skip
    per_batch = small["submit_seconds"] / small["batches"]
    sustained = time_capture(model, info, args, device, out / "sustained", ring_bytes=eagle_io.defaults.RING_BYTES,
                             seconds=args.sustain_s)  # fmt: skip
    fp8_small = fp8_sustained = None
    if args.fp8_sustain_s > 0:
        fp8_small = time_capture(model, info, args, device, out / "fp8_overhead", ring_bytes=int(args.ring_gib * 2**30),
                                 seconds=None, precision="fp8")  # fmt: skip
        fp8_sustained = time_capture(model, info, args, device, out / "fp8_sustained",
                                     ring_bytes=eagle_io.defaults.RING_BYTES, seconds=args.fp8_sustain_s,
                                     precision="fp8")  # fmt: skip
    bad = eagle_io.Dataset.verify(out / "sustained") + eagle_io.Dataset.verify(out / "overhead")
    if fp8_small is not None:
        bad += eagle_io.Dataset.verify(out / "fp8_sustained") + eagle_io.Dataset.verify(out / "fp8_overhead")
    s = sustained["stats"]
    tokens = sustained["batches"] * tokens_per_batch
    result = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "cpu_cores": os.cpu_count(),
        "threads": args.threads,
        "width": {"hidden": args.hidden, "aux_row": 3 * args.hidden, "bytes_per_token": row_bytes},
        "tokens_per_batch": tokens_per_batch,
        "forward_seconds_per_batch": forward_s,
        "capture_seconds_per_batch": per_batch,
        "overhead": per_batch / forward_s - 1,
        "overhead_ring_pinned": small["stats"]["ring_pinned"],
        "overhead_producer_stall_seconds": small["stats"]["producer_stall_seconds"],
        "forward_tokens_per_second": tokens_per_batch / forward_s,
        "sustained_tokens_per_second": tokens / sustained["closed_seconds"],
        "sustained_gb_per_second": tokens * row_bytes / sustained["closed_seconds"] / 1e9,
        "sustained_submit_tokens_per_second": tokens / sustained["submit_seconds"],
        "sustained_ring_capacity": s["ring_capacity"],
        "sustained_ring_high_water_bytes": s["ring_high_water_bytes"],
        "sustained_producer_stall_seconds": s["producer_stall_seconds"],
        "sustained_ratio": s["raw_bytes"] / max(1, s["stored_bytes"]),
        "samples_written": small["stats"]["written"] + s["written"],
        "verify_bad_records": len(bad),
    }
    if fp8_small is not None:
        f, fs = fp8_small["stats"], fp8_sustained["stats"]
        fp8_per_batch = fp8_small["submit_seconds"] / fp8_small["batches"]
        fp8_tokens = fp8_sustained["batches"] * tokens_per_batch
        result.update({
            "fp8_capture_seconds_per_batch": fp8_per_batch,
            "fp8_overhead": fp8_per_batch / forward_s - 1,
            "fp8_quantized_before_copy": f["fp8_quantized_before_copy"] + fs["fp8_quantized_before_copy"],
            "fp8_committed_bytes_vs_bf16": (f["committed_bytes"] / max(1, f["written"]))
            / (small["stats"]["committed_bytes"] / max(1, small["stats"]["written"])),
            "fp8_sustained_tokens_per_second": fp8_tokens / fp8_sustained["closed_seconds"],
            "fp8_sustained_submit_tokens_per_second": fp8_tokens / fp8_sustained["submit_seconds"],
            "fp8_sustained_producer_stall_seconds": fs["producer_stall_seconds"],
            "fp8_sustained_ratio_vs_bf16": fs["raw_bytes"] / max(1, fs["stored_bytes"]),
            "fp8_values": f["fp8_values"] + fs["fp8_values"],
            "fp8_clamped": f["fp8_clamped"] + fs["fp8_clamped"],
            "fp8_samples_written": f["written"] + fs["written"],
        })  # fmt: skip
    (out / "capture_overhead.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
