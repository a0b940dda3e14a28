"""``ShardDataset``: a map-style ``torch.utils.data.Dataset`` over one or several eagle-io datasets."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..defaults import CACHE_BYTES
from ..errors import CorruptRecordError, IncompatibleDatasetError, SampleNotFoundError
from ..store.eagle3 import check_eagle3_dataset
from ..store.reader import Dataset, SampleInfo, check_flag, check_output_shape
from .follow import FollowingShardDataset
from .items import (
    SkippedRecord,
    UnsupervisedSample,
    _check_compatible,
    check_feed_options,
    expand_paths,
    read_item,
)

#: ``filter(info, metadata) -> bool``: keep the sample when True.
SampleFilter = Callable[[SampleInfo, Mapping[str, Any]], bool]

log = logging.getLogger("eagle_io.feed")


class ShardDataset(torch.utils.data.Dataset):
    """A map-style dataset over one or several eagle-io datasets, built from their manifests and shard indexes
    alone: opening reads no payload (a corrupt record is only found when that item is read).

    Item ``i`` (a dict of CPU tensors; ``L`` = the sample's token count, after ``max_length`` truncation):

    - ``input_ids`` ``[L]`` int64
    - ``loss_mask`` ``[L]`` int64 (stored as uint8; 1 = an assistant token the draft is trained on)
    - ``aux_hidden_states`` ``[L, k*H]`` (stored dtype, usually bfloat16): residual stream at the inputs of the
      ``k`` aux layers (``metadata["aux_layer_ids"]``, convention in ``metadata["aux_layer_convention"]``)
    - ``hidden_states`` ``[L, H]`` (stored dtype): the target's final post-norm hidden state
    - any further schema tensor, truncated the same way
    - ``sample_id`` (int, the writer's id) and ``dataset_index`` (int, index into :attr:`paths`)

    Items number the samples of ``paths[0]`` in position order, then ``paths[1]``..., skipping filtered ones.
    Every read is checksummed (``CorruptRecordError`` on a bad record). No target shift is applied here: see
    :func:`eagle_io.feed.shift_targets`. Through a ``DataLoader`` with :class:`eagle_io.feed.PaddingCollator` or
    :class:`eagle_io.feed.PackingCollator`, a batch's samples are decoded straight into the batch tensors
    (``__getitems__``; in workers, into shared memory), so no per-item tensor is built or copied.

    Args:
        paths: a dataset (a directory with ``manifest.json``, a manifest file, or a directory of per-rank
            manifests ``manifest.r*.json``, all of which are taken) or a sequence of them.
        max_length: keep the first ``max_length`` tokens of every tensor of a longer sample (aligned truncation;
            the stored sample is still decoded whole). None keeps everything.
        filter: ``filter(info, metadata) -> bool`` called once per stored sample at construction with its
            :class:`eagle_io.SampleInfo` (``sample_id``, stored ``n_tokens`` before truncation, ``key``) and its
            dataset's metadata dict; samples for which it returns False are left out. Select whole datasets with a
            predicate on ``metadata`` alone. Costs about 1 us per sample; not pickled (the kept positions are).
        threads: decode threads per read in each process (DataLoader workers each have their own).
        on_corrupt: what the eagle-io collators do with a record that fails its checksum or format checks when
            they build a batch. ``"raise"`` (default): raise :class:`eagle_io.CorruptRecordError`, which names
            the shard, sample id and byte offset. ``"skip"``: leave that sample out of the batch (never replace
            it by another one: the batch has fewer samples, none at all when every one is bad), log a warning,
            append a :class:`SkippedRecord` to :attr:`skipped` (this process's count) and to the batch's
            ``"skipped"`` list (how the counts of DataLoader workers reach the training loop). ``ds[i]`` and
            other collate functions always raise: a single item cannot be skipped without substituting one.

    A sample that ``max_length`` truncates to no supervised token is left out of its batch by the eagle-io
    collators (never replaced by another), logged, and counted in :attr:`unsupervised` and the batch's
    ``"unsupervised"`` list (:class:`UnsupervisedSample`); :meth:`require_supervision` fails a run that would be
    left with none at all, naming ``max_length``.
        follow: return a :class:`eagle_io.feed.FollowingShardDataset` instead: an iterable view that yields
            samples as a running capture commits them and ends when its manifest is marked complete (training
            while capture runs, docs/TRAINING.md). It takes the arguments above and ``poll_s``, ``timeout_s``,
            ``rank``, ``world_size``.
        cache_dir, cache_bytes: object storage only: a local read-through cache of the shard objects and its size
            cap (:class:`eagle_io.Dataset`); a later epoch then reads the local copies.
        mix_precisions: accept datasets whose state tensors differ only in storage precision (bf16 and FP8,
            docs/FORMAT.md 3.1): every sample is read dequantised into the schema dtype. Off by default, so lossy
            and lossless data are not mixed by accident.

    Raises:
        IncompatibleDatasetError: two datasets whose metadata differ on a key of :data:`COMPATIBILITY_KEYS` or
            whose schemas differ (the message names the key or tensor and both values); a dataset lacking one of
            :data:`REQUIRED_TENSORS` or whose metadata contradicts its schema widths or dtype; a sample id present
            in two datasets (the message names the id and both manifests).
        InvalidArgumentError: no paths, the same manifest twice, ``max_length < 1`` or an unknown ``on_corrupt``.
        ArgumentTypeError: ``follow`` or ``mix_precisions`` not a bool (``"no"`` was truthy).
        CorruptRecordError, FormatVersionError, StorageError: from opening a manifest or shard index.

    Pickles as its paths, options and kept positions (spawn-safe; the filter is not re-run); fork-safe.
    """

    def __new__(cls, paths: Any = None, *, follow: bool = False, **options: Any) -> Any:
        if check_flag("follow", follow):
            return FollowingShardDataset(paths, **options)
        return super().__new__(cls)

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        max_length: int | None = None,
        filter: SampleFilter | None = None,
        threads: int = 1,
        on_corrupt: str = "raise",
        mix_precisions: bool = False,
        follow: bool = False,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_bytes: int = CACHE_BYTES,
    ) -> None:
        check_feed_options(max_length, on_corrupt)
        mix_precisions = check_flag("mix_precisions", mix_precisions)
        self.paths = expand_paths(paths)
        self.max_length = max_length
        self.threads = threads
        self.on_corrupt = on_corrupt
        #: Records skipped in this process under ``on_corrupt="skip"`` (DataLoader workers each keep their own;
        #: batches carry theirs in ``batch["skipped"]``).
        self.skipped: list[SkippedRecord] = []
        #: Items left out of batches in this process because truncation left them no supervised token (batches
        #: carry theirs in ``batch["unsupervised"]``).
        self.unsupervised: list[UnsupervisedSample] = []
        self.cache = (None if cache_dir is None else os.fspath(cache_dir), cache_bytes)
        self.datasets = [Dataset(p, threads=threads, cache_dir=cache_dir, cache_bytes=cache_bytes) for p in self.paths]
        for ds in self.datasets:
            check_eagle3_dataset(ds, "ShardDataset")
        for ds in self.datasets[1:]:
            _check_compatible(self.datasets[0], ds, mix_precisions)

        owners, positions, lengths, ids = [], [], [], []
        for d, ds in enumerate(self.datasets):
            n = len(ds)
            if filter is None:
                pos = np.arange(n, dtype=np.int64)
                lens = np.asarray(ds.lengths(), dtype=np.int64).reshape(n)
                sid = None
            else:
                infos = [ds.entry(p) for p in range(n)]
                keep = [p for p, info in enumerate(infos) if filter(info, ds.metadata)]
                pos = np.asarray(keep, dtype=np.int64)
                lens = np.asarray([infos[p].n_tokens for p in keep], dtype=np.int64)
                sid = np.asarray([infos[p].sample_id for p in keep], dtype=np.uint64)
            owners.append(np.full(len(pos), d, dtype=np.int32))
            positions.append(pos)
            lengths.append(lens)
            ids.append(sid)
        self._owner = np.concatenate(owners)
        self._pos = np.concatenate(positions)
        self._stored_lengths = np.concatenate(lengths)
        if len(self.datasets) > 1:
            self._check_unique_ids(ids)

    def _check_unique_ids(self, ids: list[np.ndarray | None]) -> None:
        for d, ds in enumerate(self.datasets):
            if ids[d] is None:
                ids[d] = np.fromiter((ds.entry(p).sample_id for p in range(len(ds))), np.uint64, len(ds))
        all_ids = np.concatenate(ids)
        order = np.argsort(all_ids, kind="stable")
        dup = np.flatnonzero(all_ids[order][1:] == all_ids[order][:-1])
        if len(dup):
            a, b = int(order[dup[0]]), int(order[dup[0] + 1])
            da, db = int(self._owner[a]), int(self._owner[b])
            raise IncompatibleDatasetError(
                f"sample id {int(all_ids[a])} is in {self.datasets[da].manifest_path} (position {int(self._pos[a])}) "
                f"and in {self.datasets[db].manifest_path} (position {int(self._pos[b])}); sample ids must be "
                f"unique across the datasets mixed"
            )

    @property
    def metadata(self) -> dict[str, Any]:
        """The first dataset's metadata (all datasets agree on :data:`COMPATIBILITY_KEYS`)."""
        return self.datasets[0].metadata

    @property
    def schema(self):
        """The schema (a list of :class:`eagle_io.TensorSpec`), the same for every dataset."""
        return self.datasets[0].schema

    def __len__(self) -> int:
        return len(self._pos)

    def lengths(self) -> list[int]:
        """Token counts ``L`` of the items in order, after ``max_length`` truncation (from the shard indexes; no
        payload read). Feed them to :class:`eagle_io.feed.LengthGroupedBatchSampler`."""
        lens = self._stored_lengths
        if self.max_length is not None:
            lens = np.minimum(lens, self.max_length)
        return lens.tolist()

    def _index(self, i: int) -> int:
        n = len(self)
        if not -n <= i < n:
            raise SampleNotFoundError(f"item {i} out of range for a ShardDataset of {n} items")
        return i % n

    def locate(self, i: int) -> tuple[int, int]:
        """``(dataset_index, position)`` of item ``i`` in :attr:`datasets`. Raises IndexError when out of range."""
        i = self._index(i)
        return int(self._owner[i]), int(self._pos[i])

    def entry(self, i: int) -> SampleInfo:
        """The index entry of item ``i`` (``n_tokens`` as stored, before truncation)."""
        d, p = self.locate(i)
        return self.datasets[d].entry(p)

    def length(self, i: int) -> int:
        """Token count ``L`` of item ``i`` after ``max_length`` truncation (from the index)."""
        n = int(self._stored_lengths[self._index(i)])
        return n if self.max_length is None else min(n, self.max_length)

    def read_into(self, i: int, out: Mapping[str, torch.Tensor]) -> tuple[int, int]:
        """Decodes item ``i`` into caller tensors, e.g. rows of a batch: ``out`` maps some of the schema tensor
        names to contiguous CPU tensors of shape ``[L]`` / ``[L, width]`` with ``L = self.length(i)``. A tensor of
        the stored dtype receives the decode directly; one of another dtype (e.g. ``loss_mask`` as int64), a
        truncated sample and tensors left out of ``out`` go through a temporary. Returns
        ``(sample_id, dataset_index)``.

        Raises:
            InvalidArgumentError: a tensor of the wrong shape; CorruptRecordError: a bad record.
        """
        return self.read_many([(i, out)])[0]

    def _plan(self, i: int, out: Mapping[str, torch.Tensor]) -> tuple[int, int, int, int, dict, list]:
        """-> (dataset index, position, sample id, stored token count, {name: tensor decoded into},
        [(destination, temporary)]), from one index lookup."""
        d, p = self.locate(i)
        ds = self.datasets[d]
        info = ds.entry(p)
        n, m = info.n_tokens, self.length(i)
        direct, copies = {}, []
        for spec in ds.schema:
            shape = (n,) if spec.width is None else (n, spec.width)
            dst = out.get(spec.name)
            if dst is not None:
                check_output_shape(spec, dst, m, f"read_into item {i}: ")
            if dst is not None and m == n and dst.dtype == getattr(torch, spec.dtype) and dst.is_contiguous():
                direct[spec.name] = dst
            else:
                direct[spec.name] = torch.empty(shape, dtype=getattr(torch, spec.dtype))
                if dst is not None:
                    copies.append((dst, direct[spec.name]))
        return d, p, info.sample_id, n, direct, copies

    def read_many(self, items: Sequence[tuple[int, Mapping[str, torch.Tensor]]]) -> list[tuple[int, int]]:
        """:meth:`read_into` for several items at once: ``[(i, out)]`` with the same rules, decoded in one
        GIL-free native call per underlying dataset, all records of it on the reader's threads (``threads``).
        The outputs of different items must not overlap. Returns ``[(sample_id, dataset_index)]`` in order.

        Raises:
            InvalidArgumentError: a tensor of the wrong shape, or overlapping outputs.
            CorruptRecordError: a bad record; every other item was decoded, and the error's ``item`` attribute
                is the position in ``items`` of the first bad one.
        """
        plans = [self._plan(i, out) for i, out in items]
        groups: dict[int, list[int]] = {}
        for k, (d, *_rest) in enumerate(plans):
            groups.setdefault(d, []).append(k)
        for d, ks in groups.items():
            ds = self.datasets[d]
            try:
                ds.read_batch([(plans[k][1], plans[k][4]) for k in ks], n_tokens=[plans[k][3] for k in ks])
            except CorruptRecordError as e:  # the first bad item of this dataset, by its sample id
                e.item = next((k for k in ks if plans[k][2] == e.sample_id), ks[0])
                raise
        for *_head, copies in plans:
            for dst, tmp in copies:
                dst.copy_(tmp[: dst.shape[0]])
        return [(sid, d) for d, _p, sid, _n, _direct, _copies in plans]

    def record_skip(self, i: int, error: CorruptRecordError) -> SkippedRecord:
        """Counts item ``i`` as skipped for ``error`` (see ``on_corrupt``) and logs it. Returns the record.

        Raises:
            CorruptRecordError: ``error`` itself, when ``on_corrupt`` is ``"raise"``.
        """
        if self.on_corrupt != "skip":
            raise error
        d, p = self.locate(i)
        rec = SkippedRecord(i, self.datasets[d].entry(p).sample_id, d, error.path, error.offset, str(error))
        self.skipped.append(rec)
        log.warning("on_corrupt='skip': left item %d (sample id %d) out of its batch: %s", i, rec.sample_id, error)
        return rec

    def truncated_unsupervised(self, i: int, loss_mask: torch.Tensor) -> UnsupervisedSample | None:
        """Whether item ``i``, whose truncated ``loss_mask`` is given, lost every supervised token to ``max_length``:
        then it is counted in :attr:`unsupervised`, logged and returned; None when it keeps one (or is not
        truncated: a sample stored without supervision is the capture's to refuse, and is kept)."""
        stored = int(self._stored_lengths[self._index(i)])
        if self.max_length is None or stored <= self.max_length or bool(loss_mask.any()):
            return None
        d, p = self.locate(i)
        rec = UnsupervisedSample(i, self.datasets[d].entry(p).sample_id, d, stored, self.max_length)
        if all(u.item != i for u in self.unsupervised[-1000:]):  # once per item and epoch, roughly
            log.warning(
                "left item %d (sample id %d) out of its batch: max_length %d keeps none of its supervised tokens "
                "(%d tokens stored)", i, rec.sample_id, self.max_length, stored,
            )  # fmt: skip
        self.unsupervised.append(rec)
        return rec

    def require_supervision(self, items: Sequence[int] | None = None, *, option: str = "max_length") -> None:
        """Fails when none of ``items`` (default: all) has a supervised token within ``max_length``: a run on them
        would train on nothing. Reads the items' ``loss_mask`` tensors (:meth:`eagle_io.Dataset.read_tensor`: each
        record checksummed, nothing else decoded) in order and stops at the first supervised one, so a healthy
        dataset costs one batch of reads.

        Raises:
            IncompatibleDatasetError: no item keeps a supervised token, naming ``option`` (the caller's name for
                ``max_length``, e.g. ``"--max-length"``), the item count, and how many were cut by it.
            CorruptRecordError: a record that fails its checks (passed over under ``on_corrupt="skip"``).
        """
        todo = list(range(len(self))) if items is None else [self._index(i) for i in items]
        cut = past = 0
        for start in range(0, len(todo), 256):
            chunk = todo[start : start + 256]
            by_dataset: dict[int, list[tuple[int, int]]] = {}
            for i in chunk:
                d, p = self.locate(i)
                by_dataset.setdefault(d, []).append((i, p))
            for d, pairs in by_dataset.items():
                masks = self.datasets[d].read_tensor("loss_mask", [p for _, p in pairs], on_error="return")
                for m in masks:
                    if not isinstance(m, torch.Tensor):
                        if self.on_corrupt == "skip":  # left out of batches too
                            continue
                        raise m
                    kept = m if self.max_length is None else m[: self.max_length]
                    if bool(kept.any()):
                        return
                    if self.max_length is not None and m.shape[0] > self.max_length:
                        cut += 1
                        past += bool(m.any())
        limit = "no max_length" if self.max_length is None else f"max_length {self.max_length}"
        raise IncompatibleDatasetError(
            f"none of the {len(todo)} samples has a supervised token (loss_mask 1) within {limit}: "
            f"{cut} are longer and cut by it ({past} of them have supervised tokens past it); a run on them would "
            f"train on nothing. Raise {option} (or train on samples with assistant tokens earlier)"
            if cut
            else f"none of the {len(todo)} samples has a supervised token (loss_mask 1): a run on them would train on "
            "nothing; recapture with loss masks (the data's assistant turns)"
        )

    def __getitems__(self, indices: Sequence[int]) -> LazyItems:
        """The items at ``indices``, decoded on first access; the DataLoader calls this for a batch and hands
        the result to ``collate_fn``. eagle-io's collators decode the samples straight into the batch tensors
        (no per-item tensors, no extra copy); any other ``collate_fn`` sees an ordinary sequence of items."""
        return LazyItems(self, list(indices))

    def __getitem__(self, i: int) -> dict[str, Any]:
        d, p = self.locate(int(i))
        return read_item(self.datasets[d], p, d, self.max_length)

    def __getstate__(self) -> dict[str, Any]:
        return {
            "paths": self.paths,
            "max_length": self.max_length,
            "threads": self.threads,
            "on_corrupt": self.on_corrupt,
            "cache": self.cache,
            "owner": self._owner,
            "pos": self._pos,
            "stored_lengths": self._stored_lengths,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.paths, self.max_length, self.threads = state["paths"], state["max_length"], state["threads"]
        self.on_corrupt, self.skipped, self.cache = state["on_corrupt"], [], state["cache"]
        self.unsupervised = []
        self.datasets = [Dataset(p, threads=self.threads, cache_dir=self.cache[0], cache_bytes=self.cache[1])
                         for p in self.paths]  # fmt: skip
        self._owner, self._pos, self._stored_lengths = state["owner"], state["pos"], state["stored_lengths"]

    def __repr__(self) -> str:
        return f"ShardDataset({len(self)} items from {len(self.paths)} dataset(s), max_length={self.max_length})"


class LazyItems(Sequence):
    """Items of a :class:`ShardDataset` at given indices, decoded (once each) when accessed; what
    ``ShardDataset.__getitems__`` returns. Collators with ``collate_from`` read them straight into batches."""

    def __init__(self, dataset: ShardDataset, indices: list[int]) -> None:
        self.dataset, self.indices = dataset, indices
        self._items: dict[int, dict[str, Any]] = {}

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k):  # type: ignore[override]
        if isinstance(k, slice):
            return [self[j] for j in range(*k.indices(len(self)))]
        k = range(len(self))[k]
        if k not in self._items:
            self._items[k] = self.dataset[self.indices[k]]
        return self._items[k]
