"""The flywheel, measured (issue item 6): does a draft trained on served traffic beat one trained on the original
answers, by SGLang's own accept length?

1. Dataset A: ``eagle-io generate`` over ShareGPT records ``[0, --a-records)`` with their ORIGINAL answers (the
   main job's recipe, HF backend, the embedded SmolLM2 GGUF).
2. Draft v0: ``eagle-io train-draft A``.
3. Dataset B: held-out ShareGPT records ``[--a-records, --a-records + --b-records)``, first user turn, chat template
   applied (generation prompt added), prompts of at most ``--max-prompt-tokens``; served by a real
   ``sglang.launch_server`` (CPU, float32) running the target (the GGUF dequantised to the HF checkpoint that
   ``generate --backend sglang`` makes) with draft v0 under ``--speculative-algorithm EAGLE3``, greedy,
   ``--answer-tokens`` new tokens; every request captured by the live capture at rate 1 (``ServerCapture(...,
   live=LivePolicy(sample_rate=1.0))``): prompt + the target's own answer, loss mask over the answer.
4. Draft v1: ``eagle-io train-draft B`` with v0's recipe (steps, batch, seq length, vocab size, TTT length, seed),
   from scratch (train-draft has no way to start from a trained draft, so v0 fine-tuned on B is not measured).
5. Each draft measured by SGLang itself: ``eagle-io eval-draft --engine sglang`` on the next ``--eval-prompts``
   records (neither draft trained on them), greedy, ``--eval-tokens`` new tokens, 3 steps, top-k 1; SGLang's pooled
   accept length (sum completion_tokens / sum spec_verify_ct), and eval-draft's offline figure on A's stored states
   (the samples the draft did not train on; ``--offline-b``: also on B's). Plus the held-out offline accept length
   train-draft prints.
6. ``--swap``: v1 trained on v0's vocab map (``--keep-vocab-map``), then measured by SGLang after ``swap-draft``
   into a server launched with v0 (v0 measured on it first), on the same eval prompts (not yet run).

    python benches/bench_flywheel.py --out /tmp/flywheel --a-records 160 --b-records 160 --steps 300

Needs the test-only ``sgl_kernel`` (tests/support/sgl_kernel_torch) on a CPU: docs/SERVING.md. Prints one JSON
object (also written to OUT/flywheel.json). Stages whose output exists in OUT are reused (and said so).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="work directory (datasets, drafts, logs, flywheel.json)")
    p.add_argument("--a-records", type=int, default=160, help="ShareGPT records of dataset A (original answers)")
    p.add_argument("--b-records", type=int, default=160, help="ShareGPT records served to make dataset B")
    p.add_argument("--eval-prompts", type=int, default=8, help="held-out prompts SGLang decodes per draft")
    p.add_argument("--max-length", type=int, default=384, help="sample length cap (capture and training)")
    p.add_argument("--max-prompt-tokens", type=int, default=256, help="served and eval prompts at most this long")
    p.add_argument("--answer-tokens", type=int, default=96, help="greedy tokens per served request (dataset B)")
    p.add_argument("--eval-tokens", type=int, default=48, help="greedy tokens per eval prompt")
    p.add_argument("--steps", type=int, default=300, help="train-draft steps (both drafts)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--draft-vocab-size", type=int, default=4096)
    p.add_argument("--ttt-length", type=int, default=1)
    p.add_argument("--eval-samples", type=int, default=12, help="train-draft's held-out samples (both drafts)")
    p.add_argument("--offline-b", action="store_true", help="also eval-draft's offline figure on B's held-out states")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight while serving B")
    p.add_argument("--threads", type=int, default=2, help="torch threads of every stage")
    p.add_argument(
        "--swap",
        action="store_true",
        help="also measure v1 swapped in place (swap-draft) into a server launched with v0, v0 measured on it first; "
        "v1 is then trained with --keep-vocab-map v0",
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


def _prompts(tokenizer, start: int, count: int, max_tokens: int) -> tuple[list[dict], dict[str, int]]:
    """First user turn of ShareGPT records ``[start, start + count)``, chat template applied; skipped ones counted."""
    from eagle_io.data.embedded import default_dataset_path
    from eagle_io.data.sources import iter_conversations
    from eagle_io.data.stats import SkipStats

    out, skipped = [], {"no_user_turn": 0, "too_long": 0}
    stats = SkipStats()
    for conv in iter_conversations(default_dataset_path(), on_error="skip", stats=stats):
        if conv.index < start:
            continue
        if conv.index >= start + count:
            break
        first = next((m for m in conv.messages if m["role"] == "user" and m["content"].strip()), None)
        if first is None:
            skipped["no_user_turn"] += 1
            continue
        ids = tokenizer.apply_chat_template([first], add_generation_prompt=True, tokenize=True)
        ids = [int(t) for t in (ids["input_ids"] if hasattr(ids, "keys") else ids)]  # a BatchEncoding in new versions
        if len(ids) > max_tokens:
            skipped["too_long"] += 1
            continue
        out.append({"record": conv.index, "input_ids": ids})
    return out, skipped


def _serve_and_capture(args, target: Path, draft: Path, prompts: list[dict], out: Path, log: Path) -> dict:
    """Dataset B: a real SGLang server with ``draft`` under EAGLE3 answers ``prompts``; the live capture stores each."""
    from helpers.sglang_cpu import SPEC_ENGINE_ARGS

    import eagle_io
    from eagle_io.capturing.options import CaptureOptions
    from eagle_io.capturing.sglang.client import ServerCapture
    from eagle_io.capturing.sglang.live import LivePolicy
    from eagle_io.sglang.servers import http_json, launch_server, server_flags, stop_server
    from eagle_io.spec.served import engine_args

    extra = dict(SPEC_ENGINE_ARGS, max_running_requests=args.concurrency, max_total_tokens=16384)
    flags = server_flags(engine_args(target, draft, algorithm="EAGLE3", num_steps=3, topk=1, extra=extra))
    t0 = time.perf_counter()
    env = {**_env(args.threads), "EAGLE_IO_CAPTURE_ROOT": str(Path(out).resolve().parent)}  # the capture's dataset
    url, proc = launch_server(flags, log, env=env)  # answers /health once its warm-up request ended
    try:
        start_s = time.perf_counter() - t0
        # A small ring: the default 256 MiB was refused once when other processes held the machine's memory.
        opts = CaptureOptions(max_length=args.max_length, ring_bytes=32 << 20)
        cap = ServerCapture(url, out, opts, live=LivePolicy(sample_rate=1.0))
        sp = {"max_new_tokens": args.answer_tokens, "temperature": 0}

        def one(p: dict) -> dict:
            r = http_json(url + "/generate", {"input_ids": p["input_ids"], "sampling_params": sp}, 1800)
            return r["meta_info"]

        t1 = time.perf_counter()
        with ThreadPoolExecutor(args.concurrency) as pool:
            metas = list(pool.map(one, prompts))
        serve_s = time.perf_counter() - t1
        cap.close()
        stats = cap.stats()
    finally:
        stop_server(proc)
    completion = sum(m["completion_tokens"] for m in metas)
    verify = sum(m.get("spec_verify_ct") or 0 for m in metas)
    return {
        "server_start_s": round(start_s, 1),
        "serve_s": round(serve_s, 1),
        "requests": len(metas),
        "completion_tokens": completion,
        "spec_verify_ct": verify,
        "v0_pooled_accept_while_serving": round(completion / verify, 4) if verify else None,
        "capture_stats": {k: v for k, v in stats.items() if not isinstance(v, (dict, list))},
        "dataset_samples": len(eagle_io.Dataset(out)),
    }


def _train(args, dataset: Path, out: Path, target: str, log: Path, keep_map: Path | None = None) -> dict:
    cmd = [sys.executable, "-m", "eagle_io.cli", "train-draft", str(dataset), "--out", str(out)]
    if keep_map is not None:  # swap-draft needs the served draft's vocab map (SGLang fixes it at start)
        cmd += ["--keep-vocab-map", str(keep_map)]
    cmd += ["--target-model", target, "--allow-other-target", "--draft-vocab-size", str(args.draft_vocab_size)]
    cmd += ["--steps", str(args.steps), "--batch-size", str(args.batch_size), "--max-length", str(args.max_length)]
    cmd += ["--ttt-length", str(args.ttt_length), "--eval-samples", str(args.eval_samples), "--warmup-steps", "10"]
    cmd += ["--threads", str(args.threads), "--accept-steps", "3", "--seed", "0"]
    wall = _run(cmd, log, _env(args.threads))
    summary = json.loads((out / "train_summary.json").read_text())
    return {"wall_s": round(wall, 1), "summary": summary}


def _swap_measure(args, target: Path, v0: Path, v1: Path, prompts: list[dict], log: Path) -> dict:
    """A server launched with v0 (not the one that served B): SGLang's pooled accept length of v0 on the eval prompts,
    then v1 swapped in place (``swap_draft``), then v1's on the same prompts and server."""
    from helpers.sglang_cpu import SPEC_ENGINE_ARGS

    from eagle_io.sglang.servers import launch_server, server_flags, stop_server
    from eagle_io.spec.served import engine_args, run_server
    from eagle_io.spec.swap import http_call, swap_draft

    eos = json.loads((target / "config.json").read_text()).get("eos_token_id")
    stop = [eos] if isinstance(eos, int) else list(eos or [])
    ids = [p["input_ids"] for p in prompts]
    flags = server_flags(engine_args(target, v0, algorithm="EAGLE3", num_steps=3, topk=1, extra=SPEC_ENGINE_ARGS))
    url, proc = launch_server(flags, log, env=_env(args.threads))
    try:
        before = run_server(url, ids, args.eval_tokens, stop)
        swapped = swap_draft(http_call(url), v1, prompts=ids, max_new_tokens=args.eval_tokens, stop_token_ids=stop)
        after = run_server(url, ids, args.eval_tokens, stop)
    finally:
        stop_server(proc)
    return {
        "v0_served": before.sglang_accept_length,
        "swap": swapped.to_dict(),
        "v1_after_swap": after.sglang_accept_length,
        "request_verify_ct": {"v0": before.verify_ct, "v1": after.verify_ct},
    }


def _eval(args, draft: Path, target: Path, dataset: Path, prompts_file: Path | None, log: Path) -> dict:
    from helpers.sglang_cpu import SPEC_ENGINE_ARGS

    cmd = [sys.executable, "-m", "eagle_io.cli", "eval-draft", "--draft", str(draft), "--target", str(target)]
    cmd += ["--dataset", str(dataset), "--allow-other-target", "--json", "--no-profile", "--num-steps", "3"]
    cmd += ["--threads", str(args.threads), "--max-length", str(args.max_length)]
    if prompts_file is None:
        cmd += ["--prompts", "0"]
    else:
        cmd += ["--engine", "sglang", "--prompts-file", str(prompts_file), "--max-new-tokens", str(args.eval_tokens)]
        for k, v in SPEC_ENGINE_ARGS.items():
            cmd += ["--sglang-arg", f"{k}={json.dumps(v)}"]
    t0 = time.perf_counter()
    with log.open("wb") as f:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=f, env=_env(args.threads), check=False)
    if proc.returncode != 0:
        raise SystemExit(f"eval-draft exited {proc.returncode}: see {log}")
    return {"wall_s": round(time.perf_counter() - t0, 1), "result": json.loads(proc.stdout)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    from eagle_io.capturing.models import default_gguf_path, target_checkpoint

    gguf = str(default_gguf_path())
    ckpt, tokenizer, _ = target_checkpoint()
    res: dict = {"args": vars(args), "target_checkpoint": str(ckpt), "reused": []}
    t_all = time.perf_counter()

    a = out / "A"
    if not (a / "manifest.json").is_file():
        cmd = [sys.executable, "-m", "eagle_io.cli", "generate", "--out", str(a), "--limit", str(args.a_records)]
        cmd += ["--max-length", str(args.max_length), "--skip-bad-records", "--summary-json", str(out / "A.json")]
        res["generate_A_s"] = round(_run(cmd, out / "generate_A.log", _env(args.threads)), 1)
    else:
        res["reused"].append("A")

    b_prompts, b_skip = _prompts(tokenizer, args.a_records, args.b_records, args.max_prompt_tokens)
    e_start = args.a_records + args.b_records
    e_prompts, e_skip_ = _prompts(tokenizer, e_start, 4 * args.eval_prompts, args.max_prompt_tokens)
    e_prompts = e_prompts[: args.eval_prompts]
    eval_file = out / "eval_prompts.jsonl"
    eval_file.write_text("".join(json.dumps({"input_ids": p["input_ids"]}) + "\n" for p in e_prompts))
    res["prompts"] = {
        "B_records": [args.a_records, args.a_records + args.b_records],
        "B_prompts": len(b_prompts),
        "B_skipped": b_skip,
        "eval_records": [p["record"] for p in e_prompts],
        "eval_skipped": e_skip_,
        "eval_prompt_tokens": [len(p["input_ids"]) for p in e_prompts],
    }

    drafts = {"v0": a, "v1": out / "B"}
    res["train"] = {}
    for name, ds in drafts.items():
        if name != "v0" and not (out / "B" / "manifest.json").is_file():
            log = out / "serve_B.log"
            res["serve_B"] = _serve_and_capture(args, ckpt, out / "v0", b_prompts, out / "B", log)
        if (out / name / "train_summary.json").is_file():
            res["reused"].append(name)
            res["train"][name] = {"summary": json.loads((out / name / "train_summary.json").read_text())}
        else:
            target = gguf if ds == a else str(ckpt)
            keep = out / "v0" if args.swap and name == "v1" else None
            res["train"][name] = _train(args, ds, out / name, target, out / f"train_{name}.log", keep)

    res["eval"] = {}
    for name in drafts:
        d = out / name
        # Each draft with the dataset it trained on (its offline figure: that dataset's held-out samples): eval-draft
        # refuses v1 with A, whose recorded target is the GGUF's name where B's (and v1's) is the checkpoint's.
        res["eval"][name] = {"sglang": _eval(args, d, ckpt, drafts[name], eval_file, out / f"eval_{name}.log")}
        if args.offline_b:
            res["eval"][name]["offline_B"] = _eval(args, d, ckpt, out / "B", None, out / f"offline_B_{name}.log")
    if args.swap:
        res["swap"] = _swap_measure(args, ckpt, out / "v0", out / "v1", e_prompts, out / "swap_server.log")
    res["total_s"] = round(time.perf_counter() - t_all, 1)
    text = json.dumps(res, indent=1, default=str)
    (out / "flywheel.json").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
