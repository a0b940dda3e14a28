"""The training feed: eagle-io datasets as PyTorch batches for EAGLE-3 draft training.

- :class:`ShardDataset`: a map-style dataset over one or several datasets (manifests and indexes only).
- :class:`PaddingCollator` / :class:`PackingCollator`: items -> ``[B, T]`` padded or ``[1, N]`` packed batches.
- :func:`shift_targets`: the EAGLE-3 shift (position ``t`` targets token ``t + 1``'s state), for both layouts.
- :class:`LengthGroupedBatchSampler` / :class:`RankSampler`: seeded, rank-disjoint, resumable samplers (torchdata's
  ``StatefulDataLoader`` saves and restores them mid-epoch).
- :class:`FollowingShardDataset` (``ShardDataset(paths, follow=True)``): samples of a capture still running, as its
  shards commit, until its manifest is marked complete.
- :class:`Loader`: the recommended way to batch them: no worker processes; batches decoded on eagle-io's native
  threads (GIL released) into a ring of reused, pinned buffers, optionally copied to the GPU on a side stream;
  ``state_dict`` / ``load_state_dict`` like torchdata's ``StatefulDataLoader``. A DataLoader works too.

Typical use on rank ``r`` of ``W``::

    ds = ShardDataset(["run-a/", "run-b/"], max_length=2048, threads=4)
    sampler = LengthGroupedBatchSampler(ds.lengths(), max_tokens=16384, rank=r, world_size=W, seed=0)
    loader = Loader(ds, batch_sampler=sampler, collate_fn=PackingCollator(16384), device="cuda")
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            batch = shift_targets(batch)
            ...  # checkpoint loader.state_dict(); resume: loader.load_state_dict(saved), then iterate
"""

from ..store.eagle3 import REQUIRED_TENSORS
from .collate import LOSS_MASK_ALIGNMENTS, PackingCollator, PaddingCollator, has_next_token, shift_targets
from .dataset import LazyItems, ShardDataset
from .follow import CaptureProgress, FollowingShardDataset, capture_progress, manifest_to_follow
from .items import COMPATIBILITY_KEYS, ON_CORRUPT, SkippedRecord, UnsupervisedSample, expand_paths, read_item
from .loader import Loader
from .samplers import UNEVEN, LengthGroupedBatchSampler, RankSampler, permutation

__all__ = [
    "COMPATIBILITY_KEYS",
    "LOSS_MASK_ALIGNMENTS",
    "ON_CORRUPT",
    "REQUIRED_TENSORS",
    "UNEVEN",
    "CaptureProgress",
    "FollowingShardDataset",
    "LazyItems",
    "LengthGroupedBatchSampler",
    "Loader",
    "PackingCollator",
    "PaddingCollator",
    "RankSampler",
    "ShardDataset",
    "SkippedRecord",
    "UnsupervisedSample",
    "capture_progress",
    "expand_paths",
    "has_next_token",
    "manifest_to_follow",
    "permutation",
    "read_item",
    "shift_targets",
]
