"""Per-sample token and supervised-token counts, reading only each record's ``loss_mask`` tensor.

``eagle-io inspect`` and ``eagle-io report`` need the supervised share of every sample without decoding its
hidden states (gigabytes per thousand samples). Each record's layout (docs/FORMAT.md section 4.4) puts every
tensor's chunk table first, then the payloads tensor by tensor, so the ``loss_mask`` chunks can be read on their
own: per sample, one small positioned read of the chunk tables and one of the mask payload (about ``L / 20``
bytes once zstd-compressed). These reads skip the record's CRC-32, which covers the whole record:
``eagle-io verify`` checks that; a mask that does not decode is reported here, not raised.

Needs ``zstandard`` (the ``reference`` extra), whose pure-Python decoding of the format this module reuses.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..errors import MissingDataPackageError
from . import layout
from .manifest import read_manifest

MASK = "loss_mask"


class _Unreadable(ValueError):
    """Internal: a mask that does not decode; caught by :func:`mask_counts`, which lists it in ``unreadable``."""


HEAD_READ = 1024  # bytes read first per record: the chunk tables of most records fit (more is read when not)


@dataclass
class MaskCounts:
    """Counts per sample, in dataset position order.

    Attributes:
        sample_ids: ``[N]`` int64.
        lengths: ``[N]`` int64, tokens ``L`` per sample (from the index).
        supervised: ``[N]`` int64, tokens with ``loss_mask != 0``; -1 where the mask could not be read.
        unreadable: ``(shard path, sample_id, message)`` of every mask that did not decode.
        bytes_read: bytes read from shard payloads (chunk tables and mask payloads).
    """

    sample_ids: np.ndarray
    lengths: np.ndarray
    supervised: np.ndarray
    unreadable: list[tuple[str, int, str]] = field(default_factory=list)
    bytes_read: int = 0


manifest_file = layout.manifest_file  # ``path`` or ``path/manifest.json``; refuses an unmerged multi-writer root


def _reference():
    try:
        from . import reference
    except ImportError as e:  # zstandard is missing
        raise MissingDataPackageError(
            "zstandard", f"reading loss masks alone needs the zstandard module ({e})"
        ) from None
    return reference


def mask_counts(path: str | os.PathLike[str], *, progress: Callable[[int, int], None] | None = None) -> MaskCounts:
    """Token and supervised-token counts of every sample of the dataset at ``path``.

    Args:
        path: a dataset directory or manifest file.
        progress: called as ``progress(samples_done, samples_total)`` after each shard.

    Returns:
        A :class:`MaskCounts`. ``supervised`` is all -1 when the schema has no ``loss_mask [L]`` tensor of 1-byte
        elements.

    Raises:
        MissingDataPackageError: ``zstandard`` is not installed.
        CorruptRecordError, FormatVersionError, StorageError: the manifest cannot be trusted (as
            :func:`eagle_io.store.manifest.read_manifest`); ReferenceFormatError (an EagleIOError): a shard's header,
            footer or index breaks docs/FORMAT.md.
    """
    ref = _reference()
    mpath = manifest_file(path)
    manifest = read_manifest(mpath)
    schema = ref._parse_schema(manifest["schema"], mpath, None)
    names = [s[0] for s in schema]
    mask_at = names.index(MASK) if MASK in names else None
    if mask_at is not None and (schema[mask_at][1].itemsize != 1 or schema[mask_at][2] is not None):
        mask_at = None
    total = sum(s["samples"] for s in manifest["shards"])
    ids, lengths, supervised = (np.full(total, -1, np.int64) for _ in range(3))
    out = MaskCounts(ids, lengths, supervised)
    pos = 0
    for listed in manifest["shards"]:
        shard = ref._Shard(os.path.join(os.path.dirname(mpath), listed["file"]), listed, schema)
        with open(shard.path, "rb") as f:
            for sample_id, offset, length, n_tokens, _crc, _key in shard.entries:
                ids[pos], lengths[pos] = sample_id, n_tokens
                if mask_at is not None:
                    try:
                        supervised[pos] = _count(ref, f.fileno(), offset, length, n_tokens, mask_at, len(schema), out)
                    except (_Unreadable, ValueError, ref.zstandard.ZstdError) as e:  # and numpy's size errors
                        out.unreadable.append((shard.path, sample_id, str(e)))
                pos += 1
        if progress:
            progress(pos, total)
    return out


def _count(ref, fd: int, offset: int, length: int, n_tokens: int, mask_at: int, n_tensors: int, out) -> int:
    """Supervised tokens of one record, from its chunk tables and its mask chunks (raises _Unreadable)."""
    head = os.pread(fd, min(length, HEAD_READ), offset)
    magic, count, _, rec_tokens = ref.RECORD.unpack_from(head, 0)
    if magic != b"EREC" or count != n_tensors or rec_tokens != n_tokens:
        raise _Unreadable(f"record header {magic!r}, {count} tensors, {rec_tokens} tokens disagrees with the index")
    at, tables = ref.RECORD.size, []
    for _ in range(n_tensors):
        if at + ref.TENSOR.size > len(head):
            head += os.pread(fd, min(length, at + ref.TENSOR.size + HEAD_READ) - len(head), offset + len(head))
        n_chunks, _ = ref.TENSOR.unpack_from(head, at)
        end = at + ref.TENSOR.size + ref.CHUNK.size * n_chunks
        if end > length:
            raise _Unreadable(f"chunk table of {n_chunks} chunks overruns the record of {length} bytes")
        if end > len(head):
            head += os.pread(fd, end - len(head), offset + len(head))
        tables.append([ref.CHUNK.unpack_from(head, at + ref.TENSOR.size + ref.CHUNK.size * j) for j in range(n_chunks)])
        at = end
    start = at + sum(sum(desc[5:]) for chunks in tables[:mask_at] for desc in chunks)
    size = sum(sum(desc[5:]) for desc in tables[mask_at])
    if start + size > length:
        raise _Unreadable("loss_mask payload overruns the record")
    payload = os.pread(fd, size, offset + start)
    out.bytes_read += len(head) + len(payload)
    supervised, rows, at = 0, 0, 0
    for desc in tables[mask_at]:
        stored = sum(desc[5:])
        data = ref._decode_chunk(desc, payload[at : at + stored], desc[4], 1)
        supervised += int(np.count_nonzero(np.frombuffer(data, np.uint8)))
        rows, at = rows + desc[4], at + stored
    if rows != n_tokens:
        raise _Unreadable(f"loss_mask chunks cover {rows} rows, expected {n_tokens}")
    return supervised
