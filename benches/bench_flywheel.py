"""The flywheel, measured (issue 43 item 3): does a draft continued on the target's own served answers beat the same
draft continued on as many tokens of the original answers to the same prompts, by SGLang's own accept length?

Target: the embedded SmolLM2-135M GGUF dequantised to the bf16 HF checkpoint SGLang loads (``target_checkpoint``);
every dataset is captured on that checkpoint, so A, A', B and every draft record one target (``swap-draft`` requires
the served and the new draft to record the same one).

1. Dataset A: ``eagle-io generate --model CKPT`` (HF backend) over ShareGPT records ``[0, --a-records)``, ORIGINAL
   answers (the main job's recipe).
2. v0: ``eagle-io train-draft A``.
3. One ``sglang.launch_server`` (CPU, float32) serves the target with v0 under EAGLE3 (3 steps, top-k 1) and stays
   up to the end. Dataset B: the first user turn of held-out records ``[A, A + --b-records)`` (chat template,
   generation prompt, at most ``--max-prompt-tokens``), greedy, ``--answer-tokens`` new tokens, every request stored
   by the live capture at rate 1 (``ServerCapture(..., live=LivePolicy(sample_rate=1.0))``).
4. v0 measured on that server: ``--eval-prompts`` further held-out first turns (records after B's), greedy
   ``--eval-tokens``, decoded ``--eval-concurrency`` at a time (SGLang batches them); SGLang's pooled accept length
   (sum completion_tokens / sum spec_verify_ct) with a bootstrap 95% interval over prompts.
5. Dataset A': the SAME prompts as B's stored samples with their ORIGINAL first answers, through ``eagle-io generate
   --model CKPT`` (a JSONL of [user, assistant] pairs), then each sample cut after as many supervised tokens as B's
   sample of that prompt holds, written in B's sample order (so ``train-draft``'s seeded held-out split holds out the
   same prompts of both).
6. v1 = ``train-draft B --init-from v0``; v1' = ``train-draft A' --init-from v0``: the same steps, batch, seed and
   learning rate, on (nearly) the same supervised tokens: the control that separates "served answers" from "more
   data". Trained while the server is paused (SIGSTOP; ``--no-pause``: left running).
7. ``swap-draft`` v1 into the server (v0's), measured as in 4; then ``swap-draft`` v1' into the same server, measured.

    python benches/bench_flywheel.py --out /tmp/flywheel --a-records 48 --b-records 40 --eval-prompts 64

Needs the test-only ``sgl_kernel`` (tests/support/sgl_kernel_torch) on a CPU: docs/SERVING.md. Prints the table,
the commands, and writes OUT/flywheel.json. Stages whose output exists in OUT are reused (and said so).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="work directory (datasets, drafts, logs, flywheel.json)")
    p.add_argument("--a-records", type=int, default=48, help="ShareGPT records of dataset A (original answers)")
    p.add_argument("--b-records", type=int, default=40, help="ShareGPT records whose first turn is served (B, A')")
    p.add_argument("--eval-prompts", type=int, default=64, help="further held-out prompts each draft is measured on")
    p.add_argument("--max-length", type=int, default=256, help="sample length cap (A, A' and training)")
    p.add_argument("--max-prompt-tokens", type=int, default=160, help="served and eval prompts at most this long")
    p.add_argument("--answer-tokens", type=int, default=64, help="greedy tokens per served request (dataset B)")
    p.add_argument("--eval-tokens", type=int, default=32, help="greedy tokens per eval prompt")
    p.add_argument("--steps", type=int, default=120, help="train-draft steps of v0")
    p.add_argument("--continue-steps", type=int, default=60, help="train-draft steps of v1 and v1' (each)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--draft-vocab-size", type=int, default=4096)
    p.add_argument("--ttt-length", type=int, default=1)
    p.add_argument("--eval-samples", type=int, default=4, help="train-draft's held-out samples (every draft)")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight while serving B")
    p.add_argument("--eval-concurrency", type=int, default=16, help="eval requests in flight (SGLang batches them)")
    p.add_argument("--threads", type=int, default=2, help="torch threads of every stage")
    p.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples of the eval prompts")
    p.add_argument(
        "--no-pause",
        action="store_true",
        help="keep the server running while v1 and v1' train (default: stopped with SIGSTOP, resumed with SIGCONT: an "
        "idle SGLang scheduler on CPU polls at a full core)",
    )
    return p.parse_args(argv)


def _env(threads: int) -> dict[str, str]:
    from helpers.sglang_cpu import cpu_engine_env

    t = str(threads)
    return cpu_engine_env(OMP_NUM_THREADS=t, MKL_NUM_THREADS=t, TOKENIZERS_PARALLELISM="false")


def _run(cmd: list[str], log: Path, env: dict[str, str]) -> float:
    """Runs ``cmd`` with its output in ``log``; returns its wall time (s); exits naming the log on failure."""
    t0 = time.perf_counter()
    with log.open("wb") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, check=False).returncode
    if rc != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {rc}: see {log}")
    return time.perf_counter() - t0


def _first_turns(tokenizer, start: int, count: int, max_tokens: int) -> tuple[list[dict], dict[str, int]]:
    """First user turn (and the original first answer) of ShareGPT records ``[start, start + count)``, chat template
    applied to the user turn (generation prompt added); skipped ones counted."""
    from eagle_io.data.embedded import default_dataset_path
    from eagle_io.data.sources import iter_conversations
    from eagle_io.data.stats import SkipStats

    out, skipped = [], {"no_user_turn": 0, "no_answer": 0, "too_long": 0}
    for conv in iter_conversations(default_dataset_path(), on_error="skip", stats=SkipStats()):
        if conv.index < start:
            continue
        if conv.index >= start + count:
            break
        msgs = conv.messages
        i = next((k for k, m in enumerate(msgs) if m["role"] == "user" and m["content"].strip()), None)
        if i is None:
            skipped["no_user_turn"] += 1
            continue
        answer = msgs[i + 1] if i + 1 < len(msgs) and msgs[i + 1]["role"] == "assistant" else None
        if answer is None or not answer["content"].strip():
            skipped["no_answer"] += 1
            continue
        ids = tokenizer.apply_chat_template([msgs[i]], add_generation_prompt=True, tokenize=True)
        ids = [int(t) for t in (ids["input_ids"] if hasattr(ids, "keys") else ids)]  # a BatchEncoding in new versions
        if len(ids) > max_tokens:
            skipped["too_long"] += 1
            continue
        out.append({"record": conv.index, "input_ids": ids, "user": msgs[i], "answer": answer})
    return out, skipped


def _generate(args, ckpt: Path, out: Path, log: Path, limit: int, dataset: Path | None = None) -> float:
    return _run(_generate_cmd(args, ckpt, out, limit, dataset), log, _env(args.threads))


def _generate_cmd(args, ckpt: Path, out: Path, limit: int, dataset: Path | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "eagle_io.cli", "generate", "--model", str(ckpt), "--out", str(out)]
    cmd += ["--limit", str(limit), "--max-length", str(args.max_length), "--skip-bad-records", "--threads"]
    cmd += [str(args.threads), "--summary-json", str(out) + ".json"]
    if dataset is not None:
        cmd += ["--dataset", str(dataset)]
    return cmd


def _train_cmd(args, dataset: Path, out: Path, ckpt: Path, init: Path | None) -> list[str]:
    cmd = [sys.executable, "-m", "eagle_io.cli", "train-draft", str(dataset), "--out", str(out)]
    cmd += ["--target-model", str(ckpt), "--batch-size", str(args.batch_size), "--max-length", str(args.max_length)]
    cmd += ["--ttt-length", str(args.ttt_length), "--eval-samples", str(args.eval_samples), "--warmup-steps", "10"]
    cmd += ["--threads", str(args.threads), "--accept-steps", "3", "--seed", "0"]
    if init is None:
        return [*cmd, "--steps", str(args.steps), "--draft-vocab-size", str(args.draft_vocab_size)]
    return [*cmd, "--steps", str(args.continue_steps), "--init-from", str(init)]


def _train(args, dataset: Path, out: Path, ckpt: Path, init: Path | None, res: dict, name: str) -> None:
    if (out / "train_summary.json").is_file():
        res["reused"].append(name)
        wall = None
    else:
        wall = round(_run(_train_cmd(args, dataset, out, ckpt, init), out.parent / f"train_{name}.log",
                          _env(args.threads)), 1)  # fmt: skip
    s = json.loads((out / "train_summary.json").read_text())
    keep = ("steps", "train_samples", "eval_samples", "train_tokens_seen", "train_loss_first10", "train_loss_last10")
    res["train"][name] = {"wall_s": wall, **{k: s.get(k) for k in keep}}
    for when in ("initial", "final"):
        ev = s[when]
        res["train"][name][when] = {k: ev.get(k) for k in ("loss", "agreement", "accept_length", "positions")}


@contextmanager
def _paused(proc, pause: bool):
    """The server's process group stopped (SIGSTOP) for the block and resumed (SIGCONT) after, nothing in flight: an
    idle SGLang scheduler on CPU polls at over a full core (train-draft ran 2.06 s/step beside it, 0.39 alone)."""
    if pause:
        os.killpg(proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        if pause:
            os.killpg(proc.pid, signal.SIGCONT)


def _supervised(ds) -> list[tuple[tuple[int, ...], int, dict]]:
    """Each sample of ``ds`` in position order: (input_ids, supervised tokens, the sample)."""
    out = []
    for p in range(len(ds)):
        s = ds.read(p)
        out.append((tuple(int(t) for t in s["input_ids"]), int(s["loss_mask"].sum()), s))
    return out


def _cut_a_prime(full: Path, b: Path, out: Path, prompts: list[dict]) -> dict:
    """A' written in B's sample order: for B's sample of prompt P, A''s sample of P (the original answer) cut after as
    many supervised tokens as B's holds. Returns the counts (supervised tokens of both, samples matched)."""
    import torch

    import eagle_io

    fa, fb = eagle_io.Dataset(full), eagle_io.Dataset(b)
    a_by_prompt = {}
    for ids, _, s in _supervised(fa):
        for p in prompts:  # the A' sample whose ids start with the served prompt
            n = len(p["input_ids"])
            if ids[:n] == tuple(p["input_ids"]):
                a_by_prompt[tuple(p["input_ids"])] = s
    plist = [tuple(p["input_ids"]) for p in prompts]
    counts = {"B_samples": len(fb), "matched": 0, "B_supervised": 0, "A_prime_supervised": 0, "unmatched": 0}
    with eagle_io.ShardWriter(out, fa.schema, {**fa.metadata, "cut_to_supervised_of": str(b)}, threads=1) as w:
        for i, (ids, n_b, _) in enumerate(_supervised(fb)):
            prompt = next((q for q in plist if ids[: len(q)] == q), None)
            s = a_by_prompt.get(prompt) if prompt is not None else None
            counts["B_supervised"] += n_b
            if s is None:
                counts["unmatched"] += 1
                continue
            csum = torch.cumsum(s["loss_mask"].to(torch.int64), 0)
            hit = (csum >= n_b).nonzero()
            end = int(hit[0]) + 1 if len(hit) else len(csum)
            counts["matched"] += 1
            counts["A_prime_supervised"] += int(csum[end - 1])
            w.write(i, {k: v[:end].contiguous() for k, v in s.items() if k != "sample_id"})
    return counts


def _bootstrap(run, n: int, seed: int = 0) -> dict:
    """SGLang's pooled accept length (sum completion / sum verify) and its bootstrap 95% interval over prompts."""
    c, v = run.completion_tokens, run.verify_ct
    rng, k, stats = random.Random(seed), len(c), []
    for _ in range(n):
        pick = [rng.randrange(k) for _ in range(k)]
        den = sum(v[i] for i in pick)
        stats.append(sum(c[i] for i in pick) / den if den else float("nan"))
    stats.sort()
    return {
        "pooled": round(sum(c) / sum(v), 4),
        "ci95": [round(stats[int(0.025 * n)], 4), round(stats[int(0.975 * n) - 1], 4)],
        "prompts": k,
        "completion_tokens": sum(c),
        "verify_ct": sum(v),
        "decode_s": round(run.seconds, 1),
        "per_prompt": [[a, b] for a, b in zip(c, v, strict=True)],
    }


def _paired(runs: dict, a: str, b: str, n: int, seed: int = 1) -> list[float]:
    """Bootstrap 95% interval of accept(b) - accept(a), the same prompts resampled for both (paired)."""
    ca, va, cb, vb = runs[a].completion_tokens, runs[a].verify_ct, runs[b].completion_tokens, runs[b].verify_ct
    rng, k, d = random.Random(seed), len(ca), []
    for _ in range(n):
        pick = [rng.randrange(k) for _ in range(k)]
        d.append(
            sum(cb[i] for i in pick) / sum(vb[i] for i in pick) - sum(ca[i] for i in pick) / sum(va[i] for i in pick)
        )
    d.sort()
    return [round(d[int(0.025 * n)], 4), round(d[int(0.975 * n) - 1], 4)]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    from helpers.sglang_cpu import SPEC_ENGINE_ARGS

    import eagle_io
    from eagle_io.capturing.models import target_checkpoint
    from eagle_io.capturing.options import CaptureOptions
    from eagle_io.capturing.sglang.client import ServerCapture
    from eagle_io.capturing.sglang.live import LivePolicy
    from eagle_io.sglang.servers import http_json, launch_server, server_flags, stop_server
    from eagle_io.spec.served import engine_args, run_server
    from eagle_io.spec.swap import http_call, swap_draft

    ckpt, tokenizer, _ = target_checkpoint()
    res: dict = {"args": vars(args), "target_checkpoint": str(ckpt), "reused": [], "train": {}, "wall_s": {}}
    t_all = time.perf_counter()
    eos = json.loads((ckpt / "config.json").read_text()).get("eos_token_id")
    stop = [eos] if isinstance(eos, int) else list(eos or [])

    b_prompts, b_skip = _first_turns(tokenizer, args.a_records, args.b_records, args.max_prompt_tokens)
    e_start = args.a_records + args.b_records
    e_prompts, e_skip = _first_turns(tokenizer, e_start, 4 * args.eval_prompts, args.max_prompt_tokens)
    e_prompts = e_prompts[: args.eval_prompts]
    (out / "eval_prompts.jsonl").write_text(
        "".join(json.dumps({"input_ids": p["input_ids"]}) + "\n" for p in e_prompts)
    )
    res["prompts"] = {"B_records": [args.a_records, e_start], "B_prompts": len(b_prompts), "B_skipped": b_skip,
                      "eval_records": [e_prompts[0]["record"], e_prompts[-1]["record"]] if e_prompts else None,
                      "eval_prompts": len(e_prompts), "eval_skipped": e_skip}  # fmt: skip

    a, a_full = out / "A", out / "A_prime_full"
    for ds, name, limit, src in ((a, "A", args.a_records, None), (a_full, "A_prime_full", len(b_prompts), "pairs")):
        if (ds / "manifest.json").is_file():
            res["reused"].append(name)
            continue
        if src:  # the served prompts' first user turn and ORIGINAL first answer, one conversation a line
            src = out / "a_prime_pairs.jsonl"
            src.write_text("".join(json.dumps({"messages": [p["user"], p["answer"]]}) + "\n" for p in b_prompts))
        res["wall_s"][f"generate_{name}"] = round(
            _generate(args, ckpt, ds, out / f"generate_{name}.log", limit, src), 1
        )
    _train(args, a, out / "v0", ckpt, None, res, "v0")

    b = out / "B"
    extra = dict(SPEC_ENGINE_ARGS, max_running_requests=max(args.concurrency, args.eval_concurrency))
    extra["max_total_tokens"] = 16384
    flags = server_flags(engine_args(ckpt, out / "v0", algorithm="EAGLE3", num_steps=3, topk=1, extra=extra))
    env = {**_env(args.threads), "EAGLE_IO_CAPTURE_ROOT": str(out)}  # the live capture writes under OUT
    t0 = time.perf_counter()
    url, proc = launch_server(flags, out / "server.log", env=env)  # answers /health once its warm-up request ended
    runs = {}
    try:
        res["wall_s"]["server_start"] = round(time.perf_counter() - t0, 1)
        if not (b / "manifest.json").is_file():
            t0 = time.perf_counter()
            cap = ServerCapture(url, b, CaptureOptions(max_length=args.max_length, ring_bytes=32 << 20),
                                live=LivePolicy(sample_rate=1.0))  # fmt: skip
            sp = {"max_new_tokens": args.answer_tokens, "temperature": 0}

            def serve(p: dict) -> None:
                http_json(url + "/generate", {"input_ids": p["input_ids"], "sampling_params": sp}, 1800)

            with ThreadPoolExecutor(args.concurrency) as pool:
                list(pool.map(serve, b_prompts))
            cap.close()
            res["capture_B"] = {k: v for k, v in cap.stats().items() if not isinstance(v, (dict, list))}
            res["wall_s"]["serve_B"] = round(time.perf_counter() - t0, 1)
        else:
            res["reused"].append("B")
        ids = [p["input_ids"] for p in e_prompts]
        runs["v0"] = run_server(url, ids, args.eval_tokens, stop, concurrency=args.eval_concurrency)

        a_prime = out / "A_prime"
        if not (a_prime / "manifest.json").is_file():
            res["A_prime_cut"] = _cut_a_prime(a_full, b, a_prime, b_prompts)
        res["datasets"] = {n: {"samples": len(eagle_io.Dataset(d)), "supervised": sum(x[1] for x in _supervised(
            eagle_io.Dataset(d))), "tokens": sum(len(x[0]) for x in _supervised(eagle_io.Dataset(d)))}
            for n, d in (("A", a), ("B", b), ("A_prime", a_prime))}  # fmt: skip
        with _paused(proc, not args.no_pause):
            _train(args, b, out / "v1", ckpt, out / "v0", res, "v1")
            _train(args, a_prime, out / "v1_prime", ckpt, out / "v0", res, "v1_prime")

        res["swap"] = {}
        check = ids[:4]  # the swap's own proof: 4 of the eval prompts; floor lowered (see benches/README.md)
        for name in ("v1", "v1_prime"):
            t0 = time.perf_counter()
            sw = swap_draft(http_call(url), out / name, prompts=check, max_new_tokens=args.eval_tokens,
                            stop_token_ids=stop, accept_floor=1.0)  # fmt: skip
            res["swap"][name] = {"wall_s": round(time.perf_counter() - t0, 1), **{
                k: v for k, v in sw.to_dict().items() if not isinstance(v, (dict, list))}}  # fmt: skip
            runs[name] = run_server(url, ids, args.eval_tokens, stop, concurrency=args.eval_concurrency)
    finally:
        stop_server(proc)
    res["accept"] = {n: _bootstrap(r, args.bootstrap) for n, r in runs.items()}
    res["paired_difference_ci95"] = {
        "v1 - v0": _paired(runs, "v0", "v1", args.bootstrap),
        "v1_prime - v0": _paired(runs, "v0", "v1_prime", args.bootstrap),
        "v1 - v1_prime": _paired(runs, "v1_prime", "v1", args.bootstrap),
    }
    res["total_s"] = round(time.perf_counter() - t_all, 1)
    (out / "flywheel.json").write_text(json.dumps(res, indent=1, default=str))
    print(json.dumps({k: v for k, v in res.items() if k != "accept"}, indent=1, default=str))
    print("\n| draft | SGLang pooled accept | 95% CI (bootstrap over prompts) | verify steps | completion tokens |")
    print("|---|---|---|---|---|")
    for name in ("v0", "v1_prime", "v1"):
        r = res["accept"][name]
        print(f"| {name} | {r['pooled']:.3f} | {r['ci95'][0]:.3f}-{r['ci95'][1]:.3f} | {r['verify_ct']} | "
              f"{r['completion_tokens']} |")  # fmt: skip
    print("\ncommands (OUT=" + str(out) + "):")
    print(" ".join(_train_cmd(args, b, out / "v1", ckpt, out / "v0")[2:]))
    print(" ".join(_train_cmd(args, out / "A_prime", out / "v1_prime", ckpt, out / "v0")[2:]))
    print(f"eagle-io swap-draft URL --draft {out / 'v1'}   # then {out / 'v1_prime'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
