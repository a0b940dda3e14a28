"""Swap the draft a running SGLang server serves for an exported one (`train-draft --out`), in place, without a
restart: checked against the served draft first (architecture, widths, layer ids, vocab map, target; check-serving's
checks), loaded with SGLang's weight-update API (selector draft, a weight_version naming the draft), then proven: the
draft's checksums read back, and the served accept length on a few greedy prompts. Same host only (shared-memory
tensors). Exit 0 when the swap is proven, 2 when refused or not proven (the message says whether anything was sent)."""

from __future__ import annotations

import argparse
import json

from .. import defaults
from .io_paths import check_input
from .server_keys import add_key_args


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="the SGLang server serving the draft to replace (http://HOST:PORT, on this host), or "
                               "SGLang's gateway (SMG with --enable-rl) in front of such workers: each is swapped in "
                               "turn")  # fmt: skip
    p.add_argument("--draft", required=True, help="the exported draft directory to load (`eagle-io train-draft --out`)")
    p.add_argument(
        "--prompts-file",
        help='check prompts, one JSON object a line: {"input_ids": [...]} or {"messages": [...]} (rendered with the '
        "served target's chat template) (default: a few fixed token-id prompts)",
    )
    p.add_argument("--max-new-tokens", type=int, default=defaults.SWAP_MAX_NEW_TOKENS, help="greedy tokens per prompt")
    p.add_argument(
        "--accept-floor",
        type=float,
        default=defaults.SWAP_ACCEPT_FLOOR,
        help="refuse a swap whose served accept length (SGLang's pooled count) is below this",
    )
    p.add_argument(
        "--accept-fraction",
        type=float,
        default=defaults.SWAP_ACCEPT_FRACTION,
        help="... or below this fraction of the draft's speculation_profile.json prediction",
    )
    p.add_argument("--weight-version", help="the version the server reports after the swap (default: DIRNAME@SHA)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_key_args(p)


def run(args: argparse.Namespace) -> int:
    from ..errors import DraftSwapError
    from ..sglang.gateway import routes
    from ..sglang.servers import ServerKeys
    from ..spec.swap import http_call, swap_draft

    check_input("--draft", f"{args.draft}/config.json", "an exported draft directory (eagle-io train-draft --out DIR)")
    check_input("--prompts-file", args.prompts_file, 'a JSONL file of {"input_ids": [...]} prompts')
    keys = ServerKeys.resolve(args.api_key, args.admin_api_key)
    workers = routes(args.url, keys=keys)  # the server, or each worker behind SGLang's gateway
    prompts = None
    if args.prompts_file:
        from transformers import AutoTokenizer

        from ..spec.evaluate import read_prompts_file

        model_path = http_call(workers[0], keys)("/server_info", None, False)["model_path"]
        prompts = read_prompts_file(args.prompts_file, AutoTokenizer.from_pretrained(model_path))
    results = []
    for i, worker in enumerate(workers):  # one at a time: a failure leaves the rest on the draft they serve
        try:
            result = swap_draft(http_call(worker, keys), args.draft, prompts=prompts,
                                max_new_tokens=args.max_new_tokens, accept_floor=args.accept_floor,
                                accept_fraction=args.accept_fraction, weight_version=args.weight_version,
                                where=worker.name)  # fmt: skip
        except DraftSwapError as e:
            if len(workers) == 1:
                raise
            done = ", ".join(w.name for w in workers[:i]) or "none"
            rest = ", ".join(w.name for w in workers[i + 1 :]) or "none"
            raise DraftSwapError(f"{e}\nswapped before it: {done}; not tried, still serving their draft: {rest}",
                                 sent=e.sent) from e  # fmt: skip
        results.append((worker, result.to_dict()))
    if args.json:
        out = [{"worker": w.name, **r} for w, r in results]
        print(json.dumps(out[0] if len(out) == 1 else out, indent=2))
        return 0
    for worker, r in results:
        checked = (
            f"{r['checksums_matched']} checksums read back equal"
            if r["checksums_unchecked"] is None
            else f"checksums not compared ({r['checksums_unchecked']})"
        )
        print(f"swapped   {worker.name} now serves {r['weight_version']} ({r['tensors_sent']} tensors, "
              f"{r['update_seconds']:.1f} s; {checked})")  # fmt: skip
        expected = r["profile_accept_length"]
        print(
            f"accept    {r['sglang_accept_length']:.3f} served (SGLang's pooled count, {len(r['request_verify_ct'])} "
            f"prompts), at least {r['accept_threshold']:.3f} required"
            + (f" (profile {expected:.3f})" if expected is not None else "")
        )
    return 0
