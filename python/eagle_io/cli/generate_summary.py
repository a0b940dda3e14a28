"""What ``eagle-io generate`` tells at the end: a one-screen human summary of its JSON summary, and, when the
run leaves no sample at all, why (the main skip reason) and which option would change it."""

from __future__ import annotations

import argparse
from typing import Any

# Why a record yields no sample -> what to change (formatted with the run's arguments).
HINTS = {
    "empty_loss_mask": "no assistant token lies within --max-length {max_length}: raise --max-length",
    "no_assistant_turn": "the records hold no assistant turn after a user turn: check --dataset (roles are mapped "
    "by eagle_io.data.ROLE_MAP)",
    "template_error": "the chat template of --model's tokenizer fails on them: check --model",
    "template_not_prefix_stable": "the chat template of --model's tokenizer is not prefix-stable: check --model",
    "truncated": "the file ends inside the record: check --dataset",
    "nonfinite_states": "the target's states hold NaN/Inf (--nonfinite skip dropped them): try --dtype float32 or "
    "check --model",
    "dropped_ring_full": "the capture ring was full: raise --ring-bytes",
    "no_supervised_token": "every loss mask was all 0 when it reached the capture: check the masks sent (an "
    "assistant token within --max-length {max_length})",
}
PARSE_HINT = "the records are not ShareGPT / OpenAI conversations: check --dataset"


def _duration(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h {m:02d}m {s:02d}s" if h else f"{m}m {s:02d}s" if m else f"{seconds:.1f} s"


def _size(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n:,} bytes"


def _reasons(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))) or "none"


def skip_counts(summary: dict[str, Any]) -> dict[str, int]:
    """Records that yielded no stored sample, by reason: the source's skips, NaN/Inf states, ring drops, loss masks
    with no 1 at the capture."""
    out = dict(summary.get("records_skipped") or {})
    pairs = (("nonfinite_skipped", "nonfinite_states"), ("dropped_ring_full", "dropped_ring_full"),
             ("unsupervised_skipped", "no_supervised_token"))  # fmt: skip
    for key, reason in pairs:
        if summary.get(key):
            out[reason] = summary[key]
    return out


def human_summary(summary: dict[str, Any]) -> str:
    """The summary as a few aligned lines: samples, tokens, bytes, ratio, speed, records by outcome."""
    skipped = skip_counts(summary)
    lines = [
        f"done      {summary['samples_written']:,} samples, {summary['tokens_written']:,} tokens written in "
        f"{_duration(summary['total_seconds'])} (capture {_duration(summary['capture_seconds'])})",
        f"bytes     {_size(summary['raw_bytes'])} raw -> {_size(summary['stored_bytes'])} stored"
        + (f" (ratio {summary['ratio']:.3f})" if summary["ratio"] else ""),
    ]
    if summary.get("tokens_per_s"):
        outside = summary.get("outside_forward_share")
        lines.append(
            f"speed     {summary['tokens_per_s']:,.0f} tokens/s, {summary['samples_per_s']:,.2f} samples/s"
            + (f"; {100 * outside:.1f}% of the capture time outside the forward" if outside is not None else "")
        )
    if "records_read" in summary:
        lines.append(
            f"records   {summary['records_read']:,} read: {summary['samples_written']:,} written, "
            f"{summary['already_committed_skipped']:,} already committed, {sum(skipped.values()):,} skipped"
            + (f" ({_reasons(skipped)})" if skipped else "")
        )
    if summary.get("records_modified"):
        lines.append(f"modified  {_reasons(summary['records_modified'])}")
    lines.append(f"manifest  {summary['manifest']}")
    if summary.get("capture_log"):
        lines.append(f"log       {summary['capture_log']} (plotted by `eagle-io report`)")
    return "\n".join(lines)


def nothing_written(summary: dict[str, Any], args: argparse.Namespace) -> str | None:
    """None when the dataset holds samples; else the message for a run that wrote none and found none
    committed: the main reason (most records) and what would change it."""
    if summary["samples_written"] or summary["already_committed_skipped"]:
        return None
    skipped = skip_counts(summary)
    if not skipped:
        where = f" below --limit {args.limit}" if args.limit is not None else ""
        return f"no sample written: the dataset holds no record{where} for this rank"
    reason, count = max(skipped.items(), key=lambda kv: (kv[1], kv[0]))
    hint = HINTS.get(reason, PARSE_HINT).format(**vars(args))
    return (
        f"no sample written: all {sum(skipped.values()):,} records read were skipped ({_reasons(skipped)}); "
        f"the main reason, {reason} ({count:,} records): {hint}"
    )
