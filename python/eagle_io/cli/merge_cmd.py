"""Merge the rank manifests of a multi-writer root into manifest.json; audit duplicate and missing ids."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from .. import _native
from ..errors import EagleIOError
from ..store.layout import is_url
from ..store.manifest import read_manifest
from ..store.merge import MergeReport, expected_from_source, merge_ranks
from .io_paths import check_input
from .progress import callback

SHOW = 20  # ids listed per problem before "..."


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "root",
        help="output root shared by the ranks (holds manifest.rNNNNN.json files), or such an object-storage prefix "
        "s3://bucket/run (docs/STORAGE.md)",
    )
    expect = p.add_mutually_exclusive_group()
    expect.add_argument("--expect-records", type=int, metavar="N", help="sample ids 0..N-1 are expected")
    expect.add_argument(
        "--dataset", metavar="FILE", help="the source dataset given to generate: its records are expected"
    )
    p.add_argument("--limit", type=int, help="with --dataset: generate's --limit")
    p.add_argument(
        "--tokenizer",
        default="auto",
        help="with --dataset: 'auto' (the tokenizer the manifest metadata names, when it is a local "
        "directory), 'none', or a path; records its chat template rejects are then explained, not missing",
    )
    p.add_argument("--no-write", action="store_true", help="audit only; do not write manifest.json")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def _ids(ids: list[int]) -> str:
    head = ", ".join(map(str, ids[:SHOW]))
    return head + (f", ... ({len(ids)} in all)" if len(ids) > SHOW else "")


def _rank_metadata(root: str) -> dict[str, Any]:
    if is_url(root):  # an object-storage prefix: the manifests directly under it
        paths = sorted(u for u, _ in _native.list_objects(root, []))
    else:
        paths = [os.path.join(root, name) for name in sorted(os.listdir(root))]
    for path in paths:
        name = os.path.basename(path)
        if name.startswith("manifest") and name.endswith(".json"):
            try:
                meta = read_manifest(path)["metadata"]
                return meta if isinstance(meta, dict) else {}
            except EagleIOError:
                continue
    return {}


def _load_tokenizer(choice: str, root: str) -> tuple[Any, int | None, str]:
    meta = _rank_metadata(root)
    max_length = meta.get("max_length") if isinstance(meta.get("max_length"), int) else None
    if choice == "none":
        return None, max_length, "none"
    path = choice
    if choice == "auto":
        from ..data.chat import locate_tokenizer

        path = locate_tokenizer(meta.get("tokenizer"))
        if path is None:
            return None, max_length, "none (the manifest names no local tokenizer directory)"
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path), max_length, str(path)


def print_report(r: MergeReport, source: str | None) -> None:
    if r.written:
        print(f"merged    {len(r.ranks)} rank manifest(s) ({', '.join(r.ranks)}) -> {r.manifest}")
    elif r.ranks:
        print(f"audited   {len(r.ranks)} rank manifest(s) ({', '.join(r.ranks)}); manifest.json NOT written")
    else:
        print(f"audited   {r.manifest} (one writer: nothing to merge)")
    state = "complete" if r.complete else f"INCOMPLETE: {', '.join(r.incomplete_ranks)} did not close"
    print(f"samples   {r.samples:,} in {r.shards} shard(s), {r.tokens:,} tokens ({state})")
    if r.expected is not None:
        print(
            f"expected  {r.expected:,} ids{f' from {source}' if source else ''}: {len(r.missing):,} missing, "
            f"{len(r.unexpected):,} unexpected ({len(r.skipped_by_source):,} records yield no sample)"
        )
    for sid, where in r.duplicates.items():
        print(f"DUPLICATE sample id {sid}: {'; '.join(where)}")
    if r.missing:
        print(f"MISSING   {_ids(r.missing)}")
    by_reason: dict[str, list[int]] = {}
    for i, why in r.skipped_by_source.items():
        by_reason.setdefault(why, []).append(i)
    for why, ids in sorted(by_reason.items()):
        print(f"skipped   {why}: {_ids(ids)} (the source yields no sample)")
    if r.unexpected:
        print(f"UNEXPECTED {_ids(r.unexpected)}")
    for s in r.unlisted_shards:
        print(f"unlisted  {s}: committed but in no manifest (resume its rank to adopt it)")
    for s in r.temp_files:
        print(f"temp      {s}: an uncommitted shard (resume its rank to remove it)")
    for w in r.warnings:
        print(f"warning   {w}")
    if r.duplicates:
        print(f"{len(r.duplicates)} duplicate sample id(s): no merged manifest written")


def run(args: argparse.Namespace) -> int:
    check_input("--dataset", args.dataset, "the source dataset given to generate (JSON or JSONL)")
    expected = skipped = source = None
    if args.expect_records is not None:
        expected, source = range(args.expect_records), f"--expect-records {args.expect_records}"
    elif args.dataset:
        tokenizer, max_length, which = _load_tokenizer(args.tokenizer, args.root)
        ident = _rank_metadata(args.root).get("tokenizer")
        kwargs = ident.get("chat_template_kwargs") if isinstance(ident, dict) else None  # as generate rendered
        with callback("record", "read source") as progress:
            expected, skipped = expected_from_source(
                args.dataset,
                limit=args.limit,
                tokenizer=tokenizer,
                max_length=max_length,
                progress=progress,
                template_kwargs=kwargs,
            )
        source = f"{args.dataset} (limit {args.limit}, tokenizer {which})"
    with callback("sample", "audit ranks") as progress:
        report = merge_ranks(args.root, expected, skipped=skipped, write=not args.no_write, progress=progress)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print_report(report, source)
    return 0 if report.ok else 1


def main(argv: list[str] | None = None) -> int:
    """``python -m eagle_io.cli.merge_cmd`` (the same as ``eagle-io merge``)."""
    from ..data.sources import DatasetFormatError
    from ..errors import EagleIOError

    parser = argparse.ArgumentParser(prog="eagle-io merge", description=__doc__)
    add_parser(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (EagleIOError, DatasetFormatError) as e:
        print(f"eagle-io merge: {type(e).__name__}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
