"""Object-storage read benchmark: the same dataset read from a local S3-compatible server (s3s-fs on 127.0.0.1,
tests/helpers/s3server.py) and from local disk in one run: samples/s, MB/s of decoded states, requests per epoch,
and construction time over 100k samples from object storage.

    .venv/bin/python benches/bench_remote.py            # prints, and writes its section of benches/README.md
    .venv/bin/python benches/bench_remote.py --quick    # 10k samples for construction, one repeat

Data: ``benches/realdata.py``'s cached real SmolLM2 states (``.bench-data/states-44.pt``, generated on first use),
copied ``--copies`` times under distinct ids. Both readers are warm (the server's files and the local files are in
the same page cache), so the ratio isolates what object storage adds: HTTP, signing, one ranged GET per record.
Targets (issue 13): requests per epoch <= records + shards x 3; throughput >= 80% of local disk; construction over
100k samples < 2 s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import torch
from benchkit import write_section

import eagle_io
from eagle_io import _native
from eagle_io.store.remote import upload_dataset

HERE = Path(__file__).resolve().parent
WORK = HERE.parent / ".bench-data" / "remote"
sys.path.insert(0, str(HERE.parent / "tests"))
from helpers import s3server  # noqa: E402

STATES = ("aux_hidden_states", "hidden_states")


def write(root: Path, samples: list[dict], copies: int, shard_bytes: int) -> None:
    hidden = samples[0]["hidden_states"].shape[1]
    schema = eagle_io.eagle3_schema(hidden, samples[0]["aux_hidden_states"].shape[1] // hidden)
    with eagle_io.ShardWriter(root, schema, {"target_model": "SmolLM2"}, shard_bytes=shard_bytes) as w:
        for c in range(copies):
            for i, s in enumerate(samples):
                w.write(c * len(samples) + i, {k: s[k] for k in ("input_ids", "loss_mask", *STATES)})


def epoch(ds: eagle_io.Dataset) -> tuple[float, int]:
    """Seconds to read every sample in position order, and the decoded state bytes."""
    t0 = time.perf_counter()
    nbytes = 0
    for pos in range(len(ds)):
        item = ds[pos]
        nbytes += sum(item[k].numel() * item[k].element_size() for k in STATES)
    return time.perf_counter() - t0, nbytes


def best_epoch(ds: eagle_io.Dataset, repeat: int) -> tuple[float, int]:
    runs = [epoch(ds) for _ in range(repeat)]
    return min(r[0] for r in runs), runs[0][1]


def upload(root: Path, bucket: Path) -> str:
    """Uploads the local dataset ``root`` through eagle-io's own write path (multipart, manifest last) unless the
    server holds it already; returns its URL. (Files placed into the server's directory by hand would make s3s-fs
    hash the whole object on every GET: it keeps the ETag only of objects it received.)"""
    url = f"s3://{bucket.name}/{root.name}"
    if not (bucket / root.name / "manifest.json").exists():
        shutil.rmtree(bucket / root.name, ignore_errors=True)
        upload_dataset(root, url)
    return url


def construction(bucket: Path, n: int) -> dict:
    root = WORK / "local" / f"tiny-{n}"
    if not (root / "manifest.json").exists():
        shutil.rmtree(root, ignore_errors=True)
        schema = eagle_io.eagle3_schema(8, 3)
        with eagle_io.ShardWriter(root, schema, {}, shard_bytes=4 << 20) as w:
            z = {"input_ids": torch.zeros(1, dtype=torch.int64), "loss_mask": torch.ones(1, dtype=torch.uint8),
                 "aux_hidden_states": torch.zeros(1, 24, dtype=torch.bfloat16),
                 "hidden_states": torch.zeros(1, 8, dtype=torch.bfloat16)}  # fmt: skip
            for i in range(n):
                w.write(i, z)
    url = upload(root, bucket)
    before = _native.storage_stats()["requests"]
    t0 = time.perf_counter()
    ds = eagle_io.Dataset(url)
    seconds = time.perf_counter() - t0
    return {"n": len(ds), "shards": len(ds.manifest["shards"]), "seconds": seconds,
            "requests": _native.storage_stats()["requests"] - before}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=44, help="real conversations (realdata.py's cache states-N.pt)")
    ap.add_argument("--copies", type=int, default=4, help="store each real sample this many times")
    ap.add_argument("--shard-bytes", type=int, default=16 << 20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="10k samples for construction, one repeat")
    args = ap.parse_args()
    if s3server.available():
        sys.exit(s3server.available())
    sys.path.insert(0, str(HERE))
    from realdata import load_states

    samples, desc = load_states(args.n)
    repeat = 1 if args.quick else args.repeat
    WORK.mkdir(parents=True, exist_ok=True)
    server = s3server.S3Server(WORK / "s3root")
    os.environ.update(server.env())
    try:
        bucket = server.root / "bench"
        bucket.mkdir(exist_ok=True)
        root = WORK / "local" / f"real-{args.n}x{args.copies}"
        if not (root / "manifest.json").exists():
            shutil.rmtree(root, ignore_errors=True)
            write(root, samples, args.copies, args.shard_bytes)
        url = upload(root, bucket)
        local = eagle_io.Dataset(root, threads=1)
        t_local, nbytes = best_epoch(local, repeat)
        s0 = _native.storage_stats()["requests"]
        t0 = time.perf_counter()
        remote = eagle_io.Dataset(url, threads=1)
        t_open = time.perf_counter() - t0
        s1 = _native.storage_stats()["requests"]
        t_remote, _ = best_epoch(remote, repeat)
        per_epoch = (_native.storage_stats()["requests"] - s1) // repeat
        records, shards = len(remote), len(remote.manifest["shards"])
        built = construction(bucket, 10_000 if args.quick else 100_000)
    finally:
        server.stop()
    mb = nbytes / 1e6
    ratio = t_local / t_remote
    lines = [
        f"Data: {desc}; stored {args.copies}x = {records} records in {shards} shards of <= {args.shard_bytes >> 20} "
        f"MiB, {mb:.1f} MB of decoded states per epoch. Server: s3s-fs 0.14.0 on 127.0.0.1; one reader thread, "
        f"samples read in position order, best of {repeat} epochs; 2 shared cores.",
        "",
        "| source | samples/s | MB/s of states | requests per epoch |",
        "| --- | --- | --- | --- |",
        f"| local disk | {records / t_local:.0f} | {mb / t_local:.0f} | (no requests) |",
        f"| object store (loopback) | {records / t_remote:.0f} | {mb / t_remote:.0f} | {per_epoch} "
        f"+ {s1 - s0} to open |",
        "",
        f"- throughput: object store / local disk = {ratio:.2f} "
        f"(target >= 0.80: {'met' if ratio >= 0.8 else 'NOT met'}).",
        f"- requests: {per_epoch} per epoch + {s1 - s0} at open = {per_epoch + s1 - s0} <= records + shards x 3 = "
        f"{records + 3 * shards}: {'met' if per_epoch + s1 - s0 <= records + 3 * shards else 'NOT met'}.",
        f"- open over object storage: {t_open:.3f} s for {records} records.",
        f"- construction over {built['n']:,} samples from object storage: {built['seconds']:.3f} s, "
        f"{built['requests']} requests for {built['shards']} shards (target < 2 s: "
        f"{'met' if built['seconds'] < 2 else 'NOT met'}).",
    ]
    body = "\n".join(lines) + "\n"
    print(body)
    cmd = "`.venv/bin/python benches/bench_remote.py" + (" --quick`" if args.quick else "`")
    heading = "## Object storage: reads from a local S3 server vs local disk (bench_remote.py)"
    write_section("bench_remote", heading, f"Command: {cmd}\n\n{body}")


if __name__ == "__main__":
    main()
