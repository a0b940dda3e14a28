"""Conversation sources: ShareGPT / OpenAI-messages records from JSON, JSONL or any iterable.

Every source is normalised to :class:`Conversation` objects whose ``index`` is the 0-based record
number in the source: the stable sample id used downstream. Skipped records keep their number,
so indices of yielded conversations may have gaps but never shift.

Record shapes (detected per record):

* ShareGPT: ``{"id": ..., "conversations": [{"from": ..., "value": str}, ...]}``
* OpenAI: ``{"id": ..., "messages": [{"role": ..., "content": str | [{"type": "text", "text": str}]}]}``

Roles are mapped with :data:`ROLE_MAP` (see its comment for why ``chatgpt``/``bing``/``bard``
are assistants). An unknown role is a record error (``"unknown_role"``), never dropped silently.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, BinaryIO, Literal

from eagle_io.data.json_stream import iter_raw_records
from eagle_io.data.stats import SkipStats

from ..errors import DatasetFormatError, InvalidArgumentError, StorageError

# ShareGPT V3 (unfiltered, cleaned, split) uses human/gpt for >99.9% of turns. The rest, seen in
# the shipped file: "system" (41 turns, always first: share-tool banners from ChatHub and
# TypingMind), "chatgpt" (8), "bing" (4), "bard" (2) - replies of those assistants in ChatHub
# exports, placed exactly where "gpt" would be - and "user" (2, where "human" would be).
ROLE_MAP: Mapping[str, str] = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "system": "system",
}

OnError = Literal["raise", "skip"]


@dataclass(frozen=True)
class Conversation:
    """One normalised conversation.

    Attributes:
        index: 0-based record number in the source (stable sample id).
        id: the record's own ``id`` as a string, or ``None`` if it has none. Not unique in
            ShareGPT (123 duplicated ids in the shipped file): use ``index`` as the key.
        messages: ``[{"role": "system" | "user" | "assistant", "content": str}, ...]`` in source
            order, unmerged and unfiltered (turn clean-up happens in :mod:`eagle_io.data.chat`).
        byte_offset: offset of the record's first byte in its source file (``None`` for other sources);
            ``eagle-io generate`` estimates the records of a file from it.
    """

    index: int
    id: str | None
    messages: list[dict[str, str]]
    byte_offset: int | None = field(default=None, compare=False)


class _BadRecord(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
    ):
        return "".join(p["text"] for p in content)
    raise _BadRecord("non_string_content", f"{where}: content is {type(content).__name__}, not text")


def conversation_from_record(record: Any, index: int, role_map: Mapping[str, str] = ROLE_MAP) -> Conversation:
    """Normalise one parsed record (ShareGPT or OpenAI shape) to a :class:`Conversation`.

    Raises:
        DatasetFormatError: (with ``path``/``byte_offset`` ``None``) if the record has the wrong
            shape: not an object, no or both of ``conversations``/``messages``, a turn that is not
            an object or lacks its keys, non-text content, an unknown role, or a non-scalar id.
    """
    try:
        return _convert(record, index, role_map)
    except _BadRecord as exc:
        raise DatasetFormatError(None, index, None, exc.reason, exc.detail) from None


def _convert(record: Any, index: int, role_map: Mapping[str, str]) -> Conversation:
    if not isinstance(record, Mapping):
        raise _BadRecord("not_an_object", f"record is a JSON {type(record).__name__}, not an object")
    if ("conversations" in record) == ("messages" in record):
        raise _BadRecord("bad_shape", "record needs exactly one of 'conversations' (ShareGPT) or 'messages'")
    key, role_key, text_key = (
        ("conversations", "from", "value") if "conversations" in record else ("messages", "role", "content")
    )
    turns = record[key]
    if not isinstance(turns, list):
        raise _BadRecord("bad_shape", f"'{key}' is {type(turns).__name__}, not a list")
    raw_id = record.get("id")
    if raw_id is not None and (isinstance(raw_id, bool) or not isinstance(raw_id, (str, int))):
        raise _BadRecord("bad_id", f"'id' is {type(raw_id).__name__}, not a string or integer")
    messages = []
    for t, turn in enumerate(turns):
        where = f"{key}[{t}]"
        if not isinstance(turn, Mapping) or role_key not in turn or text_key not in turn:
            raise _BadRecord("bad_turn", f"{where} is not an object with '{role_key}' and '{text_key}'")
        role = turn[role_key]
        if not isinstance(role, str) or role not in role_map:
            raise _BadRecord("unknown_role", f"{where}: unknown role {role!r}")
        messages.append({"role": role_map[role], "content": _text(turn[text_key], where)})
    return Conversation(index=index, id=None if raw_id is None else str(raw_id), messages=messages)


def iter_conversations(
    source: str | os.PathLike[str] | Iterable[Any],
    *,
    on_error: OnError = "raise",
    stats: SkipStats | None = None,
    role_map: Mapping[str, str] = ROLE_MAP,
    chunk_size: int = 1 << 20,
) -> Iterator[Conversation]:
    """Yield normalised conversations from a file or an iterable of records.

    Args:
        source: a path to a JSON file holding a top-level list of records or to a JSON Lines
            file (one record per non-blank line; told apart by the first non-blank byte), or
            any iterable of record dicts (e.g. a Hugging Face ``datasets.Dataset``).
        on_error: ``"raise"`` raises :class:`DatasetFormatError` at the first bad record;
            ``"skip"`` counts it in ``stats.skipped`` by reason and goes on.
        stats: where skips are counted (required for ``on_error="skip"``).
        role_map: source role -> ``system``/``user``/``assistant``; defaults to :data:`ROLE_MAP`.
        chunk_size: bytes read at a time from a JSON-list file (memory use is about this plus
            the largest record).

    Raises:
        DatasetFormatError: on a bad record under ``"raise"``; under ``"skip"`` too when the file
            itself is unreadable past that point: an empty or non-JSON file, or a syntax error
            inside a top-level JSON list (the rest cannot be re-synchronised). A JSON list cut
            short (the last record ``"truncated"``) is counted and ends the iteration.
        ValueError: ``on_error`` not in ``{"raise", "skip"}``, or ``"skip"`` without ``stats``.
    """
    if on_error not in ("raise", "skip"):
        raise InvalidArgumentError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
    if on_error == "skip" and stats is None:
        raise InvalidArgumentError("on_error='skip' needs a SkipStats to count skipped records")
    if isinstance(source, (str, os.PathLike)):
        yield from _iter_file(os.fspath(source), on_error, stats, role_map, chunk_size)
        return
    for index, record in enumerate(source):
        try:
            yield _convert(record, index, role_map)
        except _BadRecord as exc:
            if on_error == "raise":
                raise DatasetFormatError(None, index, None, exc.reason, exc.detail) from None
            stats.skip(exc.reason, index)  # type: ignore[union-attr]


def open_source(path: str | os.PathLike[str]) -> BinaryIO:
    """Opens the source file at ``path`` for reading (binary), as every reader of a source does.

    Raises:
        StorageError: the file cannot be opened (missing, a directory, not readable), naming it and the reason.
    """
    try:
        return open(path, "rb")
    except OSError as e:
        raise _unreadable(path, e) from e


def _unreadable(path: str | os.PathLike[str], e: OSError) -> StorageError:
    err = StorageError(
        f"cannot read the dataset {os.fspath(path)}: {e.strerror or e}; pass a ShareGPT / OpenAI-messages JSON or "
        "JSONL file"
    )
    err.path, err.errno = os.fspath(path), e.errno
    return err


def _iter_file(
    path: str, on_error: OnError, stats: SkipStats | None, role_map: Mapping[str, str], chunk_size: int
) -> Iterator[Conversation]:
    with open_source(path) as stream:
        for raw in iter_raw_records(stream, chunk_size=chunk_size):
            reason, detail = raw.error, raw.detail
            if reason is None:
                try:
                    yield replace(_convert(raw.value, raw.index, role_map), byte_offset=raw.byte_offset)
                    continue
                except _BadRecord as exc:
                    reason, detail = exc.reason, exc.detail
            skippable = not raw.fatal or reason == "truncated"
            if on_error == "raise" or not skippable:
                raise DatasetFormatError(path, raw.index, raw.byte_offset, reason, detail)
            stats.skip(reason, raw.index)  # type: ignore[union-attr]


def count_records(path: str | os.PathLike[str], limit: int | None = None) -> int:
    """Records of the JSON list / JSONL file at ``path`` below index ``limit`` (all when None), malformed ones
    included: one streaming pass over the file (about 170 MB/s on one core) that stops at ``limit``, for
    progress totals. Never raises for bad content (an unreadable tail ends the count).

    Raises:
        StorageError: the file cannot be opened or read.
    """
    n = 0
    with open_source(path) as stream:
        try:
            for raw in iter_raw_records(stream):
                if limit is not None and raw.index >= limit:
                    break
                n += 1
        except OSError as e:
            raise _unreadable(path, e) from e
    return n
