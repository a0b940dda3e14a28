"""Streaming readers for a top-level JSON list and for JSON Lines, with record byte offsets.

Both readers yield :class:`RawRecord` objects: the parsed JSON value of one record plus its
0-based record number and the byte offset where it starts, or, for a record that cannot be
parsed, the reason (``"invalid_json"``, ``"truncated"``, ...) instead of a value. They never
raise for bad input; :mod:`eagle_io.data.sources` decides whether to raise or to count.

The JSON-list reader keeps only a sliding window of the file in memory (about ``chunk_size``
plus the largest record), decoding one element at a time with ``json.JSONDecoder.raw_decode``.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

_WS = re.compile(r"[ \t\n\r]*")
_BOM = b"\xef\xbb\xbf"
_STRUCTURAL = frozenset(' \t\n\r,:[]{}"')


def _ran_out(exc: json.JSONDecodeError, text: str) -> bool:
    """True if decoding ``text`` failed only because it ends too early (more input could fix it).

    That is the case for an unterminated string, and for an error whose position is followed
    only by part of one token (``tru``, ``-12.5e``, ``\\u00``), i.e. by no structural character.
    """
    if exc.msg.startswith("Unterminated string"):
        return True
    return not _STRUCTURAL.intersection(text[exc.pos :])


@dataclass(frozen=True)
class RawRecord:
    """One record of a JSON list / JSONL file, parsed or not.

    Attributes:
        index: 0-based record number in the file (blank JSONL lines are not records).
        byte_offset: offset of the record's first byte (JSONL: the line's first byte).
        value: the parsed JSON value (``None`` when ``error`` is set).
        error: ``None`` for a parsed record, else a skip reason: ``"invalid_json"``,
            ``"truncated"`` (the file ends inside this record), ``"empty_file"``, ``"not_json"``.
        detail: human-readable description of the error.
        fatal: ``True`` when nothing after this record can be read (a JSON list cannot be
            re-synchronised after a syntax error).
    """

    index: int
    byte_offset: int
    value: Any = None
    error: str | None = None
    detail: str = ""
    fatal: bool = False


class _Fatal(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class _Window:
    """A decoded text window over a binary stream that tracks byte offsets of positions."""

    def __init__(self, stream: BinaryIO, chunk_size: int) -> None:
        self._stream = stream
        self._chunk = chunk_size
        self._utf8 = codecs.getincrementaldecoder("utf-8")("strict")
        self._decoder = json.JSONDecoder()
        self.buf = ""
        self.pos = 0
        self.eof = False
        self._mark = 0  # buf index whose byte offset is self._mark_bytes
        self._mark_bytes = 0
        self._bad_utf8: str | None = None  # set when the stream stopped at an invalid byte

    def _fill(self, want: int = 0) -> bool:
        """Append at least one chunk (or ``want`` bytes) to the window; ``False`` at EOF."""
        if self.eof:
            return False
        if self._mark:  # forget text before the last offset mark
            self.buf = self.buf[self._mark :]
            self.pos -= self._mark
            self._mark = 0
        data = self._stream.read(max(self._chunk, want))
        try:
            text = self._utf8.decode(data, final=not data)
        except UnicodeDecodeError as exc:
            # Keep the valid text before the bad byte and stop there: the record that reaches
            # this point is the one reported, with the byte offset of the bad byte.
            text = exc.object[: exc.start].decode("utf-8")
            self.eof = True
            if data:
                at = self._mark_bytes + len((self.buf[self._mark :] + text).encode("utf-8"))
                self._bad_utf8 = f"invalid UTF-8 at byte offset {at} ({exc.reason})"
        self.buf += text
        if not data:
            self.eof = True
        return bool(text)

    def ended(self, detail: str) -> _Fatal:
        """The error for input that stops before ``detail`` says it should."""
        if self._bad_utf8:
            return _Fatal("invalid_json", self._bad_utf8)
        return _Fatal("truncated", detail)

    def offset(self) -> int:
        """Byte offset of ``self.pos`` (must not move backwards between calls)."""
        self._mark_bytes += len(self.buf[self._mark : self.pos].encode("utf-8"))
        self._mark = self.pos
        return self._mark_bytes

    def skip_ws(self) -> bool:
        """Advance past whitespace; ``False`` if the file ends first."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                return True
            if not self._fill():
                return False

    def decode_value(self) -> Any:
        """Decode one JSON value at ``self.pos``; raise :class:`_Fatal` if it is malformed."""
        while True:
            try:
                value, end = self._decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                incomplete = _ran_out(exc, self.buf)
                if incomplete and self._fill(want=len(self.buf) - self.pos):
                    continue
                if incomplete:
                    raise self.ended(f"file ends inside this record ({exc.msg})") from exc
                raise _Fatal("invalid_json", f"{exc.msg} at char {exc.pos - self.pos} of the record") from exc
            if end >= len(self.buf) and self._fill():  # e.g. a number cut at the window's end
                continue
            self.pos = end
            return value


def _iter_json_list(stream: BinaryIO, chunk_size: int) -> Iterator[RawRecord]:
    win = _Window(stream, chunk_size)
    index = 0
    win.skip_ws()
    if win.buf.startswith("\ufeff", win.pos):
        win.pos += 1
        win.skip_ws()
    win.pos += 1  # the '[' seen by detect_layout
    expect_value = True  # after '[' or ','
    first = True
    while True:
        if not win.skip_ws():
            end = win.ended("file ends before the closing ']' of the top-level list")
            yield RawRecord(index, win.offset(), error=end.reason, detail=end.detail, fatal=True)
            return
        char = win.buf[win.pos]
        if char == "]" and (first or not expect_value):
            win.pos += 1
            break
        if not expect_value:
            if char != ",":
                yield RawRecord(
                    index,
                    win.offset(),
                    error="invalid_json",
                    fatal=True,
                    detail=f"expected ',' or ']' after record {index - 1}, found {char!r}",
                )
                return
            win.pos += 1
            expect_value = True
            continue
        start = win.offset()
        try:
            value = win.decode_value()
        except _Fatal as exc:
            yield RawRecord(index, start, error=exc.reason, detail=exc.detail, fatal=True)
            return
        yield RawRecord(index, start, value)
        index += 1
        expect_value = first = False
    if win.skip_ws() or win.ended("").reason != "truncated":
        yield RawRecord(
            index,
            win.offset(),
            error="invalid_json",
            fatal=True,
            detail="unexpected data after the closing ']' of the top-level list",
        )


def _iter_jsonl(stream: BinaryIO) -> Iterator[RawRecord]:
    offset = 0
    index = 0
    for lineno, line in enumerate(stream, start=1):
        start = offset
        offset += len(line)
        if lineno == 1 and line.startswith(_BOM):
            line = line[len(_BOM) :]
            start += len(_BOM)
        if not line.strip():
            continue
        try:
            value = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError as exc:
            detail = f"line {lineno}: invalid UTF-8 ({exc.reason})"
            yield RawRecord(index, start, error="invalid_json", detail=detail)
        except json.JSONDecodeError as exc:
            cut = not line.endswith(b"\n") and _ran_out(exc, exc.doc)
            yield RawRecord(
                index,
                start,
                error="truncated" if cut else "invalid_json",
                detail=f"line {lineno} column {exc.colno}: {exc.msg}",
            )
        else:
            yield RawRecord(index, start, value)
        index += 1


def detect_layout(stream: BinaryIO) -> str:
    """Return ``"json_list"``, ``"jsonl"``, ``"empty"`` or ``"unknown"`` and rewind ``stream``.

    The layout is chosen by the first non-whitespace byte (after an optional UTF-8 BOM):
    ``[`` -> a top-level JSON list, ``{`` -> JSON Lines. ``stream`` must be seekable.
    """
    head = b""
    while True:
        block = stream.read(4096)
        head = (head + block).lstrip(b" \t\r\n")
        if head.startswith(_BOM):
            head = head[len(_BOM) :].lstrip(b" \t\r\n")
        if head or not block:
            break
    stream.seek(0)
    if not head:
        return "empty"
    return {b"["[0]: "json_list", b"{"[0]: "jsonl"}.get(head[0], "unknown")


def iter_raw_records(stream: BinaryIO, *, chunk_size: int = 1 << 20) -> Iterator[RawRecord]:
    """Yield every record of a JSON-list or JSONL ``stream`` (binary, seekable) as a RawRecord.

    Bad input never raises here: it is reported as a RawRecord with ``error`` set. After a
    record with ``fatal=True`` nothing more is yielded.
    """
    layout = detect_layout(stream)
    if layout == "json_list":
        yield from _iter_json_list(stream, chunk_size)
    elif layout == "jsonl":
        yield from _iter_jsonl(stream)
    elif layout == "empty":
        yield RawRecord(0, 0, error="empty_file", detail="file is empty", fatal=True)
    else:
        yield RawRecord(
            0,
            0,
            error="not_json",
            fatal=True,
            detail="expected a top-level JSON list ('[') or JSON Lines ('{' per line)",
        )
