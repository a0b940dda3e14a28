"""FP8 storage on real states (realdata.py): size vs bf16 and error, per scaling, through the public writer/reader.

Variants (each written with ``ShardWriter`` and read back, dequantised, with ``Dataset``):
- ``bf16``: the lossless codec (the baseline of every ratio);
- ``speculators``: vLLM speculators' FP8 files as stored (1 byte per value + one f32 scale per token, no
  compression), computed from the per-token quantisation below (its bytes are the same);
- ``speculators+zstd-3``: those bytes through python zstandard level 3 (one frame per tensor per sample);
- ``fp8 per-token``: eagle-io FP8, one scale per token (amax / 448), layout 3 (speculators-compatible values);
- ``fp8 block B``: one scale per B channels of each token;
- ``fp8 token x channel``: per-token scales of ``x / s_c`` with ``s_c`` = each channel's RMS over the sample
  (the outlier channels scaled down); its size adds one f32 per channel per sample (what storing ``s_c`` costs).

Error per tensor: relative L2 = ||x' - x|| / ||x||; max relative error per element = max |x' - x| / |x| over the
elements with |x| >= 1e-2 x their row's RMS (smaller ones flush to FP8 zero by design; their share is printed);
clamped = the writer's ``fp8_clamped`` / ``fp8_values``.

    .venv/bin/python benches/bench_fp8.py [-n 44]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent))
from realdata import load_states

import eagle_io
from eagle_io import TensorSpec

TENSORS = ("aux_hidden_states", "hidden_states")


def spec_list(samples, which, dtype, precision, block):
    specs = [TensorSpec("input_ids", "int64"), TensorSpec("loss_mask", "uint8")]
    for name in which:
        w = samples[0][name].shape[1]
        specs.append(TensorSpec(name, dtype, w, precision, block))
    return specs


def write_read(samples, which, root, *, dtype="bfloat16", precision=None, block=None, channel_scale=False):
    """Writes ``which`` tensors of every sample, reads them back; returns stored bytes, stats, errors, times."""
    specs = spec_list(samples, which, dtype, precision, block)
    extra = 0
    prepared, scales = [], []
    for s in samples:
        item = {"input_ids": s["input_ids"], "loss_mask": s["loss_mask"]}
        sc = {}
        for name in which:
            x = s[name]
            if channel_scale:
                c = x.float().pow(2).mean(0).sqrt().clamp_min(1e-30)
                sc[name] = c
                extra += 4 * c.numel()
                x = x.float() / c
            item[name] = x.to(getattr(torch, dtype)).contiguous()
        prepared.append(item)
        scales.append(sc)
    t0 = time.process_time()
    w = eagle_io.ShardWriter(root, specs, {"bench": "fp8"})
    for i in range(0, len(prepared), 8):
        w.write_batch([(j, prepared[j], "") for j in range(i, min(i + 8, len(prepared)))])
    w.close()
    enc = time.process_time() - t0
    stats = w.stats()
    stored = sum(p.stat().st_size for p in Path(root).rglob("*.eio")) + extra
    ds = eagle_io.Dataset(root)
    outs = [{n: torch.empty_like(p[n]) for n in p} for p in prepared]
    t0 = time.process_time()
    for i in range(len(ds)):
        ds.read_into(i, outs[i])
    dec = time.process_time() - t0
    err = {}
    for name in which:
        num = den = 0.0
        maxrel, flushed, big = 0.0, 0, 0
        for s, o, sc in zip(samples, outs, scales, strict=True):
            x = s[name].double()
            y = o[name].double()
            if channel_scale:
                y = y * sc[name].double()
            num += (y - x).pow(2).sum().item()
            den += x.pow(2).sum().item()
            rms = x.pow(2).mean(1, keepdim=True).sqrt()
            sel = x.abs() >= 1e-2 * rms
            big += sel.sum().item()
            flushed += ((y == 0) & (x != 0)).sum().item()
            if sel.any():
                maxrel = max(maxrel, ((y - x).abs() / x.abs())[sel].max().item())
        total = sum(s[name].numel() for s in samples)
        err[name] = (num**0.5 / den**0.5, maxrel, flushed / total)
    return stored, stats, err, enc, dec


def speculators_bytes(samples, which):
    """speculators' per-token FP8 bytes (raw, and zstd-3 per tensor per sample)."""
    raw = z = 0
    cctx = zstandard.ZstdCompressor(level=3)
    for s in samples:
        for name in which:
            x = s[name].float()
            scale = x.abs().amax(1, keepdim=True) / 448.0
            q = (x / torch.where(scale == 0, 1.0, scale)).clamp(-448, 448).to(torch.float8_e4m3fn)
            b = q.view(torch.uint8).numpy().tobytes() + scale.numpy().tobytes()
            raw += len(b)
            z += len(cctx.compress(b))
    return raw, z


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=44)
    ap.add_argument("--blocks", default="128,32", help="per-block scalings to measure (channels per scale)")
    args = ap.parse_args()
    samples, desc = load_states(args.n)
    print(desc)
    print(f"torch threads: {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}")
    variants = [("fp8 per-token", {"precision": "float8_e4m3fn"})]
    variants += [(f"fp8 block {b}", {"precision": "float8_e4m3fn", "block": int(b)}) for b in args.blocks.split(",")]
    variants.append(("fp8 token x channel", {"precision": "float8_e4m3fn", "dtype": "float32", "channel_scale": True}))
    print(
        "| tensors | method | ratio vs raw bf16 | rel L2 | max rel err | flushed to 0 | clamped | enc MB/CPU-s | "
        "dec MB/CPU-s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for which in (("aux_hidden_states",), ("hidden_states",), TENSORS):
        label = "aux + final" if len(which) == 2 else ("aux" if which[0] == "aux_hidden_states" else "final")
        mb = sum(s[n].numel() * 2 for s in samples for n in which) / 1e6
        with tempfile.TemporaryDirectory(prefix="eio-fp8-") as tmp:
            base, _, _, enc, dec = write_read(samples, which, os.path.join(tmp, "bf16"))
            print(
                f"| {label} | bf16 lossless (eagle-io) | {mb / (base / 1e6):.3f} | 0 | 0 | 0 | 0 | "
                f"{mb / enc:.0f} | {mb / dec:.0f} |"
            )
            raw, z = speculators_bytes(samples, which)
            print(f"| {label} | speculators FP8 (raw file bytes) | {mb * 1e6 / raw:.3f} | | | | | | |")
            print(f"| {label} | speculators FP8 + zstd-3 | {mb * 1e6 / z:.3f} | | | | | | |")
            for name, kw in variants:
                stored, stats, err, enc, dec = write_read(
                    samples, which, os.path.join(tmp, name.replace(" ", "_")), **kw
                )
                e = " / ".join(f"{err[n][0] * 100:.2f}%" for n in which)
                m = " / ".join(f"{err[n][1] * 100:.1f}%" for n in which)
                f = " / ".join(f"{err[n][2] * 100:.2f}%" for n in which)
                clamp = stats["fp8_clamped"] / max(stats["fp8_values"], 1)
                print(
                    f"| {label} | {name} | **{mb * 1e6 / stored:.3f}** | {e} | {m} | {f} | {clamp:.2%} | "
                    f"{mb / enc:.0f} | {mb / dec:.0f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
