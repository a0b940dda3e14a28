"""Overhead of a live capture on a speculative SGLang server (issue 32, item 5): one ``python -m
sglang.launch_server`` serving a target and its EAGLE-3 draft under EAGLE3 (chain), eagle-io's plugin on, takes the
same load under three settings, interleaved in rounds (off, rate 0, rate 1, off, ...) so that drift on a shared
machine hits all three alike:

- ``off``: no capture started;
- ``rate0``: a live capture running, ``LivePolicy(sample_rate=0.0)`` (every request admitted, none sampled);
- ``rate1``: a live capture running, ``LivePolicy(sample_rate=1.0)`` (every request sampled and stored).

The load: ``--clients`` threads, each sending ``/generate`` requests (the held-out prompts, in turn; greedy,
``--max-new-tokens`` with ``ignore_eos``) one after the other until ``--requests`` have been answered. Per setting and
round: output tokens/s over the load's wall time, p50/p99 request latency, the CPU seconds of the server's whole
process tree (psutil, during the load; and during the capture's ``close``, its drain and commit), prompt tokens the
radix cache served. Reported: each setting's median over rounds and its ratio to ``off``'s (the same run, same
server); whether ``rate0`` and ``rate1`` served the very tokens ``off`` did (greedy); what ``rate1`` stored (samples,
bytes on disk, ring high-water mark from ``capture_status`` before the stop; verified with ``Dataset.verify``).

On this CPU: the tiny float32 Llama target + trained draft of tests/helpers/spec_fixture.py (``--fixture`` a JSON
``{"target", "draft", "prompts", ...}`` of one already built, else built here: 2-3 min) on SGLang's CPU engine
(tests/helpers/sglang_cpu.py). On a GPU: benches/gpu/bench_live_overhead.sh (``--device cuda``, ``--target`` /
``--draft`` real models, prompts tokenized from ``--prompts-file``).

    .venv/bin/python benches/bench_live_overhead.py --fixture FIXTURE.json --rounds 3 [--readme]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

import psutil  # noqa: E402
from benchkit import write_section  # noqa: E402

import eagle_io  # noqa: E402
from eagle_io.capturing.options import CaptureOptions  # noqa: E402
from eagle_io.capturing.sglang.client import ServerCapture, capture_status  # noqa: E402
from eagle_io.capturing.sglang.live import LivePolicy  # noqa: E402
from eagle_io.sglang.servers import http_json, launch_server, server_flags, stop_server  # noqa: E402
from eagle_io.spec.served import engine_args  # noqa: E402

SETTINGS = {"off": None, "rate0": 0.0, "rate1": 1.0}
TEXT_PROMPTS = (
    "Explain how a hash table handles collisions, with a short example.",
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "What are the main differences between TCP and UDP?",
    "Summarize the plot of Romeo and Juliet in three sentences.",
    "Give three tips for writing clear technical documentation.",
    "Why is the sky blue? Answer for a ten-year-old.",
    "List the planets of the solar system in order from the sun.",
    "Translate 'good morning, how are you?' into French and Spanish.",
)


def tree_cpu(proc: psutil.Process) -> float:
    """User + system CPU seconds of ``proc`` and every live descendant."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def load(url: str, prompts: list[list[int]], requests: int, clients: int, max_new_tokens: int) -> dict:
    """``requests`` greedy ``/generate`` calls from ``clients`` threads (request i: prompt i mod len(prompts)).
    Returns wall seconds, per-request latencies, output ids per request index, cached prompt tokens."""
    nxt, lock = iter(range(requests)), threading.Lock()
    lat, outs, cached, errors = [0.0] * requests, [None] * requests, [0] * requests, []

    def client():
        while True:
            with lock:
                i = next(nxt, None)
            if i is None:
                return
            body = {
                "input_ids": prompts[i % len(prompts)],
                "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True},
            }
            t0 = time.perf_counter()
            try:
                r = http_json(url + "/generate", body, timeout_s=600)
            except Exception as e:  # reported below; the bench then fails
                errors.append(f"request {i}: {e}")
                return
            lat[i] = time.perf_counter() - t0
            meta = r["meta_info"]
            if (meta.get("finish_reason") or {}).get("type") == "abort":
                errors.append(f"request {i} aborted: {meta['finish_reason']}")
            outs[i], cached[i] = r["output_ids"], int(meta.get("cached_tokens") or 0)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        sys.exit("load failed: " + "; ".join(errors[:5]))
    return {"wall_s": wall, "latencies": lat, "outputs": outs, "cached_tokens": sum(cached)}


def pct(xs: list[float], q: float) -> float:
    """The ``q``-quantile of ``xs`` (nearest rank)."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * len(s) + 0.5) - 1))]


def one(url: str, server: psutil.Process, setting: str, out_dir: Path, a: argparse.Namespace, prompts) -> dict:
    """One setting's load (a live capture started before and closed after, unless ``off``)."""
    rate = SETTINGS[setting]
    cap = None
    if rate is not None:
        shutil.rmtree(out_dir, ignore_errors=True)
        cap = ServerCapture(url, out_dir, CaptureOptions(), live=LivePolicy(sample_rate=rate))
    c0 = tree_cpu(server)
    r = load(url, prompts, a.requests, a.clients, a.max_new_tokens)
    c1 = tree_cpu(server)
    tokens = sum(len(o) for o in r["outputs"])
    row = {
        "setting": setting,
        "tokens_per_s": tokens / r["wall_s"],
        "p50_s": pct(r["latencies"], 0.5),
        "p99_s": pct(r["latencies"], 0.99),
        "wall_s": r["wall_s"],
        "output_tokens": tokens,
        "server_cpu_s": c1 - c0,
        "cached_tokens": r["cached_tokens"],
        "outputs": r["outputs"],
    }
    if cap is not None:
        (status,) = capture_status(url)
        t0 = time.perf_counter()
        cap.close()
        row["close_s"] = time.perf_counter() - t0
        row["close_cpu_s"] = tree_cpu(server) - c1
        stats = cap.stats()
        row["ring_high_water_bytes"] = (status.get("ring") or {}).get("ring_high_water_bytes")
        row["live_counts"] = {k: v for k, v in (status.get("counts") or {}).items() if v}
        row["scheduler_counts"] = {k: v for k, v in stats.items() if k.startswith("scheduler_") and v}
        ds = eagle_io.Dataset(out_dir)
        row["samples"] = len(ds)
        row["stored_tokens"] = sum(ds.lengths())
        # a stored sample is the prompt + the answer but its last token (whose state is never computed)
        row["expected_tokens_if_all"] = sum(len(prompts[i % len(prompts)]) + len(o) - 1
                                            for i, o in enumerate(r["outputs"]))  # fmt: skip
        row["bytes_on_disk"] = sum(f.stat().st_size for f in out_dir.rglob("*") if f.is_file())
        row["verify_bad"] = len(eagle_io.Dataset.verify(out_dir))
    return row


def fixture(a: argparse.Namespace, work: Path) -> tuple[str, str, list[list[int]], int]:
    """(target, draft, prompts, draft steps): ``--target``/``--draft`` (prompts tokenized), ``--fixture``, or built."""
    from helpers.spec_fixture import STEPS

    if a.target:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(a.target)
        texts = Path(a.prompts_file).read_text().splitlines() if a.prompts_file else TEXT_PROMPTS
        return a.target, a.draft, [tok(t).input_ids for t in texts if t.strip()], a.steps
    if a.fixture:
        fx = json.loads(Path(a.fixture).read_text())
        return fx["target"], fx["draft"], fx["prompts"], STEPS
    from helpers.spec_fixture import build_spec_fixture

    target, _, draft, prompts, _ = build_spec_fixture(work / "fixture")
    return str(target), str(draft), prompts, STEPS


def add_server_args(ap: argparse.ArgumentParser) -> None:
    """The arguments :func:`fixture` and :func:`server_env_args` read."""
    ap.add_argument("--fixture", help='JSON {"target", "draft", "prompts"} of a built spec fixture')
    ap.add_argument("--target", help="a target HF directory (with --draft; prompts tokenized by its tokenizer)")
    ap.add_argument("--draft", help="an EAGLE-3 draft directory SGLang serves for --target")
    ap.add_argument("--prompts-file", help="one prompt per line (with --target); default: 8 built-in prompts")
    ap.add_argument("--steps", type=int, default=3, help="speculative steps (with --target)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--dtype", default="bfloat16", help="the engine's dtype on cuda (the CPU engine: float32)")


def server_env_args(a: argparse.Namespace, target: str, draft: str, steps: int) -> tuple[dict, dict]:
    """The launch arguments and environment: SGLang's CPU engine (tests/helpers/sglang_cpu.py) or a CUDA device."""
    if a.device == "cpu":
        from helpers.sglang_cpu import SPEC_ENGINE_ARGS, cpu_engine_env

        return engine_args(target, draft, algorithm="EAGLE3", num_steps=steps, extra=SPEC_ENGINE_ARGS), cpu_engine_env()
    extra = {"device": "cuda", "dtype": a.dtype, "skip_tokenizer_init": True, "mem_fraction_static": 0.7}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE_IO_", "SGLANG_PLUGINS"))}
    return engine_args(target, draft, algorithm="EAGLE3", num_steps=steps, extra=extra), env


def summarize(rows: list[dict]) -> dict:
    """Each setting's median over rounds, ratios to ``off``, and the served-token check."""
    med = {}
    for s in SETTINGS:
        rs = [r for r in rows if r["setting"] == s]
        med[s] = {k: statistics.median(r[k] for r in rs) for k in ("tokens_per_s", "p50_s", "p99_s", "server_cpu_s")}
        med[s]["server_cpu_ms_per_token"] = 1e3 * statistics.median(r["server_cpu_s"] / r["output_tokens"] for r in rs)
        med[s]["cached_tokens"] = statistics.median(r["cached_tokens"] for r in rs)
        if s != "off":
            med[s]["close_s"] = statistics.median(r["close_s"] for r in rs)
            med[s]["close_cpu_s"] = statistics.median(r["close_cpu_s"] for r in rs)
    for s in ("rate0", "rate1"):
        med[s]["ratio_tokens_per_s"] = med[s]["tokens_per_s"] / med["off"]["tokens_per_s"]
        med[s]["ratio_p50"] = med[s]["p50_s"] / med["off"]["p50_s"]
        med[s]["ratio_p99"] = med[s]["p99_s"] / med["off"]["p99_s"]
        med[s]["ratio_server_cpu_per_token"] = med[s]["server_cpu_ms_per_token"] / med["off"]["server_cpu_ms_per_token"]
    ref = next(r["outputs"] for r in rows if r["setting"] == "off")
    same = {s: all(r["outputs"] == ref for r in rows if r["setting"] == s) for s in SETTINGS}
    return {"medians": med, "same_tokens_as_off": same}


def table(summary: dict, rows: list[dict]) -> str:
    med = summary["medians"]
    lines = [
        "| setting | output tok/s | x off | p50 s | x off | p99 s | x off | server CPU ms/token | x off | "
        "cached prompt tokens | close s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s, m in med.items():

        def x(key, m=m, s=s):
            return f"{m[key]:.3f}" if s != "off" else "1"

        close = f"{m['close_s']:.2f}" if s != "off" else ""
        lines.append(
            f"| {s} | {m['tokens_per_s']:.1f} | {x('ratio_tokens_per_s')} | {m['p50_s']:.2f} | {x('ratio_p50')} | "
            f"{m['p99_s']:.2f} | {x('ratio_p99')} | {m['server_cpu_ms_per_token']:.1f} | "
            f"{x('ratio_server_cpu_per_token')} | {m['cached_tokens']:.0f} | {close} |"
        )
    lines += ["", "Per round (output tok/s, p50 s, p99 s):", ""]
    rounds = max(r["round"] for r in rows) + 1
    for k in range(rounds):
        cells = [
            f"{r['setting']} {r['tokens_per_s']:.1f} / {r['p50_s']:.2f} / {r['p99_s']:.2f}"
            for r in rows
            if r["round"] == k
        ]
        lines.append(f"- round {k + 1}: " + "; ".join(cells))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_server_args(ap)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=16, help="requests per setting and round")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--out", default=None, help="directory of live_overhead.json and the server log")
    ap.add_argument("--readme", action="store_true", help="write the results into benches/README.md")
    a = ap.parse_args(argv)
    if bool(a.target) != bool(a.draft):
        ap.error("--target and --draft go together")
    work = Path(tempfile.mkdtemp(prefix="live-overhead-"))
    out = Path(a.out or work)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    target, draft, prompts, steps = fixture(a, work)
    args, env = server_env_args(a, target, draft, steps)
    env = {**env, "EAGLE_IO_CAPTURE_ROOT": str(work.resolve())}  # where the bench's live captures write
    url, proc = launch_server(server_flags(args), out / "live_overhead_server.log", env=env)
    rows = []
    try:
        server = psutil.Process(proc.pid)
        load(url, prompts, a.requests, a.clients, a.max_new_tokens)  # warm-up (one setting's load), not measured
        for k in range(a.rounds):
            for s in SETTINGS:
                row = one(url, server, s, work / f"ds-{s}-{k}", a, prompts)
                rows.append({"round": k, **row})
                print(f"round {k + 1} {s}: {row['tokens_per_s']:.1f} tok/s, p50 {row['p50_s']:.2f} s, "
                      f"p99 {row['p99_s']:.2f} s, server CPU {row['server_cpu_s']:.1f} s"
                      + (f", samples {row['samples']}" if "samples" in row else ""), flush=True)  # fmt: skip
    finally:
        stop_server(proc)
    summary = summarize(rows)
    r1 = [r for r in rows if r["setting"] == "rate1"]
    keys = ("samples", "stored_tokens", "expected_tokens_if_all", "bytes_on_disk", "ring_high_water_bytes",
            "verify_bad", "live_counts", "scheduler_counts")  # fmt: skip
    stored = {k: [r[k] for r in r1] for k in keys}
    r0 = [r for r in rows if r["setting"] == "rate0"]
    stored0 = {k: [r[k] for r in r0] for k in ("samples", "live_counts", "scheduler_counts")}
    result = {
        "command": "benches/bench_live_overhead.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "device": a.device,
        "target": target,
        "draft": draft,
        "engine_args": args,
        "load": {
            "clients": a.clients,
            "requests": a.requests,
            "max_new_tokens": a.max_new_tokens,
            "prompts": len(prompts),
            "prompt_tokens": [len(p) for p in prompts],
            "rounds": a.rounds,
        },
        "cores": os.cpu_count(),
        "loadavg_end": os.getloadavg(),
        "wall_s": time.time() - t_start,
        **summary,
        "rate1_stored": stored,
        "rate0_stored": stored0,
        "rows": [{k: v for k, v in r.items() if k != "outputs"} for r in rows],
    }
    (out / "live_overhead.json").write_text(json.dumps(result, indent=2, default=str))
    text = table(summary, rows)
    print(text)
    print("same tokens as off:", summary["same_tokens_as_off"])
    print("rate1 stored:", json.dumps(stored, default=str))
    print("rate0 stored:", json.dumps(stored0, default=str))
    if a.readme:
        write_section("live_overhead", "## Live capture overhead (bench_live_overhead.py)",
                      f"Command: `{result['command']}`\n\n{text}\n")  # fmt: skip
    ok = all(summary["same_tokens_as_off"].values()) and all(r["verify_bad"] == 0 for r in r1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
