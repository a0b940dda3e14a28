"""Turn clean-up before a conversation is rendered with a chat template.

Decisions (from the shipped ShareGPT V3 split, 17,671 readable records):

* Consecutive turns of the same role are merged, non-empty contents joined with a blank line
  (``"\\n\\n"``): 180 such pairs (169 human-human: a user sending two messages; 11 gpt-gpt).
  Strict templates (Llama-2/Mistral) raise on non-alternating roles, and a merge keeps all text.
* Assistant turns before the first user turn are dropped: 6,358 records (36%) start with ``gpt``
  because the split cuts long chats into chunks, and 131 records are a single ``gpt`` turn.
  Such a reply answers a question that is not in the sample; templates that require a user turn
  first would raise. This is what EAGLE's and SpecForge's ShareGPT preprocessing do too.
* Trailing turns that carry no loss are dropped: non-assistant turns (14 records end with
  ``human``, 12 are one ``system`` turn) and assistant turns with blank content (ShareGPT has a few
  empty ``gpt`` replies). The model being causal, they change no earlier hidden state. Blank
  assistant turns elsewhere are kept, rendered but unmasked (see :mod:`eagle_io.data.chat`).

Each change is counted by the caller under the keys of the returned Counter.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

MERGE_SEPARATOR = "\n\n"


def prepare_turns(messages: Sequence[dict[str, str]]) -> tuple[list[dict[str, str]], Counter[str]]:
    """Merge same-role runs; drop assistant turns before the first user turn and trailing loss-free turns.

    Args:
        messages: ``[{"role": "system"|"user"|"assistant", "content": str}, ...]`` (not modified).

    Returns:
        ``(messages, changes)``: new message dicts, and counts of what was changed under
        ``merged_consecutive_turns``, ``dropped_leading_assistant_turns``, ``dropped_trailing_turns``.
        The returned list may hold no assistant turn (the caller rejects such a sample).
    """
    changes: Counter[str] = Counter()
    merged: list[dict[str, str]] = []
    for message in messages:
        if merged and merged[-1]["role"] == message["role"]:
            parts = [p for p in (merged[-1]["content"], message["content"]) if p]
            merged[-1]["content"] = MERGE_SEPARATOR.join(parts)
            changes["merged_consecutive_turns"] += 1
        else:
            merged.append({"role": message["role"], "content": message["content"]})
    first_user = next((i for i, m in enumerate(merged) if m["role"] == "user"), len(merged))
    kept = [m for i, m in enumerate(merged) if i > first_user or m["role"] != "assistant"]
    changes["dropped_leading_assistant_turns"] += len(merged) - len(kept)
    while kept and (kept[-1]["role"] != "assistant" or not kept[-1]["content"].strip()):
        kept.pop()
        changes["dropped_trailing_turns"] += 1
    return kept, +changes
