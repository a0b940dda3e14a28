"""Training while a capture runs: ``ShardDataset(paths, follow=True)`` returns a :class:`FollowingShardDataset`, an
iterable view that yields each sample once as soon as the shard holding it is committed, and ends when every
followed capture's manifest is marked ``complete``.

Only shards a manifest lists are read (docs/FORMAT.md section 1: a shard is listed after it was renamed and synced,
and the manifest is replaced atomically), through :class:`eagle_io.Dataset`, which is reopened when the manifest
lists more samples (positions only grow, so the ones read before keep their numbers). What a capture has committed
and whether it is complete comes from :func:`capture_progress` alone, from the manifest: a source that is not a
local directory replaces that one function.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .. import defaults
from ..errors import (
    CaptureStalledError,
    CorruptRecordError,
    IncompatibleDatasetError,
    InvalidArgumentError,
    ObjectStorageError,
)
from ..store import layout
from ..store.eagle3 import check_eagle3_dataset
from ..store.manifest import read_manifest
from ..store.reader import Dataset, check_flag
from .items import SkippedRecord, UnsupervisedSample, _check_compatible, check_feed_options, expand_paths, read_item

log = logging.getLogger("eagle_io.feed")


@dataclass(frozen=True)
class CaptureProgress:
    """What a capture has committed: ``samples`` and ``shards`` its manifest lists, and whether the manifest is
    marked ``complete`` (its writer closed)."""

    samples: int
    shards: int
    complete: bool


def manifest_to_follow(path: str | os.PathLike[str]) -> str:
    """The manifest a followed path stands for, whether the capture created it yet or not: a ``.json`` path is a
    manifest file, anything else a dataset root (its ``manifest.json``); an object URL likewise
    (``s3://bucket/run/manifest.json``)."""
    p = os.fspath(path)
    if layout.is_url(p):
        return layout.manifest_file(p)
    return p if p.endswith(".json") and not os.path.isdir(p) else os.path.join(p, layout.MANIFEST)


def capture_progress(manifest: str) -> CaptureProgress | None:
    """The committed shards and completeness of the capture writing ``manifest`` (a path from
    :func:`manifest_to_follow`), read from the manifest alone; None while the manifest does not exist yet.

    Raises:
        CorruptRecordError, FormatVersionError, StorageError: the manifest exists but cannot be read or trusted
            (ObjectStorageError: a request for a remote one failed, other than with 404).
    """
    if layout.is_url(manifest):
        try:
            m = read_manifest(manifest)
        except ObjectStorageError as e:
            if e.status == 404:  # the capture has not uploaded it yet
                return None
            raise
    elif not os.path.exists(manifest):
        return None
    else:
        m = read_manifest(manifest)
    return CaptureProgress(sum(int(s["samples"]) for s in m["shards"]), len(m["shards"]), bool(m["complete"]))


class FollowingShardDataset(torch.utils.data.IterableDataset):
    """An iterable view of one or several captures that may still be running (``ShardDataset(paths,
    follow=True, ...)``): every sample of every committed shard, once, as dicts like ``ShardDataset[i]``
    (``input_ids [L]`` int64, ``loss_mask [L]`` int64, ``aux_hidden_states [L, k*H]``, ``hidden_states [L, H]``,
    further schema tensors, ``sample_id``, ``dataset_index``), in commit order per capture, the captures
    interleaved as their shards commit. Iteration polls each manifest every ``poll_s`` seconds and ends when every
    capture's manifest is marked ``complete`` and all its samples were yielded. A capture whose manifest does
    not exist yet is waited for.

    Rank and DataLoader-worker split: sample position ``p`` of a capture goes to rank ``r`` of ``world_size``
    and, within it, to worker ``w`` of ``num_workers`` when ``p % (world_size * num_workers) == r * num_workers +
    w``, so ranks and workers read disjoint samples and together read each once. Batch with
    ``DataLoader(follower, batch_size=B, collate_fn=PaddingCollator())`` (the ranks' step counts may differ by
    one batch per worker at the end: use ``join`` or stop on the first rank that ends, under DDP).

    Args:
        paths: dataset roots (their ``manifest.json``) or manifest files, created by the capture or not yet;
            an existing root without ``manifest.json`` stands for its per-rank manifests at construction.
        max_length, filter, threads, on_corrupt, mix_precisions, cache_dir, cache_bytes: as for
            :class:`eagle_io.feed.ShardDataset`; a sample skipped
            under ``on_corrupt="skip"`` is left out (never replaced), logged and appended to :attr:`skipped`
            (``item`` is its position in its capture). A sample that ``max_length`` truncation leaves with no
            supervised token is left out the same way, logged and appended to :attr:`unsupervised`
            (:class:`eagle_io.feed.UnsupervisedSample`, ``item`` its position in its capture), as the eagle-io
            collators leave it out of a ``ShardDataset`` batch.
        poll_s: seconds between two looks at the manifests (default :data:`eagle_io.defaults.FOLLOW_POLL_S`).
        timeout_s: seconds without a new shard nor completion before :class:`eagle_io.errors.CaptureStalledError`
            (default :data:`eagle_io.defaults.FOLLOW_TIMEOUT_S`; None waits forever).
        rank, world_size: this process's share (above).

    Raises:
        InvalidArgumentError: bad ``max_length``, ``on_corrupt``, ``poll_s``, ``timeout_s``, rank or world size.
        ArgumentTypeError: ``mix_precisions`` not a bool.
        While iterating: CaptureStalledError (names the manifest and the wait); IncompatibleDatasetError (a
        capture whose schema or metadata differs from the first one opened, or that is not EAGLE-3; a sample id
        met twice in this process); CorruptRecordError (a bad record, under ``on_corrupt="raise"``),
        FormatVersionError, StorageError.
    """

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        max_length: int | None = None,
        filter: Any = None,
        threads: int = 1,
        on_corrupt: str = "raise",
        mix_precisions: bool = False,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_bytes: int = defaults.CACHE_BYTES,
        poll_s: float = defaults.FOLLOW_POLL_S,
        timeout_s: float | None = defaults.FOLLOW_TIMEOUT_S,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        check_feed_options(max_length, on_corrupt)
        if not poll_s > 0 or (timeout_s is not None and not timeout_s > 0):
            raise InvalidArgumentError(f"poll_s and timeout_s must be > 0, got {poll_s}, {timeout_s}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise InvalidArgumentError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        self.manifests = [manifest_to_follow(p) for p in expand_paths(paths)]
        self.max_length, self.filter, self.threads, self.on_corrupt = max_length, filter, threads, on_corrupt
        self.poll_s, self.timeout_s, self.rank, self.world_size = poll_s, timeout_s, rank, world_size
        self.mix_precisions = check_flag("mix_precisions", mix_precisions)
        self.cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        self.cache_bytes = cache_bytes
        #: Records skipped in this process under ``on_corrupt="skip"`` (see :class:`ShardDataset`).
        self.skipped: list = []
        #: Samples left out in this process because ``max_length`` kept none of their supervised tokens.
        self.unsupervised: list[UnsupervisedSample] = []

    def _slot(self) -> tuple[int, int]:
        info = torch.utils.data.get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        return self.rank * workers + worker, self.world_size * workers

    def _open(self, d: int, first: Dataset | None) -> Dataset:
        ds = Dataset(self.manifests[d], threads=self.threads, cache_dir=self.cache_dir, cache_bytes=self.cache_bytes)
        check_eagle3_dataset(ds, "ShardDataset(follow=True)")
        if first is not None:
            _check_compatible(first, ds, self.mix_precisions)
        return ds

    def _read(self, ds: Dataset, d: int, p: int, stored: int | None) -> dict[str, Any] | None:
        """Sample ``p`` of capture ``d`` as an item, or None when left out (corrupt under ``on_corrupt="skip"``, or
        ``max_length`` kept none of its ``stored`` tokens' supervision)."""
        try:
            item = read_item(ds, p, d, self.max_length)
        except CorruptRecordError as e:
            if self.on_corrupt != "skip":
                raise
            rec = SkippedRecord(p, ds.entry(p).sample_id, d, e.path, e.offset, str(e))
            self.skipped.append(rec)
            log.warning("on_corrupt='skip': left sample %d of %s out: %s", rec.sample_id, self.manifests[d], e)
            return None
        cut = stored is not None and self.max_length is not None and stored > self.max_length
        if cut and not bool(item["loss_mask"].any()):
            lost = UnsupervisedSample(p, item["sample_id"], d, stored, self.max_length)
            self.unsupervised.append(lost)
            log.warning(
                "left sample %d of %s out: max_length %d keeps none of its supervised tokens (%d tokens stored)",
                lost.sample_id, self.manifests[d], self.max_length, stored,
            )  # fmt: skip
            return None
        return item

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for _d, _p, item in self.entries():
            yield item

    def entries(
        self, start: Sequence[int] | None = None, stop: threading.Event | None = None
    ) -> Iterator[tuple[int, int, dict[str, Any]]]:
        """What iteration yields, as ``(capture index, position in it, item)``, starting at position ``start[d]``
        of capture ``d`` (default 0: a resume point is the position after the last item consumed, per capture).
        Ends early, without error, once ``stop`` is set (checked while waiting for the captures)."""
        slot, stride = self._slot()
        done = [0] * len(self.manifests) if start is None else [int(p) for p in start]
        if len(done) != len(self.manifests):
            raise InvalidArgumentError(f"start has {len(done)} positions for {len(self.manifests)} captures")
        pending = set(range(len(self.manifests)))
        first: Dataset | None = None
        ids: set[int] = set()
        last_news = time.monotonic()
        while pending:
            news = False
            for d in sorted(pending):
                progress = capture_progress(self.manifests[d])
                if progress is None:
                    continue
                complete = progress.complete
                if progress.samples > done[d]:
                    ds = self._open(d, first)
                    first = first or ds
                    stored = ds.lengths() if self.max_length is not None else None
                    for p in range(done[d], len(ds)):
                        if p % stride != slot:
                            continue
                        if self.filter is not None and not self.filter(ds.entry(p), ds.metadata):
                            continue
                        item = self._read(ds, d, p, None if stored is None else stored[p])
                        if item is None:
                            continue
                        if len(self.manifests) > 1:
                            if item["sample_id"] in ids:
                                raise IncompatibleDatasetError(
                                    f"sample id {item['sample_id']} of {ds.manifest_path} (position {p}) was already "
                                    f"read from another followed capture; sample ids must be unique across them"
                                )
                            ids.add(item["sample_id"])
                        yield d, p, item
                    done[d], complete, news = len(ds), bool(ds.manifest["complete"]), True
                if complete:
                    pending.discard(d)
                    news = True
            if news:
                last_news = time.monotonic()
            elif pending:
                waited = time.monotonic() - last_news
                if self.timeout_s is not None and waited > self.timeout_s:
                    m = self.manifests[min(pending)]
                    err = CaptureStalledError(
                        f"{m}: no shard committed and not marked complete for {waited:.0f} s (timeout_s="
                        f"{self.timeout_s}); {done[min(pending)]} samples read so far"
                    )
                    err.path, err.waited_s = m, waited
                    raise err
                if stop is None:
                    time.sleep(self.poll_s)
                elif stop.wait(self.poll_s):
                    return

    def __repr__(self) -> str:
        return f"FollowingShardDataset({len(self.manifests)} capture(s), rank {self.rank}/{self.world_size})"
