"""Uploading a capture to object storage while it runs (docs/STORAGE.md): the capture writes to a local staging
directory; each shard is uploaded when it commits (:func:`eagle_io.store.remote.upload_dataset`: multipart, then
the manifest with a conditional PUT), and its staged copy removed once the remote manifest lists it. Followers of
the remote dataset (``ShardDataset(url, follow=True)``) see the shards as they land.

Staging is bounded: :meth:`StagedUpload.wait_for_room` blocks the capture while the committed shards awaiting
upload exceed ``staging_bytes`` (the shard being written comes on top)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from .. import _native, defaults
from ..errors import IncompatibleDatasetError, InvalidArgumentError, ObjectStorageError
from . import layout
from .manifest import read_manifest
from .remote import UploadReport, upload_dataset


def default_staging(url: str) -> str:
    """The staging directory of a capture to ``url`` when none is given: ``./eagle-io-staging/BUCKET/PREFIX``."""
    return os.path.join("eagle-io-staging", url.split("://", 1)[1].strip("/"))


def local_dir(out_dir: str | os.PathLike[str], staging: str | os.PathLike[str] | None = None) -> str:
    """The local directory a capture into ``out_dir`` writes its files in: ``out_dir`` itself, or for an object URL
    ``staging`` (default :func:`default_staging`)."""
    if not layout.is_url(out_dir):
        return os.fspath(out_dir)
    return os.fspath(staging) if staging is not None else default_staging(os.fspath(out_dir))


def combine_upload_reports(parts: list[dict[str, object] | None]) -> dict[str, object] | None:
    """One report of several writers' uploads to one dataset (:meth:`StagedUpload.finish`'s, one per writer; None
    for a writer with nothing uploaded): ``uploaded`` joined, ``bytes`` summed, ``blocked_seconds`` the largest.
    None when no writer uploaded (a local capture)."""
    done = [p for p in parts if p]
    if not done:
        return None
    return {
        "url": done[0]["url"],
        "staging": done[0]["staging"],
        "uploaded": [f for p in done for f in p["uploaded"]],  # type: ignore[attr-defined]
        "bytes": sum(p["bytes"] for p in done),  # type: ignore[misc]
        "blocked_seconds": max(p["blocked_seconds"] for p in done),  # type: ignore[type-var]
    }


def fetch_remote_manifest(url: str, staging_manifest: str | os.PathLike[str]) -> bool:
    """Copies the manifest of the same file name (``manifest.json``, or a rank's ``manifest.rNNNNN.json``) from the
    remote dataset prefix ``url`` to ``staging_manifest`` (an atomic write) when the staging directory has none, so a
    capture resumed on another machine (or after its staging was lost) continues the remote dataset; its shards are
    then read remotely. Returns whether it copied one.

    Raises:
        ObjectStorageError: the request failed (other than a 404: no such remote manifest yet, nothing copied).
        CorruptRecordError: the remote manifest cannot be trusted.
    """
    if os.path.exists(staging_manifest):
        return False
    remote = f"{url.rstrip('/')}/{os.path.basename(os.fspath(staging_manifest))}"
    try:
        manifest = read_manifest(remote)
    except ObjectStorageError as e:
        if e.status == 404:
            return False
        raise
    from .manifest import manifest_bytes

    os.makedirs(os.path.dirname(os.fspath(staging_manifest)) or ".", exist_ok=True)
    layout.write_atomic(staging_manifest, manifest_bytes(manifest))
    return True


def stage_remote_manifests(url: str, staging: str | os.PathLike[str], mine: list[str], *, resume: bool) -> list[str]:
    """Looks at the object prefix ``url`` before a capture into it starts (before a target is loaded): ``mine`` are
    the manifests this capture's writers keep (``manifest.json`` for one writer, else their ``manifest.rNNNNN.json``).

    - A prefix holding a capture by another number of writers (rank manifests where this run has one writer, or a
      single writer's ``manifest.json`` alone where it has several) is refused: this run's shards would take the
      names of that capture's.
    - Without ``resume``, a prefix holding any of ``mine`` is refused.
    - With ``resume``, each of ``mine`` the prefix holds is copied into ``staging`` where the staging has none of
      that name (:func:`fetch_remote_manifest`), so the resume checks and the writers see the remote dataset; where
      the staging has one, it must be the remote one or a later state of it (the same schema, the remote's shards
      first), else it is refused as another run's or a stale staging.

    Returns the names of every manifest directly under the prefix, sorted.

    Raises:
        InvalidArgumentError: a capture of ``mine`` there without ``resume``, or one by another number of writers.
        IncompatibleDatasetError: a staged manifest that is not the remote one or a later state of it.
        ObjectStorageError: the LIST or a GET failed (names the URL and the HTTP status).
        CorruptRecordError: a remote manifest cannot be trusted.
    """
    root = url.rstrip("/")
    listed = (u[len(root) + 1 :] for u, _ in _native.list_objects(root, []))
    names = sorted(n for n in listed if n == layout.MANIFEST or layout.RANK_MANIFEST.match(n))
    ranks = [n for n in names if n != layout.MANIFEST]
    several = any(n != layout.MANIFEST for n in mine)
    if (ranks and not several) or (names == [layout.MANIFEST] and several):
        raise InvalidArgumentError(
            f"{root} holds a capture by {len(ranks) or 1} writer(s) ({', '.join(names[:3])}"
            f"{', ...' if len(names) > 3 else ''}) and this run has {len(mine)} ({', '.join(mine[:3])}"
            f"{', ...' if len(mine) > 3 else ''}): its shards would be written over; continue it with the writer "
            "count it was captured with, or write to another prefix"
        )
    held = [n for n in mine if n in names]
    if held and not resume:
        raise InvalidArgumentError(
            f"{root} already holds a capture ({root}/{held[0]}): pass --resume (resume=True) to continue it, or write "
            "the new one to another prefix"
        )
    for name in held:
        staged = os.path.join(staging, name)
        if fetch_remote_manifest(root, staged):
            continue
        ours, theirs = read_manifest(staged), read_manifest(f"{root}/{name}")
        n = len(theirs["shards"])
        if ours["schema"] != theirs["schema"] or ours["shards"][:n] != theirs["shards"]:
            raise IncompatibleDatasetError(
                f"{staged} is not {root}/{name} nor a later state of it (another run's staging, or the capture went "
                f"on elsewhere): delete {staging} to resume from {root} alone, or stage elsewhere with --staging"
            )
    return names


class StagedUpload:
    """Uploads the committed shards of the capture writing ``staging_manifest`` to the prefix ``url`` from a
    background thread, as they commit, then removes their staged copies.

    Args:
        staging_manifest: the capture's local manifest file (it may not exist yet).
        url: the remote dataset prefix (``s3://bucket/run``).
        staging_bytes: committed bytes awaiting upload at which :meth:`wait_for_room` blocks
            (default :data:`eagle_io.defaults.STAGING_BYTES`).
        poll_s: seconds between two looks at the local manifest when nothing wakes the thread.

    Attributes:
        uploaded: shard files uploaded by this object, in order; ``bytes``: their bytes.
        blocked_seconds: time :meth:`wait_for_room` held the capture.

    Raises:
        InvalidArgumentError: ``staging_bytes`` < 1 or ``url`` not an object URL.
    """

    def __init__(
        self,
        staging_manifest: str | os.PathLike[str],
        url: str,
        *,
        staging_bytes: int = defaults.STAGING_BYTES,
        poll_s: float = 0.2,
    ) -> None:
        if type(staging_bytes) is not int or staging_bytes < 1:
            raise InvalidArgumentError(f"staging_bytes must be an integer >= 1, not {staging_bytes!r}")
        if not layout.is_url(url):
            raise InvalidArgumentError(f"{url}: not an object-storage URL (s3://bucket/prefix)")
        self.manifest = Path(staging_manifest)
        self.url = url
        self.staging_bytes = staging_bytes
        self.poll_s = poll_s
        self.uploaded: list[str] = []
        self.bytes = 0
        self.blocked_seconds = 0.0
        self._synced: tuple[int, bool] | None = None  # (shards, complete) of the manifest last uploaded
        self._staged = 0
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="eagle-io-upload", daemon=True)
        self._thread.start()

    def _sync(self) -> None:
        """Uploads what the local manifest lists beyond the remote one (and the manifest itself when it changed),
        then removes the staged copies of the shards the remote manifest lists."""
        if not self.manifest.exists():
            return
        local = read_manifest(self.manifest)
        state = (len(local["shards"]), bool(local["complete"]))
        if state != self._synced:
            report: UploadReport = upload_dataset(self.manifest, self.url)
            self.uploaded += report.uploaded
            self.bytes += report.bytes
            self._synced = state
        staged = 0
        listed = local["shards"][: self._synced[0]] if self._synced else []
        for shard in listed:
            copy = self.manifest.parent / shard["file"]
            if copy.exists():
                copy.unlink()
        for shard in local["shards"][len(listed) :]:
            if (self.manifest.parent / shard["file"]).exists():
                staged += int(shard["bytes"])
        with self._cond:
            self._staged = staged
            self._cond.notify_all()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._sync()
                self._stop.wait(self.poll_s)
        except BaseException as e:  # handed to the capture by wait_for_room / finish
            with self._cond:
                self._error = e
                self._cond.notify_all()

    def wait_for_room(self) -> None:
        """Blocks while the committed shards awaiting upload exceed ``staging_bytes``.

        Raises:
            ObjectStorageError, IncompatibleDatasetError: the upload thread failed (its error, re-raised here).
        """
        t0 = time.perf_counter()
        with self._cond:
            while self._error is None and self._staged > self.staging_bytes:
                self._cond.wait(self.poll_s)
            if self._error is not None:
                raise self._error
        self.blocked_seconds += time.perf_counter() - t0

    def finish(self) -> dict[str, object]:
        """After the capture closed (its manifest complete): uploads what is left and the final manifest, removes
        the staged shards. Returns ``url``, ``staging``, ``uploaded`` (shard files), ``bytes``, ``blocked_seconds``.

        Raises:
            ObjectStorageError, IncompatibleDatasetError: an upload failed (the staged shards not uploaded stay, so
                a rerun with ``resume=True`` completes it).
        """
        self._stop.set()
        self._thread.join()
        if self._error is not None:
            raise self._error
        self._sync()
        return {"url": self.url, "staging": str(self.manifest.parent), "uploaded": list(self.uploaded),
                "bytes": self.bytes, "blocked_seconds": self.blocked_seconds}  # fmt: skip
