"""Object storage from Python (docs/STORAGE.md): uploading a committed local dataset, listing orphan objects, and
this process's request counters. Reading needs nothing here: every dataset path may be an ``s3://bucket/prefix`` URL."""

from __future__ import annotations

import os
from dataclasses import dataclass

from .. import _native
from . import layout
from .manifest import read_manifest


@dataclass(frozen=True)
class UploadReport:
    """What :func:`upload_dataset` did: shard files sent now, those not sent again (the remote manifest lists them,
    or an interrupted upload completed them: the same size and last bytes), and the bytes sent."""

    uploaded: list[str]
    skipped: list[str]
    bytes: int


def upload_dataset(path: str | os.PathLike[str], url: str) -> UploadReport:
    """Uploads the committed dataset at ``path`` (a directory with ``manifest.json`` or a manifest file) to the object
    prefix ``url`` (``s3://bucket/run``): each shard the remote manifest does not list yet as a multipart upload
    (aborted on failure), then the manifest last with a conditional PUT (create-only for a new dataset, if-match on
    the remote manifest's ETag for an update). Running it again after an interruption sends only what is missing. A
    shard is never sent over an object that differs from it.

    Raises:
        IncompatibleDatasetError: the remote manifest is not an earlier state of this dataset (other schema or
            shards), another writer changed it during the upload, or another object stands under a shard's name
            (checked before each shard is sent; two writers sending the same name at once are not detected).
        ObjectStorageError: a request failed after its retries (names the object's URL and the HTTP status).
        StorageError, CorruptRecordError: the local manifest or a shard file cannot be read.
    """
    uploaded, skipped, nbytes = _native.upload_dataset(layout.manifest_file(path), url)
    return UploadReport(uploaded, skipped, nbytes)


def storage_stats() -> dict[str, int]:
    """This process's object-storage counters: ``requests`` (HTTP requests sent, retries included), ``retried``
    (responses 5xx / 429, timeouts and connection errors, retried with exponential backoff) and ``bytes`` (payload
    bytes read)."""
    return _native.storage_stats()


def orphan_objects(url: str) -> list[tuple[str, int]]:
    """The objects under the dataset prefix ``url`` (and its ``shards/``) that no manifest there names: shards of an
    upload interrupted after the shard's upload completed but before the manifest listed it (a shard whose multipart
    upload was interrupted leaves no object; S3 keeps its parts until aborted, which a lifecycle rule
    ``AbortIncompleteMultipartUpload`` does: docs/STORAGE.md). Nothing is deleted. Returns ``[(url, bytes)]`` in
    key order.

    Raises:
        ObjectStorageError: a LIST or GET failed (names the URL and the HTTP status).
        CorruptRecordError: a manifest under the prefix cannot be trusted.
    """
    prefix = url.rstrip("/")
    if prefix.endswith(".json"):
        prefix = prefix.rsplit("/", 1)[0]
    objects = _native.list_objects(prefix, [layout.SHARD_DIR])
    top = [u for u, _ in objects if u.rsplit("/", 1)[0] == prefix]
    manifests = [u for u in top if u.endswith("/" + layout.MANIFEST) or layout.RANK_MANIFEST.match(u.rsplit("/", 1)[1])]
    named = set(manifests)
    for m in manifests:
        named.update(f"{prefix}/{s['file']}" for s in read_manifest(m)["shards"])
    return [(u, n) for u, n in objects if u not in named]
