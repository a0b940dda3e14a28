"""Object-storage read benchmark: the same dataset read from a local S3-compatible server (s3s-fs on 127.0.0.1,
tests/helpers/s3server.py) and from local disk in one run: samples/s, MB/s of decoded states, requests per epoch,
and construction time over 100k samples from object storage. Reads one sample at a time (``ds[pos]``: one GET
each) and in batches (``read_batch``, the ``ShardDataset.read_many`` / DataLoader path: adjacent records coalesced,
``in_flight`` GETs at once), in position order and shuffled; and the server's own ceiling (N ``curl`` ranged GETs
in flight, no eagle-io). When ``nginx`` is installed (``apt-get install nginx-light``; the bench alone uses it), the
batched reads are repeated against nginx serving the same object files over HTTP (the GET/HEAD-with-Range subset of
S3 that reads use; sendfile): a server that is not the wall, so that row measures eagle-io's reader itself.

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
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from benchkit import object_store_args, object_store_setup, write_section

import eagle_io
from eagle_io import _native, defaults
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


def batch_epoch(ds: eagle_io.Dataset, order: list[int], batch: int) -> tuple[float, int]:
    """Seconds to read every sample by ``read_batch`` in batches of ``batch`` positions of ``order``."""
    t0 = time.perf_counter()
    nbytes = 0
    for b in range(0, len(order), batch):
        items = []
        for pos in order[b : b + batch]:
            n = ds.entry(pos).n_tokens
            out = {s.name: torch.empty((n,) if s.width is None else (n, s.width), dtype=getattr(torch, s.dtype))
                   for s in ds.schema}  # fmt: skip
            items.append((pos, out))
        ds.read_batch(items)
        nbytes += sum(out[k].numel() * out[k].element_size() for _, out in items for k in STATES)
    return time.perf_counter() - t0, nbytes


def best_epoch(ds: eagle_io.Dataset, repeat: int, order: list[int] | None = None, batch: int = 0) -> tuple[float, int]:
    runs = [batch_epoch(ds, order, batch) if batch else epoch(ds) for _ in range(repeat)]
    return min(r[0] for r in runs), runs[0][1]


def curl_ceiling(root: Path, bucket: str, key: str, size: int, in_flight: int, span: int) -> float:
    """MB/s of the server alone: ``in_flight`` curl processes each GETting its own ``span``-byte range of one
    object at once (a second s3s-fs over the same directory, started without auth so curl needs no signing)."""
    port = s3server.free_port()
    proc = subprocess.Popen([str(s3server.BINARY), "--host", "127.0.0.1", "--port", str(port), str(root)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        s3server.wait_listening(port, proc)
        starts = [(i * span) % max(size - span, 1) for i in range(in_flight)]
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            curls = [subprocess.Popen(["curl", "-s", "-o", "/dev/null", "-H", f"Range: bytes={a}-{a + span - 1}",
                                       f"http://127.0.0.1:{port}/{bucket}/{key}"]) for a in starts]  # fmt: skip
            for c in curls:
                c.wait()
            best = min(best, time.perf_counter() - t0)
        return in_flight * span / 1e6 / best
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds used so far by the processes ``pids`` (``/proc/PID/stat``)."""
    ticks = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def pin_threads(nginx_pids: list[int]) -> None:
    """The decode thread(s) (``eagle-io-read-*``) alone on CPU 0; every other thread of this process (the storage
    runtime's receivers, Python's) and nginx on CPU 1: does the HTTP side fit in one core?"""
    for tid in os.listdir("/proc/self/task"):
        comm = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
        os.sched_setaffinity(int(tid), {0} if comm.startswith("eagle-io-read") else {1})
    for pid in nginx_pids:
        os.sched_setaffinity(pid, {1})


def nginx_rows(served: Path, url: str, local: eagle_io.Dataset, orders: dict, repeat: int, batch: int,
               pin: bool = False):  # fmt: skip
    """The default batched reads against nginx serving ``served`` (the s3s-fs directory, whose files are the
    objects) on 127.0.0.1. Returns ``(rows, cpu)``: rows ``(label, local seconds, remote seconds, requests per
    epoch)``, and per order the CPU seconds per epoch of this process reading locally, of this process reading
    remotely and of nginx serving it; ``([], {})`` without nginx. ``pin``: :func:`pin_threads` before each read
    (after a warm-up batch, so that the threads exist)."""
    if shutil.which("nginx") is None:
        return [], {}
    port = s3server.free_port()
    conf = WORK / "nginx.conf"
    conf.write_text(
        f"worker_processes 1; pid {WORK}/nginx.pid; error_log {WORK}/nginx-error.log; daemon off;\n"
        "events { worker_connections 256; }\n"
        f"http {{ access_log off; sendfile on; server {{ listen 127.0.0.1:{port}; root {served}; }} }}\n"
    )
    proc = subprocess.Popen(["nginx", "-c", str(conf), "-p", str(WORK)], stderr=subprocess.DEVNULL)
    endpoint = os.environ["AWS_ENDPOINT"]
    try:
        s3server.wait_listening(port, proc)
        workers = [int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True,
                                                  check=True).stdout.split()]  # fmt: skip
        os.environ["AWS_ENDPOINT"] = f"http://127.0.0.1:{port}"  # a new client: one is kept per endpoint
        rows, cpu = [], {}
        for label, order in orders.items():
            if pin:
                batch_epoch(local, order[:batch], batch)
                pin_threads([proc.pid, *workers])
            c0 = time.process_time()
            t_l, _ = best_epoch(local, repeat, order, batch)
            c1, n1 = time.process_time(), cpu_seconds(workers)
            ds = eagle_io.Dataset(url, threads=1)
            if pin:
                batch_epoch(ds, order[:batch], batch)
                pin_threads([proc.pid, *workers])
            r0 = _native.storage_stats()["requests"]
            c2 = time.process_time()
            t_r, _ = best_epoch(ds, repeat, order, batch)
            c3, n3 = time.process_time(), cpu_seconds(workers)
            rows.append((f"nginx: batches of {batch}, {label}, in_flight={defaults.REMOTE_IN_FLIGHT}", t_l, t_r,
                         (_native.storage_stats()["requests"] - r0) // repeat))  # fmt: skip
            cpu[label] = ((c1 - c0) / repeat, (c3 - c2) / repeat, (n3 - n1) / repeat)
        return rows, cpu
    finally:
        os.environ["AWS_ENDPOINT"] = endpoint
        proc.terminate()
        proc.wait(timeout=10)


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
    object_store_args(ap, "store each real sample this many times", "10k samples for construction, one repeat")
    ap.add_argument("--shard-bytes", type=int, default=16 << 20)
    ap.add_argument("--batch", type=int, default=16, help="samples per read_batch")
    ap.add_argument("--nginx-only", action="store_true", help="only the nginx rows, printed (README untouched)")
    ap.add_argument("--pin", action="store_true", help="with --nginx-only: decode thread on CPU 0, the rest on CPU 1")
    args = ap.parse_args()
    samples, desc, repeat, server = object_store_setup(args, WORK)
    try:
        bucket = server.root / "bench"
        bucket.mkdir(exist_ok=True)
        root = WORK / "local" / f"real-{args.n}x{args.copies}"
        if not (root / "manifest.json").exists():
            shutil.rmtree(root, ignore_errors=True)
            write(root, samples, args.copies, args.shard_bytes)
        url = upload(root, bucket)
        local = eagle_io.Dataset(root, threads=1)
        if args.nginx_only:
            shuffled = list(range(len(local)))
            random.Random(0).shuffle(shuffled)  # the order of the full run's rows
            orders = {"position order": list(range(len(local))), "shuffled": shuffled}
            fast, fast_cpu = nginx_rows(server.root, url, local, orders, repeat, args.batch, args.pin)
            for (label, t_l, t_r, _), (c_l, c_r, c_n) in zip(fast, fast_cpu.values(), strict=True):
                print(
                    f"{label}: local {len(local) / t_l:.0f} samples/s, remote {len(local) / t_r:.0f} samples/s, "
                    f"ratio {t_l / t_r:.2f}; CPU-s per epoch local {c_l:.2f}, remote {c_r:.2f} + nginx {c_n:.2f}"
                )
            return
        t_local, nbytes = best_epoch(local, repeat)
        s0 = _native.storage_stats()["requests"]
        t0 = time.perf_counter()
        remote = eagle_io.Dataset(url, threads=1)
        t_open = time.perf_counter() - t0
        s1 = _native.storage_stats()["requests"]
        t_remote, _ = best_epoch(remote, repeat)
        per_epoch = (_native.storage_stats()["requests"] - s1) // repeat
        records, shards = len(remote), len(remote.manifest["shards"])
        shuffled = list(range(records))
        random.Random(0).shuffle(shuffled)
        rows = []  # (label, local seconds, remote seconds, requests per epoch)
        orders = {"position order": list(range(records)), "shuffled": shuffled}
        for label, order in orders.items():
            t_l, _ = best_epoch(local, repeat, order, args.batch)
            for in_flight in (1, 4, defaults.REMOTE_IN_FLIGHT, 16):
                ds = eagle_io.Dataset(url, threads=1, in_flight=in_flight)
                r0 = _native.storage_stats()["requests"]
                t_r, _ = best_epoch(ds, repeat, order, args.batch)
                rows.append((f"batches of {args.batch}, {label}, in_flight={in_flight}", t_l, t_r,
                             (_native.storage_stats()["requests"] - r0) // repeat))  # fmt: skip
        biggest = max(remote.manifest["shards"], key=lambda sh: sh["bytes"])
        record_mb = biggest["bytes"] / biggest["samples"]
        ceiling = [(n, curl_ceiling(server.root, bucket.name, f"{root.name}/{biggest['file']}", biggest["bytes"],
                                    n, int(record_mb))) for n in (1, 4, 8, 16)]  # fmt: skip
        built = construction(bucket, 10_000 if args.quick else 100_000)
        fast, fast_cpu = nginx_rows(server.root, url, local, orders, repeat, args.batch)
    finally:
        server.stop()
    mb = nbytes / 1e6
    ratio = t_local / t_remote
    default_rows = [r for r in rows if r[0].endswith(f"in_flight={defaults.REMOTE_IN_FLIGHT}")]
    lines = [
        f"Data: {desc}; stored {args.copies}x = {records} records in {shards} shards of <= {args.shard_bytes >> 20} "
        f"MiB, {mb:.1f} MB of decoded states per epoch. Server: s3s-fs 0.14.0 (release build) on 127.0.0.1; one "
        f"decode thread per reader, best of {repeat} epochs; 2 shared cores (the server, curl and the reader share "
        f"them).",
        "",
        "| read | local samples/s | object store samples/s | object store MB/s of states | remote / local "
        "| requests per epoch |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| one sample at a time (`ds[pos]`) | {records / t_local:.0f} | {records / t_remote:.0f} | "
        f"{mb / t_remote:.0f} | {ratio:.2f} | {per_epoch} + {s1 - s0} to open |",
    ]
    for label, t_l, t_r, req in rows + fast:
        lines.append(f"| {label} | {records / t_l:.0f} | {records / t_r:.0f} | {mb / t_r:.0f} | {t_l / t_r:.2f} "
                     f"| {req} |")  # fmt: skip
    lines += [
        "",
        f"Server ceiling without eagle-io: N curl processes at once, each a ranged GET of {record_mb / 1e6:.1f} MB "
        "(one average record) of the largest shard, best of 3: "
        + ", ".join(f"N={n}: {v:.0f} MB/s" for n, v in ceiling)
        + ".",
        "",
        f"- throughput, default batch read (in_flight={defaults.REMOTE_IN_FLIGHT}): object store / local disk = "
        + ", ".join(f"{t_l / t_r:.2f} ({label.split(', ')[1]})" for label, t_l, t_r, _ in default_rows)
        + f"; one sample at a time {ratio:.2f} (target >= 0.80)"
        + (
            "; against nginx (the reader itself): "
            + ", ".join(f"{t_l / t_r:.2f} ({lb.split(', ')[1]})" for lb, t_l, t_r, _ in fast)
            if fast
            else "; nginx not installed: the reader alone not measured"
        )
        + ".",
        *(
            f"- CPU per epoch against nginx, {label}: eagle-io reading local disk {c_l:.2f} CPU-s; reading over "
            f"HTTP {c_r:.2f} CPU-s plus nginx {c_n:.2f} CPU-s = {(c_r + c_n) / c_l:.2f}x the local read's CPU "
            f"(so on cores busy with other work the throughput ratio tends to {c_l / (c_r + c_n):.2f}; with a core "
            "free for the HTTP side it is bounded by the decode thread alone)."
            for label, (c_l, c_r, c_n) in fast_cpu.items()
        ),
        f"- requests: one at a time {per_epoch} per epoch + {s1 - s0} at open = {per_epoch + s1 - s0}; batched "
        + ", ".join(f"{req} ({label.split(', ')[1]})" for label, _, _, req in default_rows)
        + f" per epoch; target <= records + shards x 3 = {records + 3 * shards}.",
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
