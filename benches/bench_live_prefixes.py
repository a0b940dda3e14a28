"""Shared prefixes in a live capture (issue 44, item 5): bytes on disk per sample and prompt tokens computed per
request, a capture storing prefixes once (``dedup``, the default) against one storing every sample whole
(``whole``: ``dedup_prefixes=False``, every sampled prompt computed in a radix-cache namespace of its own), the same
requests in the same run, interleaved in rounds.

The server: one ``python -m sglang.launch_server`` serving a target and its EAGLE-3 draft under EAGLE3 (chain),
eagle-io's plugin on, its radix cache on (benches/bench_live_overhead.py's fixture and launch: the tiny float32
Llama of tests/helpers/spec_fixture.py on SGLang's CPU engine). The workload: one system prompt of
``--system-tokens`` random token ids (the longest the tiny target's 512 positions take beside a question and its
answer) followed by ``--requests`` questions of 20-40 random token ids of their own, greedy, ``--max-new-tokens``
with ``ignore_eos``, ``--clients`` at a time; a live capture at rate 1 stores every request.

Per setting and round: bytes on disk of the dataset (every file under it) per sample; prompt tokens SGLang computed
per request (prompt length minus its own ``meta_info["cached_tokens"]``); the CPU seconds of the server's process
tree during the load. Then, request by request, the two settings' samples: token ids and loss masks equal, and the
largest relative difference of their states (max |a - b| / max |b|; the prefix rows of ``dedup`` are those of the
request that stored the record, computed in another batch).

    .venv/bin/python benches/bench_live_prefixes.py --fixture FIXTURE.json --rounds 2 [--readme]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

import psutil  # noqa: E402
import torch  # noqa: E402
from bench_live_overhead import add_server_args, fixture, server_env_args, tree_cpu  # noqa: E402
from benchkit import write_section  # noqa: E402

import eagle_io  # noqa: E402
from eagle_io.capturing.options import CaptureOptions  # noqa: E402
from eagle_io.capturing.sglang.client import ServerCapture  # noqa: E402
from eagle_io.capturing.sglang.live import LivePolicy  # noqa: E402
from eagle_io.sglang.servers import http_json, launch_server, server_flags, stop_server  # noqa: E402

SETTINGS = {"whole": False, "dedup": None}


def workload(system_tokens: int, requests: int, vocab: int, seed: int = 44) -> list[list[int]]:
    """``requests`` prompts: one shared system prompt, then a question of 20-40 token ids each."""
    g = torch.Generator().manual_seed(seed)
    system = torch.randint(10, vocab, (system_tokens,), generator=g).tolist()
    lens = torch.randint(20, 41, (requests,), generator=g).tolist()
    return [system + torch.randint(10, vocab, (n,), generator=g).tolist() for n in lens]


def serve(url: str, prompts: list[list[int]], clients: int, max_new_tokens: int) -> list[dict]:
    """Every prompt answered, ``clients`` at a time; per prompt (in order): its rid, output ids, cached tokens."""
    out: list[dict | None] = [None] * len(prompts)
    todo = iter(range(len(prompts)))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            rid = f"p-{uuid.uuid4().hex[:12]}"
            body = {"input_ids": prompts[i], "rid": rid, "sampling_params": {
                "max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}}  # fmt: skip
            r = http_json(f"{url}/generate", body, timeout_s=600)
            out[i] = {"rid": rid, "output_ids": r["output_ids"], "cached": int(r["meta_info"]["cached_tokens"])}

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(o is not None for o in out)
    return out  # type: ignore[return-value]


def one(url: str, server: psutil.Process, setting: str, out_dir: Path, a: argparse.Namespace, prompts) -> dict:
    opts = CaptureOptions(dedup_prefixes=SETTINGS[setting])
    cpu0, t0 = tree_cpu(server), time.perf_counter()
    with ServerCapture(url, out_dir, opts, live=LivePolicy(sample_rate=1.0)) as cap:
        served = serve(url, prompts, a.clients, a.max_new_tokens)
    wall, cpu = time.perf_counter() - t0, tree_cpu(server) - cpu0
    st = cap.stats()
    ds = eagle_io.Dataset(out_dir)
    size = sum(f.stat().st_size for f in out_dir.rglob("*") if f.is_file())
    computed = [len(p) - s["cached"] for p, s in zip(prompts, served, strict=True)]
    return {
        "setting": setting,
        "samples": len(ds),
        "prefix_records": len(ds.prefix_records()),
        "bytes_on_disk": size,
        "bytes_per_sample": size / max(len(ds), 1),
        "prompt_tokens_computed_per_request": statistics.mean(computed),
        "prompt_tokens_per_request": statistics.mean(len(p) for p in prompts),
        "server_cpu_s": cpu,
        "wall_s": wall,
        "verify_bad": len(eagle_io.Dataset.verify(out_dir)),
        "after_stored_prefix": st.get("scheduler_after_stored_prefix", 0),
        "written": st.get("scheduler_written", 0),
        "served": served,
    }


def compare(a_dir: Path, a_rows: list[dict], b_dir: Path, b_rows: list[dict]) -> dict:
    """Request by request (the same prompt, greedy): ids and masks equal; the largest relative state difference."""
    da, db = eagle_io.Dataset(a_dir), eagle_io.Dataset(b_dir)
    ka = {da.entry(i).key: i for i in range(len(da))}
    kb = {db.entry(i).key: i for i in range(len(db))}
    same_ids, worst = True, 0.0
    for ra, rb in zip(a_rows, b_rows, strict=True):
        x, y = da[ka[ra["rid"]]], db[kb[rb["rid"]]]
        same_ids &= torch.equal(x["input_ids"], y["input_ids"]) and torch.equal(x["loss_mask"], y["loss_mask"])
        for t in ("aux_hidden_states", "hidden_states"):
            xa, yb = x[t].float(), y[t].float()
            worst = max(worst, float((xa - yb).abs().max() / yb.abs().max()))
    return {"same_ids_and_masks": bool(same_ids), "max_rel_state_difference": worst}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_server_args(ap)  # the fixture's prompts are not used: the workload is built here
    ap.add_argument("--system-tokens", type=int, default=384)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=None, help="directory of live_prefixes.json and the server log")
    ap.add_argument("--readme", action="store_true", help="write the results into benches/README.md")
    a = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="live-prefixes-"))
    out = Path(a.out or work)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    target, draft, _, steps = fixture(a, work)
    vocab = int(json.loads((Path(target) / "config.json").read_text())["vocab_size"])
    prompts = workload(a.system_tokens, a.requests, vocab)
    args, env = server_env_args(a, target, draft, steps)
    env = {**env, "EAGLE_IO_CAPTURE_ROOT": str(work.resolve())}
    url, proc = launch_server(server_flags(args), out / "live_prefixes_server.log", env=env)
    rows = []
    try:
        server = psutil.Process(proc.pid)
        for k in range(a.rounds):
            for s in SETTINGS:
                row = one(url, server, s, work / f"ds-{s}-{k}", a, prompts)
                rows.append({"round": k, **row})
                print(f"round {k + 1} {s}: {row['bytes_per_sample']:,.0f} B/sample, "
                      f"{row['prompt_tokens_computed_per_request']:.1f} prompt tokens computed/request, "
                      f"server CPU {row['server_cpu_s']:.1f} s", flush=True)  # fmt: skip
    finally:
        stop_server(proc)
    med = {
        s: {k: statistics.median(r[k] for r in rows if r["setting"] == s)
            for k in ("bytes_per_sample", "prompt_tokens_computed_per_request", "server_cpu_s", "wall_s")}
        for s in SETTINGS
    }  # fmt: skip
    checks = [compare(work / f"ds-dedup-{k}", rows[2 * k + 1]["served"], work / f"ds-whole-{k}", rows[2 * k]["served"])
              for k in range(a.rounds)]  # fmt: skip
    ratio = {
        "bytes": med["whole"]["bytes_per_sample"] / med["dedup"]["bytes_per_sample"],
        "prompt_tokens_computed": med["whole"]["prompt_tokens_computed_per_request"]
        / max(med["dedup"]["prompt_tokens_computed_per_request"], 1e-9),
    }
    result = {
        "command": "benches/bench_live_prefixes.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "target": target,
        "draft": draft,
        "workload": {
            "system_tokens": a.system_tokens,
            "requests": a.requests,
            "clients": a.clients,
            "max_new_tokens": a.max_new_tokens,
            "prompt_tokens": [len(p) for p in prompts],
        },
        "cores": os.cpu_count(),
        "loadavg_end": os.getloadavg(),
        "wall_s": time.time() - t_start,
        "medians": med,
        "whole_over_dedup": ratio,
        "checks": checks,
        "rows": [{k: v for k, v in r.items() if k != "served"} for r in rows],
    }
    (out / "live_prefixes.json").write_text(json.dumps(result, indent=2, default=str))
    lines = ["| setting | bytes/sample | x whole | prompt tokens computed/request | x whole | server CPU s | wall s |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for s in SETTINGS:
        m = med[s]
        lines.append(
            f"| {s} | {m['bytes_per_sample']:,.0f} | {m['bytes_per_sample'] / med['whole']['bytes_per_sample']:.3f} "
            f"| {m['prompt_tokens_computed_per_request']:.1f} | "
            f"{m['prompt_tokens_computed_per_request'] / med['whole']['prompt_tokens_computed_per_request']:.3f} "
            f"| {m['server_cpu_s']:.1f} | {m['wall_s']:.1f} |"
        )
    text = "\n".join(lines)
    print(text)
    print("whole / dedup:", json.dumps(ratio), "checks:", json.dumps(checks))
    if a.readme:
        write_section("live_prefixes", "## Shared prefixes in a live capture (bench_live_prefixes.py)",
                      f"Command: `{result['command']}`\n\n{text}\n")  # fmt: skip
    ok = all(c["same_ids_and_masks"] for c in checks) and all(r["verify_bad"] == 0 for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
