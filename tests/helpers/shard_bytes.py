"""The one parser of shard bytes the tests use (docs/FORMAT.md section 4), built on the pure-Python reference
reader's structs (``eagle_io.store.reference``: HEADER, FOOTER, ENTRY), so no test spells an offset itself."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

from eagle_io.store import reference as R

FOOTER_MAGIC = b"EIOINDX\0"


def layout(shard: Path | bytes) -> dict:
    """Byte regions of a committed shard: ``data`` (its bytes), ``schema`` (parsed), ``data_start`` (first record
    byte), ``index_offset``, ``index_len``, ``index_crc32``, ``records`` ([(sample_id, offset, length)]) and
    ``tokens`` ([n_tokens] per record), from its header, footer and index."""
    data = shard if isinstance(shard, bytes) else shard.read_bytes()
    _, _, schema_len, _, _ = R.HEADER.unpack_from(data, 0)
    index_offset, index_len, n, index_crc32, _, magic = R.FOOTER.unpack_from(data, len(data) - R.FOOTER.size)
    assert magic == FOOTER_MAGIC, "no footer: not a committed shard"
    entries = [R.ENTRY.unpack_from(data, index_offset + R.ENTRY.size * i) for i in range(n)]
    return {
        "data": data,
        "schema": json.loads(data[R.HEADER.size : R.HEADER.size + schema_len]),
        "data_start": R.HEADER.size + schema_len,
        "index_offset": index_offset,
        "index_len": index_len,
        "index_crc32": index_crc32,
        "records": [(e[0], e[1], e[2]) for e in entries],
        "tokens": [e[3] for e in entries],
    }


def token_bytes(schema: dict) -> int:
    """Decoded bytes per token of a schema (``{"tensors": [{"dtype", "width"}...]}``)."""
    return sum(
        (t["width"] or 1) * torch.empty(0, dtype=getattr(torch, t["dtype"])).element_size() for t in schema["tensors"]
    )


def shard_entry(shard: Path | bytes, file: str | None = None) -> dict:
    """The manifest entry of a committed shard (docs/FORMAT.md 2), from its footer and index. ``file`` defaults to
    ``shards/<name>`` for a path."""
    lay = layout(shard)
    tokens = sum(lay["tokens"])
    return {
        "file": file if file is not None else f"shards/{shard.name}",  # type: ignore[union-attr]
        "samples": len(lay["records"]),
        "tokens": tokens,
        "bytes": len(lay["data"]),
        "raw_bytes": tokens * token_bytes(lay["schema"]),
        "index_crc32": lay["index_crc32"],
    }


def entry_for(shard: bytes, file: str) -> dict:
    """:func:`shard_entry` of arbitrary (fuzzed) bytes, as far as they parse: the fields that do not parse are 0, so
    that a reader goes past the manifest checks into the shard itself."""
    footer = shard[-R.FOOTER.size :] if len(shard) >= R.FOOTER.size else bytes(R.FOOTER.size)
    _, _, n, index_crc32, _, _ = R.FOOTER.unpack(footer)
    try:
        return {**shard_entry(shard, file), "samples": n}
    except (AssertionError, ValueError, KeyError, TypeError, AttributeError, IndexError, OverflowError, struct.error):
        return {
            "file": file,
            "samples": n,
            "tokens": 0,
            "bytes": len(shard),
            "raw_bytes": 0,
            "index_crc32": index_crc32,
        }
