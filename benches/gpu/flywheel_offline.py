"""The part of benches/bench_flywheel.py that runs without SGLang (issue 43 item 4), for a lent device machine
(Python 3.12, torch, transformers; no SGLang, no network), or any machine.

What needs SGLang and so is NOT here: serving the target with a draft, the live capture of its answers (dataset B
proper), ``swap-draft`` into a running server, and SGLang's own accept length. In their place:

- B_offline: the target's OWN greedy answers to the held-out first turns, made by ``eagle-io generate --regenerate``
  (Hugging Face ``model.generate``, greedy, ``--answer-tokens``): what a server answering those prompts greedily
  would produce, captured offline rather than live;
- A': the same prompts' ORIGINAL ShareGPT answers through ``eagle-io generate``, cut per prompt to B_offline's
  supervised tokens and written in its order (bench_flywheel's ``_cut_a_prime``);
- v0 on A (records ``[0, --a-records)``, original answers); v1 = ``train-draft B_offline --init-from v0``;
  v1' = ``train-draft A' --init-from v0`` (the same steps, batch, seed);
- each draft measured by ``eagle-io eval-draft`` with eagle-io's reference decoder (chain, greedy, ``--num-steps 3``)
  on ``--eval-prompts`` further held-out first turns, plus its offline figure on A''s states.

eagle-io's HF capture (``generate --backend hf``), ``train-draft`` and the reference decoder run on the CPU (they
take no device option), so on a lent machine this uses its cores, not its GPU. Writes OUT/flywheel_offline.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import bench_flywheel as fw  # noqa: E402  (benches/ on the path above)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="work directory")
    p.add_argument("--a-records", type=int, default=200)
    p.add_argument("--b-records", type=int, default=200)
    p.add_argument("--eval-prompts", type=int, default=64)
    p.add_argument("--max-length", type=int, default=512)
    p.add_argument("--max-prompt-tokens", type=int, default=256)
    p.add_argument("--answer-tokens", type=int, default=128, help="greedy tokens of each B_offline answer")
    p.add_argument("--eval-tokens", type=int, default=64)
    p.add_argument("--steps", type=int, default=600, help="train-draft steps of v0")
    p.add_argument("--continue-steps", type=int, default=300, help="train-draft steps of v1 and v1' (each)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--draft-vocab-size", type=int, default=4096)
    p.add_argument("--ttt-length", type=int, default=1)
    p.add_argument("--eval-samples", type=int, default=8)
    p.add_argument("--threads", type=int, default=8, help="torch threads of every stage")
    return p.parse_args(argv)


def _eval(args, draft: Path, ckpt: Path, dataset: Path, prompts: Path, log: Path) -> dict:
    cmd = [sys.executable, "-m", "eagle_io.cli", "eval-draft", "--draft", str(draft), "--target", str(ckpt)]
    cmd += ["--dataset", str(dataset), "--prompts-file", str(prompts), "--max-new-tokens", str(args.eval_tokens)]
    cmd += ["--num-steps", "3", "--json", "--no-profile", "--threads", str(args.threads)]
    cmd += ["--max-length", str(args.max_length)]
    t0 = time.perf_counter()
    with log.open("wb") as f:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=f, env=fw._env(args.threads), check=False)
    if proc.returncode != 0:
        raise SystemExit(f"eval-draft exited {proc.returncode}: see {log}")
    r = json.loads(proc.stdout)
    live, off = r.get("live") or {}, r.get("offline") or {}
    keep = ("accept_length", "verify_steps", "generated_tokens", "lossless")
    return {"wall_s": round(time.perf_counter() - t0, 1), "live": {k: live.get(k) for k in keep},
            "offline_A_prime_held_out": {k: off.get(k) for k in ("accept_length", "positions")}}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    import eagle_io
    from eagle_io.capturing.models import target_checkpoint

    t_all = time.perf_counter()
    ckpt, tokenizer, _ = target_checkpoint()
    res: dict = {"args": vars(args), "target_checkpoint": str(ckpt), "reused": [], "train": {}, "wall_s": {}}
    b_prompts, b_skip = fw._first_turns(tokenizer, args.a_records, args.b_records, args.max_prompt_tokens)
    e_start = args.a_records + args.b_records
    e_prompts = fw._first_turns(tokenizer, e_start, 4 * args.eval_prompts, args.max_prompt_tokens)[0]
    e_prompts = e_prompts[: args.eval_prompts]
    eval_file = out / "eval_prompts.jsonl"
    eval_file.write_text("".join(json.dumps({"input_ids": p["input_ids"]}) + "\n" for p in e_prompts))
    pairs = out / "pairs.jsonl"  # the held-out first turns with their ORIGINAL first answers
    pairs.write_text("".join(json.dumps({"messages": [p["user"], p["answer"]]}) + "\n" for p in b_prompts))
    res["prompts"] = {"B_prompts": len(b_prompts), "B_skipped": b_skip, "eval_prompts": len(e_prompts)}

    a, a_full, b = out / "A", out / "A_prime_full", out / "B_offline"
    for ds, limit, src, more in (
        (a, args.a_records, None, []),
        (a_full, len(b_prompts), pairs, []),
        (b, len(b_prompts), pairs, ["--regenerate", "--max-new-tokens", str(args.answer_tokens)]),
    ):
        if (ds / "manifest.json").is_file():
            res["reused"].append(ds.name)
            continue
        res["wall_s"][f"generate_{ds.name}"] = round(
            fw._run(
                fw._generate_cmd(args, ckpt, ds, limit, src) + more,
                out / f"generate_{ds.name}.log",
                fw._env(args.threads),
            ),
            1,
        )
    a_prime = out / "A_prime"
    if not (a_prime / "manifest.json").is_file():
        res["A_prime_cut"] = fw._cut_a_prime(a_full, b, a_prime, b_prompts)
    res["datasets"] = {
        d.name: {
            "samples": len(eagle_io.Dataset(d)),
            "supervised": sum(x[1] for x in fw._supervised(eagle_io.Dataset(d))),
        }
        for d in (a, b, a_prime)
    }
    fw._train(args, a, out / "v0", ckpt, None, res, "v0")
    fw._train(args, b, out / "v1", ckpt, out / "v0", res, "v1")
    fw._train(args, a_prime, out / "v1_prime", ckpt, out / "v0", res, "v1_prime")
    res["eval"] = {
        n: _eval(args, out / n, ckpt, a_prime, eval_file, out / f"eval_{n}.log") for n in ("v0", "v1_prime", "v1")
    }
    res["total_s"] = round(time.perf_counter() - t_all, 1)
    (out / "flywheel_offline.json").write_text(json.dumps(res, indent=1, default=str))
    print(json.dumps(res, indent=1, default=str))
    print("\n| draft | reference-decoder accept (1 + correct / verify) | verify steps | offline on A' held-out |")
    print("|---|---|---|---|")
    for n in ("v0", "v1_prime", "v1"):
        e = res["eval"][n]
        print(f"| {n} | {e['live']['accept_length']} | {e['live']['verify_steps']} | "
              f"{e['offline_A_prime_held_out']['accept_length']} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
