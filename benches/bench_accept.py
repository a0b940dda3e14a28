"""Accept length of EAGLE-3 drafts trained on eagle-io data, live and offline, on the real target (issue 22).

Every draft is measured on the same held-out conversations: the samples of each dataset whose id no draft trained on
(their ``training_samples.json``; ids are source record indexes, so they name the same conversations in the original,
FP8 and regenerated captures of one ShareGPT slice). Live: ``eagle_io.spec.SpeculativeDecoder`` on the first
``--prompts`` of them (prompt = the conversation up to its first answer), ``--max-new-tokens`` each, against the
target's own greedy decoding (lossless check; tokens/s with each prompt's greedy and speculative decodings back to
back, so both see the same load of a shared machine); only prompts of at most ``--max-prompt-tokens`` (a CPU's
prefill cost). Offline: ``eagle_io.draft.offline_accept`` over the first
``--offline-samples`` held-out samples of each ``--offline`` dataset (the teacher's argmax computed once per
dataset). ``--eagle-mode NAME`` also decodes that draft as SGLang runs it under ``--speculative-algorithm EAGLE``.
Counts in SGLang's convention (bonus token counted, pooled).

    python benches/bench_accept.py --draft orig-ttt1=runs/draft-orig-ttt1 --draft orig-ttt3=runs/draft-orig-ttt3 \\
        --live runs/orig --offline orig=runs/orig --offline regen=runs/regen --eagle-mode orig-ttt3 \\
        --threads 1 --out benches/results/accept.json

Prints a markdown table (benches/README.md holds the results) and writes every figure as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def _named(value: str) -> tuple[str, str]:
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {value!r}")
    return name, path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--draft", type=_named, action="append", required=True, help="NAME=DIR of a draft")
    p.add_argument("--target", help="HF directory or .gguf (default: the embedded SmolLM2)")
    p.add_argument("--live", required=True, help="dataset whose held-out prompts are decoded live")
    p.add_argument("--offline", type=_named, action="append", default=[], help="NAME=DATASET for the offline figure")
    p.add_argument("--num-steps", default="3,5", help="comma-separated speculative_num_steps")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max-prompt-tokens", type=int, default=256, help="live prompts at most this long (prefill cost)")
    p.add_argument("--live-ids", help="comma-separated sample ids decoded live (another run's, to compare runs)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--offline-samples", type=int, default=24, help="held-out samples per offline dataset")
    p.add_argument("--eagle-mode", action="append", default=[], help="NAME of a draft also decoded as EAGLE")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", required=True, help="JSON results file")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import torch

    from eagle_io.capturing.models import end_of_turn_ids, load_target
    from eagle_io.draft import offline_accept
    from eagle_io.draft.batches import Teacher
    from eagle_io.feed import ShardDataset
    from eagle_io.interop.speculation_profile import read_training_samples
    from eagle_io.spec import load_served_draft
    from eagle_io.spec.evaluate import evaluate_draft, live_prompts

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    steps = [int(s) for s in args.num_steps.split(",")]
    model, tokenizer, info = load_target(args.target, dtype=torch.float32)
    eos = end_of_turn_ids(model, tokenizer)
    drafts = {name: load_served_draft(path, model, info) for name, path in args.draft}
    trained: set[int] = set()
    for _, path in args.draft:
        rec = read_training_samples(path)
        if rec is None:
            raise SystemExit(f"{path}: no training_samples.json: cannot tell which conversations are held out")
        trained |= set(rec["train_sample_ids"])

    def held(ds) -> list[int]:
        return [p for p in range(len(ds)) if ds.entry(p).sample_id not in trained]

    live_ds = ShardDataset(args.live)

    def short(p: int) -> bool:
        found, _ = live_prompts(live_ds, [p], 1)
        return bool(found) and len(found[0]) <= args.max_prompt_tokens

    if args.live_ids:
        want = [int(i) for i in args.live_ids.split(",")]
        if trained & set(want):
            raise SystemExit(f"--live-ids {sorted(trained & set(want))} were trained on")
        where = {live_ds.entry(p).sample_id: p for p in range(len(live_ds))}
        live_pos = [where[i] for i in want]
    else:
        live_pos = [p for p in held(live_ds) if short(p)][: args.prompts]
    prompts, prompt_ids = live_prompts(live_ds, live_pos, args.prompts)
    print(f"live      {len(prompts)} held-out prompts {prompt_ids}", file=sys.stderr)
    offline = {name: ShardDataset(path) for name, path in args.offline}
    head_w = model.get_output_embeddings().weight.detach().float()
    teachers = {name: Teacher(head_w) for name in offline}  # the teacher's argmax, computed once per dataset
    rows = []
    for name, served in drafts.items():
        for s in steps:
            for algo in ("EAGLE3", "EAGLE") if name in args.eagle_mode and s == steps[0] else ("EAGLE3",):
                t0 = time.perf_counter()
                res = evaluate_draft(
                    served,
                    live_ds,
                    live_pos,
                    num_steps=s,
                    as_algorithm=algo,
                    prompts=args.prompts,
                    max_new_tokens=args.max_new_tokens,
                    eos_token_ids=eos,
                    offline=False,
                )
                row = {"draft": name, "num_steps": s, "as_algorithm": algo, "live": res["live"], "offline": {}}
                if algo == "EAGLE3":
                    for oname, ds in offline.items():
                        pos = held(ds)[: args.offline_samples]
                        off = offline_accept(served.draft, ds, pos, head_w, s, teacher=teachers[oname])
                        row["offline"][oname] = off.to_dict()
                row["seconds"] = time.perf_counter() - t0
                rows.append(row)
                live = res["live"]
                print(
                    f"{name:14s} S={s} {algo:6s} live {live['accept_length']:.3f} "
                    + " ".join(f"offline[{k}] {v['accept_length']:.3f}" for k, v in row["offline"].items())
                    + f" {live['tokens_per_s']:.1f} tok/s vs {live['greedy_tokens_per_s']:.1f}"
                    + f" lossless {live['lossless']}",
                    file=sys.stderr,
                )
    result = {
        "target": info["model_id"],
        "threads": args.threads,
        "prompts": prompt_ids,
        "max_new_tokens": args.max_new_tokens,
        "drafts": dict(args.draft),
        "offline_datasets": dict(args.offline),
        "offline_samples": {k: len(held(ds)[: args.offline_samples]) for k, ds in offline.items()},
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(table(result))
    return 0


def table(result: dict) -> str:
    """The markdown table of a results file."""
    names = list(result["offline_datasets"])
    head = [
        "draft",
        "S",
        "algorithm",
        "live accept",
        *(f"offline {n} (product)" for n in names),
        "tok/s",
        "greedy tok/s",
        "speedup",
        "lossless",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in result["rows"]:
        live = r["live"]
        offs = []
        for n in names:
            o = r["offline"].get(n)
            offs.append(
                "-" if o is None else f"{o['accept_length']:.3f} ({o['accept_length_product_of_marginals']:.3f})"
            )
        lines.append(
            f"| {r['draft']} | {r['num_steps']} | {r['as_algorithm']} | {live['accept_length']:.3f} | "
            + " | ".join(offs)
            + f" | {live['tokens_per_s']:.1f} | {live['greedy_tokens_per_s']:.1f} | {live['speedup']:.2f} | "
            f"{live['lossless']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--table":
        print(table(json.loads(Path(sys.argv[2]).read_text())))
        sys.exit(0)
    sys.exit(main())
