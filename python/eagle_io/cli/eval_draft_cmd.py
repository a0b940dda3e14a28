"""Measure an EAGLE-3 draft's accept length: live (speculative decoding against the target's own greedy decoding, on
held-out conversations of the dataset) and offline (from the dataset's stored aux states, no target forward), in
SGLang's convention (bonus token counted, counts pooled); writes speculation_profile.json next to the draft."""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys

from ..errors import IncompatibleDatasetError, InvalidArgumentError
from ..sglang.servers import ServerKeys
from .io_paths import check_input, check_output
from .server_keys import add_key_args
from .sglang_arg import parse_sglang_args


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--draft", required=True, help="SGLang-format EAGLE-3 draft directory (e.g. from train-draft)")
    p.add_argument("--target", help="HF directory or .gguf of the target (default: embedded SmolLM2)")
    p.add_argument("--dataset", required=True, help="eagle-io dataset (EAGLE-3 schema) of that target")
    p.add_argument(
        "--prompts",
        type=int,
        default=8,
        help="held-out conversations decoded live: the whole target loads here (0: offline only, from the target's "
        "head alone: its embedding and lm_head)",
    )
    p.add_argument(
        "--num-steps",
        "--speculative-num-steps",
        dest="num_steps",
        type=int,
        default=3,
        help="drafts per verify step (SGLang --speculative-num-steps)",
    )
    p.add_argument(
        "--engine",
        choices=["reference", "sglang"],
        default="reference",
        help="who decodes live: eagle-io's reference decoder (chain only) or a real sglang.Engine started here "
        "(on a CPU it needs SGLANG_USE_CPU_ENGINE=1 and an importable sgl_kernel: docs/SERVING.md)",
    )
    p.add_argument("--server", metavar="URL", help="measure live on a running SGLang server (/generate, meta_info)")
    add_key_args(p)
    p.add_argument(
        "--prompts-file",
        metavar="FILE",
        help='JSONL of live prompts, {"input_ids": [...]} or {"messages": [...]} (rendered with the target\'s chat '
        "template, generation prompt added), instead of the dataset's held-out conversations",
    )
    p.add_argument(
        "--speculative-eagle-topk", type=int, default=1, help="draft tree width (> 1: --engine sglang or --server)"
    )
    p.add_argument(
        "--speculative-num-draft-tokens", type=int, help="verified tokens per step (default: num_steps + 1 for a chain)"
    )
    p.add_argument(
        "--sglang-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="further sglang.Engine argument for --engine sglang (JSON value, else a string), e.g. device=cpu",
    )
    p.add_argument(
        "--as-algorithm",
        default="EAGLE3",
        choices=["EAGLE3", "EAGLE"],
        help="EAGLE: feed the draft what SGLang feeds an EAGLE-3 draft under --speculative-algorithm EAGLE",
    )
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens generated per live prompt")
    p.add_argument("--max-length", type=int, help="truncate dataset samples for the offline figure")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    p.add_argument(
        "--allow-other-target",
        action="store_true",
        help="accept a target whose model_id differs from the draft's, or whose files' sha256 differ from those the "
        "dataset records (the same weights re-saved); its architecture, layers, width and vocabulary must match",
    )
    p.add_argument("--no-profile", action="store_true", help="do not write speculation_profile.json")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the text report")


def _num(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def _report(res: dict) -> str:
    lines = [
        f"eval-draft  num_steps {res['num_steps']}, topk {res['topk']}, {res['as_algorithm']}, held out: "
        f"{res['held_out']}"
    ]
    live, off = res["live"], res["offline"]
    if live and not live["verify_steps"]:
        lines.append(
            f"live        no verify step: each of the {live['prompts']} prompts ended at its first token "
            f"({live['generated_tokens']} tokens; lossless: {live['lossless']}): no live accept length"
        )
    elif live:
        lines.append(
            f"live        accept length {live['accept_length']:.3f} over {live['verify_steps']} verify steps of "
            f"{live['prompts']} prompts ({live['generated_tokens']} tokens; lossless: {live['lossless']}); "
            "per position " + ", ".join(f"{r:.3f}" for r in live["per_position_accept_rate"])
        )
        if live.get("engine") == "sglang":
            lines.append(
                f"            decoded by SGLang ({live['server'].get('speculative_algorithm')}, topk "
                f"{live['server'].get('speculative_eagle_topk')}): SGLang's own pooled accept length "
                f"{_num(live['sglang_accept_length'])} (completion tokens / verify steps); mean of per-request means "
                f"{_num(live['mean_of_request_means'])} (biased)"
            )
        else:
            lines.append(
                f"            {_num(live['tokens_per_s'], '.1f')} tokens/s vs "
                f"{_num(live['greedy_tokens_per_s'], '.1f')} plain greedy ({_num(live['speedup'], '.2f')}x); mean of "
                f"per-request means {_num(live['mean_of_request_means'])} (biased)"
            )
    if off:
        lines.append(
            f"offline     accept length {_num(off['accept_length'])} (joint, bonus counted) over {off['positions']} "
            f"positions of {off['samples']} samples; product of marginals "
            f"{_num(off['accept_length_product_of_marginals'])}"
            " (SpecForge simulated_acc_len = that - 1); conditional per position "
            + ", ".join(_num(r) for r in off["per_position_conditional"])
        )
    if res.get("profile"):
        lines.append(f"profile     {res['profile']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    import torch

    from ..capturing.models import end_of_turn_ids, load_target, target_checkpoint
    from ..draft import load_target_head
    from ..feed import ShardDataset
    from ..interop.speculation_profile import PROFILE_NAME, build_profile, read_training_samples, write_json
    from ..interop.vocab import dataset_fingerprint
    from ..serving.plugin import ENV_PLUGIN
    from ..sglang.spec_params import speculative_param_problems
    from ..spec import check_dataset_fits, load_served_draft
    from ..spec.evaluate import evaluate_draft, held_out_positions, read_prompts_file
    from ..spec.served import engine_args, run_engine, run_server
    from ..store.eagle3 import require_samples
    from ..store.target_identity import dataset_target, require_same_target
    from .progress import callback

    check_input("--prompts-file", args.prompts_file, "a file of prompts (JSON or JSONL)")
    if not args.no_profile and args.as_algorithm == "EAGLE3" and os.path.isdir(args.draft):  # written at the end
        where = os.path.join(args.draft, PROFILE_NAME)
        check_output("the draft's profile (--no-profile: none)", where, directory=False, makes_parents=False)
    if args.num_steps < 1 or args.prompts < 0 or args.max_new_tokens < 1:
        raise InvalidArgumentError("--num-steps and --max-new-tokens must be >= 1, --prompts >= 0")
    # 100000 steps for 4 new tokens ran 10 minutes, printing nothing. After the prefill's token a prompt has
    # max_new_tokens - 1 left: drafting more per verify step is work no verify step can accept (with 1, none runs).
    live = args.prompts > 0 or bool(args.server) or args.engine == "sglang"
    if live and args.max_new_tokens > 1 and args.num_steps >= args.max_new_tokens:
        raise InvalidArgumentError(
            f"--num-steps {args.num_steps} drafts more tokens per verify step than the --max-new-tokens "
            f"{args.max_new_tokens} of a prompt leave after its first: at most {args.max_new_tokens - 1}"
        )
    for name, value, low in (("--max-length", args.max_length, 2), ("--threads", args.threads, 1)):
        if value is not None and value < low:
            raise InvalidArgumentError(f"{name} {value}: must be >= {low}")
    problems = speculative_param_problems(
        args.num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens
    )
    if problems:  # SGLang's bounds (eagle_io.sglang.spec_params), before an engine or the target loads
        raise InvalidArgumentError("; ".join(problems))
    if args.as_algorithm == "EAGLE" and args.prompts == 0:  # was a report of nothing, exit 0
        raise InvalidArgumentError(
            "--as-algorithm EAGLE is measured live only (the stored aux states are what an EAGLE3 launch feeds): "
            "pass --prompts >= 1"
        )
    if args.engine == "sglang" and args.server:
        raise InvalidArgumentError("--engine sglang starts an engine here; --server measures a running one: pick one")
    if args.sglang_arg and args.engine != "sglang":
        raise InvalidArgumentError("--sglang-arg configures the engine of --engine sglang")
    in_sglang = args.engine == "sglang" or bool(args.server)
    if not in_sglang and (
        args.speculative_eagle_topk != 1 or args.speculative_num_draft_tokens not in (None, args.num_steps + 1)
    ):
        raise InvalidArgumentError(
            "the reference decoder runs chain drafts only (topk 1, num_steps + 1 draft tokens): measure a tree "
            "(--speculative-eagle-topk > 1) with --engine sglang or --server URL"
        )
    engine_extra = parse_sglang_args(args.sglang_arg)
    if args.threads:
        torch.set_num_threads(args.threads)
    ds = ShardDataset(args.dataset, max_length=args.max_length)  # refuses a non-EAGLE-3 dataset first
    for part in ds.datasets:  # a capture still running with nothing committed: not "trained on all 0"
        require_samples(part, "eval-draft")
    longest = max(ds.lengths(), default=0)
    if args.num_steps >= longest:  # draft step k predicts the token k positions on: none is measured past that
        raise InvalidArgumentError(
            f"--num-steps {args.num_steps}: the longest sample of {args.dataset} has {longest} tokens"
            + (f" (after --max-length {args.max_length})" if args.max_length else "")
            + f"; a draft step k predicts the token k on: at most {max(longest - 1, 1)}"
        )
    training = read_training_samples(args.draft)  # checked before the target loads
    checkpoint = prompt_ids = None
    if not live:  # offline only: the target's head (embedding, lm_head) and config, never its layers
        model = load_target_head(args.target)
        info = model.identity
    elif args.engine == "sglang":  # one target for the engine and the reference: the HF checkpoint SGLang serves
        checkpoint, _, info = target_checkpoint(args.target)  # (a GGUF is dequantised to it; info: the original's)
        model, tokenizer, _ = load_target(str(checkpoint), dtype=torch.float32)
    else:
        model, tokenizer, info = load_target(args.target, dtype=torch.float32)
    if live and args.prompts_file:
        prompt_ids = read_prompts_file(args.prompts_file, tokenizer)
    served = load_served_draft(
        args.draft, model, info, dataset=args.dataset, allow_other_target=args.allow_other_target
    )
    check_dataset_fits(served, ds.metadata, args.dataset)
    # The dataset's target, every fact it records: its files' sha256 too (other weights of the same shapes passed).
    require_same_target(
        dataset_target(ds.metadata),
        info,
        where=args.dataset,
        option="--target",
        allow_other_target=args.allow_other_target,
    )
    for w in served.warnings:
        if w.severity == "warning":
            print(f"eval-draft: warning [{w.code}] {w.message}", file=sys.stderr)  # stdout: the report or --json
    fingerprint = dataset_fingerprint(args.dataset)
    positions, held = held_out_positions(ds, training, fingerprint)
    if not positions:  # was a report of nothing, exit 0
        raise IncompatibleDatasetError(
            f"{args.dataset}: the draft trained on all {len(ds)} of its samples ({args.draft}/training_samples.json): "
            "none is held out to measure; evaluate on a dataset of conversations it did not train on"
        )
    try:  # was a TypeError traceback formatting an accept length of None
        ds.require_supervision(positions, option="--max-length")
    except IncompatibleDatasetError as e:
        raise IncompatibleDatasetError(f"{args.dataset}: the held-out samples leave nothing to measure: {e}") from e
    eos = end_of_turn_ids(model, tokenizer) if live else []
    sglang = None
    if args.server:
        keys = ServerKeys.resolve(args.api_key, args.admin_api_key)
        sglang = functools.partial(run_server, args.server, max_new_tokens=args.max_new_tokens, stop_token_ids=eos,
                                   algorithm=args.as_algorithm, keys=keys)  # fmt: skip
    elif args.engine == "sglang":
        kwargs = engine_args(
            checkpoint,
            args.draft,
            algorithm=args.as_algorithm,
            num_steps=args.num_steps,
            topk=args.speculative_eagle_topk,
            draft_tokens=args.speculative_num_draft_tokens,
            extra=engine_extra,
        )
        # The classic failure, on purpose: eagle-io's own plugin would refuse an EAGLE launch of an EAGLE-3 draft.
        env = {ENV_PLUGIN: "0"} if args.as_algorithm != "EAGLE3" else {}
        sglang = functools.partial(run_engine, kwargs, max_new_tokens=args.max_new_tokens, stop_token_ids=eos, env=env)
    with callback("prompt", "eval-draft live") as live_bar:  # stderr: stdout is the report or --json
        res = evaluate_draft(
            served,
            ds,
            positions,
            num_steps=args.num_steps,
            as_algorithm=args.as_algorithm,
            prompts=args.prompts,
            max_new_tokens=args.max_new_tokens,
            eos_token_ids=eos,
            prompt_ids=prompt_ids,
            sglang=sglang,
            progress=live_bar,
        )
    res.update(held)
    res["dataset"], res["draft"], res["target"] = args.dataset, args.draft, info["model_id"]
    measured = [m for m in (res["live"], res["offline"]) if m and m["accept_length"] is not None]
    res["topk"] = args.speculative_eagle_topk
    if not args.no_profile and args.as_algorithm == "EAGLE3" and args.speculative_eagle_topk == 1 and measured:
        profile = build_profile(
            num_steps=args.num_steps,
            live=res["live"],
            offline=res["offline"],
            data={
                "dataset_sha256": fingerprint,
                "source_dataset": ds.metadata.get("source_dataset"),
                "samples": len(positions),
                "held_out": held["held_out"],
                "live_sample_ids": (res["live"] or {}).get("sample_ids", []),
            },
            target={"model_id": info["model_id"]},
        )
        res["profile"] = write_json(os.path.join(args.draft, PROFILE_NAME), profile)
    print(json.dumps(res, indent=2) if args.json else _report(res))
    return 0
