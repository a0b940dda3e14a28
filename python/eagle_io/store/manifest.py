"""Reading and writing a dataset manifest on its own, without opening the shards it lists.

The manifest carries a CRC-32 ``checksum`` over its whole text (docs/FORMAT.md section 2), so a flipped
digit in ``metadata`` (``aux_layer_ids``, ``hidden_size``...) is detected like damage to a shard. Code
that only needs the metadata (the serving preflight, ``eagle-io merge``) reads it through
:func:`read_manifest`; code that writes a manifest (``eagle-io merge``) gets its bytes from
:func:`manifest_bytes`. The checks and the sealing are the Rust core's (``src/dataset/manifest.rs``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any

from .. import _native


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Loads the manifest file at ``path`` after checking its format, version, checksum and fields.

    Returns:
        The manifest as a dict (``format``, ``format_version``, ``writer``, ``schema``, ``metadata``,
        ``codec``, ``shards``, ``complete``), without its ``checksum``.

    Raises:
        CorruptRecordError: not JSON, not an eagle-io manifest, a field of the wrong type, or a checksum
            mismatch (the error names the file and the byte offset of the checksum digits).
        FormatVersionError: written by a newer format version.
        StorageError: the file cannot be read.
    """
    return _native.load_manifest(path)


def manifest_bytes(manifest: dict[str, Any]) -> bytes:
    """The bytes of a manifest file for ``manifest`` (a dict with the fields :func:`read_manifest`
    returns): pretty-printed JSON whose last member is its sealed ``checksum``.

    Raises:
        InvalidArgumentError: a field is missing or of the wrong type.
    """
    return _native.seal_manifest(manifest)


def data_fingerprint(manifests: Sequence[dict[str, Any]]) -> str:
    """SHA-256 (hex) identifying the data of one or several datasets, from their manifests alone (in order).

    Hashes, per manifest, its ``schema``, ``metadata`` and, per shard, ``samples``, ``tokens`` and ``index_crc32``
    (which covers every record's CRC-32 and sample id). Paths, writer version and codec settings are left out: a
    copied or re-compressed dataset keeps its fingerprint; any changed sample, added shard or different target does
    not. The one fingerprint of eagle-io: vocabulary maps, drafts' records and Loader states carry it.
    """
    h = hashlib.sha256()
    for m in manifests:
        view = {
            "schema": m["schema"],
            "metadata": m["metadata"],
            "shards": [[s["samples"], s["tokens"], s["index_crc32"]] for s in m["shards"]],
        }
        h.update(json.dumps(view, sort_keys=True, separators=(",", ":")).encode())
    return h.hexdigest()
