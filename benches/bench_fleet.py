"""Capture through SGLang's gateway (issue 42): SMG (``smg launch --enable-rl``) in front of capture-only CPU SGLang
workers (the tiny float32 Llama of tests/test_capture_server.py, chunked prefill and the radix cache on), eagle-io's
plugin in each.

1. ``generate`` throughput: ``eagle_io.capture(GATEWAY)`` + ``submit`` of ``--samples`` random prompts of
   ``--prompt-tokens`` tokens (``--concurrency`` per worker), through a gateway over 1 worker and one over 2, the two
   interleaved over ``--rounds`` (same run, same workers): samples/s and tokens/s (wall time of submit + close, the
   merge included), the CPU seconds of every process (workers' trees, gateway, this client), the 2-to-1 ratio.
2. Live capture overhead through the 2-worker gateway: ``--clients`` threads send ``--requests`` greedy
   ``/generate`` calls (``--max-new-tokens``) to the gateway with capture off, at rate 0.05 and at rate 1,
   interleaved over the rounds: output tokens/s and each setting's ratio to off (medians over rounds).

On a 2-core machine two workers share the cores of one: the 2-to-1 ratio then measures the gateway and capture
overhead, not scaling. ``--readme`` writes the table into benches/README.md.

    .venv/bin/python benches/bench_fleet.py --rounds 3 [--readme]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

import psutil  # noqa: E402
import torch  # noqa: E402
from bench_live_overhead import load, tree_cpu  # noqa: E402
from benchkit import write_section  # noqa: E402

import eagle_io  # noqa: E402
from eagle_io.capturing.options import CaptureOptions  # noqa: E402
from eagle_io.capturing.sglang.client import ServerCapture  # noqa: E402
from eagle_io.capturing.sglang.live import LivePolicy  # noqa: E402
from eagle_io.sglang.servers import stop_server  # noqa: E402

LIVE = {"off": None, "rate0.05": 0.05, "rate1": 1.0}


def prompts(n: int, tokens: int, seed: int) -> list[SimpleNamespace]:
    g = torch.Generator().manual_seed(seed)
    return [
        SimpleNamespace(
            index=i,
            id=f"s{i}",
            input_ids=torch.randint(10, 40000, (tokens,), generator=g),
            loss_mask=torch.ones(tokens, dtype=torch.long),
        )
        for i in range(n)
    ]


def cpu_of(procs: list[psutil.Process]) -> float:
    return sum(tree_cpu(p) for p in procs) + sum(os.times()[:2])


def generate_row(gateway: str, out: Path, todo: list, concurrency: int, procs: list[psutil.Process]) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    c0, t0 = cpu_of(procs), time.perf_counter()
    with eagle_io.capture(gateway, out, concurrency=concurrency) as cap:
        cap.submit(todo)
    wall, cpu = time.perf_counter() - t0, cpu_of(procs) - c0
    ds = eagle_io.Dataset(out)
    tokens = sum(ds.lengths())
    assert len(ds) == len(todo) and eagle_io.Dataset.verify(out) == [], out
    return {"workers": len(cap.servers), "wall_s": wall, "samples_per_s": len(ds) / wall, "tokens_per_s": tokens / wall,
            "cpu_s": cpu, "samples": len(ds), "tokens": tokens}  # fmt: skip


def live_row(gateway: str, out: Path, setting: str, a: argparse.Namespace, served: list[list[int]]) -> dict:
    rate, cap = LIVE[setting], None
    if rate is not None:
        shutil.rmtree(out, ignore_errors=True)
        cap = ServerCapture(gateway, out, CaptureOptions(), live=LivePolicy(sample_rate=rate))
    r = load(gateway, served, a.requests, a.clients, a.max_new_tokens)
    tokens = sum(len(o) for o in r["outputs"])
    row = {"setting": setting, "tokens_per_s": tokens / r["wall_s"], "wall_s": r["wall_s"]}
    if cap is not None:
        cap.close()
        row["samples"] = len(eagle_io.Dataset(out))
    return row


def median(rows: list[dict], key: str, **match) -> float:
    return statistics.median(r[key] for r in rows if all(r[k] == v for k, v in match.items()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--readme", action="store_true")
    a = ap.parse_args(argv)
    from helpers.gateway import launch_gateway
    from helpers.sglang_cpu import cpu_engine_env
    from test_capture_server import CPU, tiny_checkpoint

    from eagle_io.capturing.sglang.launch import launch_capture_server

    work = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    tiny_checkpoint(work)
    procs, workers, started = [], [], time.time()
    try:
        for i in range(2):
            url, proc = launch_capture_server(work / "tiny", CaptureOptions(), work / f"worker{i}.log",
                                              capture_roots=[work], env=cpu_engine_env(), **CPU)  # fmt: skip
            procs.append(proc)
            workers.append(url)
        one, p1 = launch_gateway(workers[:1], work / "gateway1.log")
        two, p2 = launch_gateway(workers, work / "gateway2.log")
        procs += [p1, p2]
        ps = [psutil.Process(p.pid) for p in procs]
        todo = prompts(a.samples, a.prompt_tokens, seed=0)
        served = [p.input_ids[:48].tolist() for p in prompts(8, 48, seed=1)]
        generate_row(two, work / "warm", todo[:4], a.concurrency, ps)  # warm-up, not measured
        gen, live = [], []
        for k in range(a.rounds):
            for gw in (one, two):
                row = generate_row(gw, work / f"gen-{k}", todo, a.concurrency, ps)
                gen.append(row)
                print(f"round {k + 1} generate, {row['workers']} worker(s): {row['samples_per_s']:.2f} samples/s, "
                      f"{row['tokens_per_s']:.0f} tokens/s, CPU {row['cpu_s']:.1f} s", flush=True)  # fmt: skip
            for s in LIVE:
                row = live_row(two, work / f"live-{k}", s, a, served)
                live.append(row)
                print(f"round {k + 1} live {s}: {row['tokens_per_s']:.1f} tok/s", flush=True)
    finally:
        for p in procs:
            stop_server(p)
    g1 = {k: median(gen, k, workers=1) for k in ("samples_per_s", "tokens_per_s", "cpu_s")}
    g2 = {k: median(gen, k, workers=2) for k in ("samples_per_s", "tokens_per_s", "cpu_s")}
    off = median(live, "tokens_per_s", setting="off")
    lines = [
        f"Command: `benches/bench_fleet.py {' '.join(argv if argv is not None else sys.argv[1:])}` ({os.cpu_count()} "
        f"cores; load average at the end {os.getloadavg()[0]:.1f}; {time.time() - started:.0f} s). SMG 1.13.0 "
        "`--enable-rl`, SGLang 0.5.23 CPU workers (capture-only, tiny float32 Llama, chunked prefill 32, radix cache "
        f"on); {a.samples} prompts of {a.prompt_tokens} tokens, concurrency {a.concurrency} per worker; medians of "
        f"{a.rounds} interleaved rounds.",
        "",
        "| generate through the gateway | samples/s | tokens/s | CPU s (all processes) |",
        "|---|---|---|---|",
        f"| 1 worker | {g1['samples_per_s']:.2f} | {g1['tokens_per_s']:.0f} | {g1['cpu_s']:.1f} |",
        f"| 2 workers | {g2['samples_per_s']:.2f} | {g2['tokens_per_s']:.0f} | {g2['cpu_s']:.1f} |",
        f"| ratio 2 : 1 | {g2['samples_per_s'] / g1['samples_per_s']:.2f} | "
        f"{g2['tokens_per_s'] / g1['tokens_per_s']:.2f} | {g2['cpu_s'] / g1['cpu_s']:.2f} |",
        "",
        f"| live capture through the gateway ({a.clients} clients x {a.requests} requests x {a.max_new_tokens} "
        "tokens) | output tokens/s | ratio to off |",
        "|---|---|---|",
        *(
            f"| {s} | {median(live, 'tokens_per_s', setting=s):.1f} | "
            f"{median(live, 'tokens_per_s', setting=s) / off:.2f} |"
            for s in LIVE
        ),
        "",
    ]
    text = "\n".join(lines)
    print(text)
    (work / "fleet.json").write_text(json.dumps({"generate": gen, "live": live}, indent=2))
    if a.readme:
        write_section("fleet", "## Capture through SGLang's gateway (bench_fleet.py)", text + "\n")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
