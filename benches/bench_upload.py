"""Object-storage write benchmark: the same real states captured into a local directory and into an ``s3://`` prefix
of a local S3-compatible server (s3s-fs on 127.0.0.1, tests/helpers/s3server.py) in one run, each shard uploaded as
it commits (eagle_io.store.upload): samples/s and MB/s of states through the capture core, the ratio, the time the
capture waited on a full staging, and the requests sent.

    .venv/bin/python benches/bench_upload.py            # prints, and writes its section of benches/README.md
    .venv/bin/python benches/bench_upload.py --quick    # one repeat

Data: ``benches/realdata.py``'s cached real SmolLM2 states (``.bench-data/states-44.pt``, generated on first use),
put ``--copies`` times under distinct ids through ``SampleStore.put`` (value checks, ring, writer), as a capture does.
"""

from __future__ import annotations

import argparse
import shutil
import time
import uuid
from pathlib import Path

from benchkit import object_store_args, object_store_setup, write_section

from eagle_io import _native
from eagle_io.capturing.options import CaptureOptions
from eagle_io.capturing.store import SampleStore

HERE = Path(__file__).resolve().parent
WORK = HERE.parent / ".bench-data" / "upload"

STATES = ("aux_hidden_states", "hidden_states")
# SmolLM2-135M: 30 layers (SGLang's default aux layers [2, N//2, N-3]), hidden 576, vocab 49152.
INFO = {"num_layers": 30, "hidden_size": 576, "vocab_size": 49152, "model_id": "SmolLM2-135M-Instruct"}


def capture(out: str, samples: list[dict], copies: int, shard_bytes: int, staging: Path | None) -> dict:
    """Seconds from open to close (the last upload included) and the store's upload report."""
    writer = {"shard_bytes": shard_bytes, **({"staging": staging} if staging is not None else {})}
    t0 = time.perf_counter()
    store = SampleStore.create(out, CaptureOptions(target_info=INFO, writer_options=writer), aux_layer_ids=[2, 15, 27])
    for c in range(copies):
        for i, s in enumerate(samples):
            store.put(c * len(samples) + i, s["input_ids"], s["loss_mask"], s["aux_hidden_states"], s["hidden_states"])
    manifest = store.close()
    return {"seconds": time.perf_counter() - t0, "upload": store.upload_report, "manifest": manifest}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    object_store_args(ap, "put each real sample this many times", "one repeat")
    ap.add_argument("--shard-bytes", type=int, default=8 << 20)
    args = ap.parse_args()
    shutil.rmtree(WORK, ignore_errors=True)
    samples, desc, repeat, server = object_store_setup(args, WORK)
    local, remote = [], []
    try:
        for r in range(repeat):  # interleaved, so both see the same machine load
            local.append(capture(str(WORK / f"local-{r}"), samples, args.copies, args.shard_bytes, None))
            bucket = f"b{uuid.uuid4().hex[:12]}"
            server.bucket(bucket)
            s0 = _native.storage_stats()["requests"]
            got = capture(f"s3://{bucket}/run", samples, args.copies, args.shard_bytes, WORK / f"stage-{r}")
            got["requests"] = _native.storage_stats()["requests"] - s0
            remote.append(got)
    finally:
        server.stop()
        shutil.rmtree(WORK, ignore_errors=True)
    best_local = min(local, key=lambda x: x["seconds"])
    best_remote = min(remote, key=lambda x: x["seconds"])
    shards = best_remote["manifest"]["shards"]
    records = sum(s["samples"] for s in shards)
    raw = sum(s["raw_bytes"] for s in shards) / 1e6
    stored = sum(s["bytes"] for s in shards) / 1e6
    ratio = best_local["seconds"] / best_remote["seconds"]
    up = best_remote["upload"]
    lines = [
        f"Data: {desc}; put {args.copies}x = {records} samples, {raw:.1f} MB raw ({stored:.1f} MB stored) in "
        f"{len(shards)} shards of <= {args.shard_bytes >> 20} MiB. Server: s3s-fs 0.14.0 on 127.0.0.1; best of "
        f"{repeat} runs each, interleaved; 2 shared cores.",
        "",
        "| capture into | samples/s | MB/s of states (raw) | seconds, open to close |",
        "| --- | --- | --- | --- |",
        f"| local directory | {records / best_local['seconds']:.0f} | {raw / best_local['seconds']:.0f} | "
        f"{best_local['seconds']:.2f} |",
        f"| s3:// prefix, each shard uploaded as it commits | {records / best_remote['seconds']:.0f} | "
        f"{raw / best_remote['seconds']:.0f} | {best_remote['seconds']:.2f} |",
        "",
        f"- throughput: s3:// / local = {ratio:.2f}; the capture waited {up['blocked_seconds']:.2f} s on a full "
        f"staging (default bound {_native.DEFAULTS['staging_bytes'] >> 30} GiB).",
        f"- uploads: {len(up['uploaded'])} shards, {up['bytes'] / 1e6:.1f} MB; {best_remote['requests']} requests "
        "(per shard: multipart create, part(s), complete; then the remote manifest's GET and conditional PUT).",
        "- a ratio above 1 is not uploads being free: both captures fsync each committed shard into the same disk, "
        "but the s3:// one then uploads it to a server that does not fsync and deletes its staged copy, so less "
        "stays to write back (not separated in this run); on loopback, uploading each shard as it commits costs "
        "the capture nothing measurable.",
    ]
    body = "\n".join(lines) + "\n"
    print(body)
    cmd = "`.venv/bin/python benches/bench_upload.py" + (" --quick`" if args.quick else "`")
    heading = "## Object storage: a capture uploading each shard as it commits vs a local capture (bench_upload.py)"
    write_section("bench_upload", heading, f"Command: {cmd}\n\n{body}")


if __name__ == "__main__":
    main()
