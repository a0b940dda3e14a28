"""Build the draft vocabulary mapping (d2t/t2d) from loss-masked token counts, keyed to the dataset."""

from __future__ import annotations

import argparse
import json

from .io_paths import check_output
from .progress import callback


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="PATH", help="eagle-io dataset(s) (e.g. one per rank), in order")
    p.add_argument("--draft-vocab-size", type=int, required=True, help="draft vocabulary size (SpecForge: 32000)")
    p.add_argument("--target-vocab-size", type=int, help="default: the datasets' metadata vocab_size")
    p.add_argument("--on-corrupt", default="raise", choices=["raise", "skip"], help="bad records: fail, or skip+count")
    p.add_argument(
        "--out",
        required=True,
        help="FILE.safetensors (key in the header) or FILE.pt (SpecForge's vocab_mapping.pt, plus the key)",
    )


def run(args: argparse.Namespace) -> int:
    from ..interop.vocab import build_vocab_mapping

    check_output("--out", args.out, directory=False, makes_parents=True)  # before the tokens are counted
    with callback("sample", "count tokens") as progress:
        m = build_vocab_mapping(
            args.paths,
            args.draft_vocab_size,
            target_vocab_size=args.target_vocab_size,
            on_corrupt=args.on_corrupt,
            progress=progress,
        )
    m.save(args.out)
    print(json.dumps({"out": args.out, **dict(m.key)}, indent=2))
    if m.key["padded"]:
        print(
            f"note      only {m.key['distinct_tokens']} distinct loss-masked tokens: padded with the "
            f"{m.key['padded']} lowest unused target ids"
        )
    return 0
