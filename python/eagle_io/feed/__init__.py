"""The training feed: eagle-io datasets as PyTorch batches for EAGLE-3 draft training.

- :class:`ShardDataset`: a map-style dataset over one or several datasets (manifests and indexes only).
- :class:`PaddingCollator` / :class:`PackingCollator`: items -> ``[B, T]`` padded or ``[1, N]`` packed batches.
- :func:`shift_targets`: the EAGLE-3 shift (position ``t`` targets token ``t + 1``'s state), for both layouts.
- :class:`LengthGroupedBatchSampler` / :class:`RankSampler`: seeded, rank-disjoint, resumable samplers (torchdata's
  ``StatefulDataLoader`` saves and restores them mid-epoch).
- :class:`FollowingShardDataset` (``ShardDataset(paths, follow=True)``): samples of a capture still running, as its
  shards commit, until its manifest is marked complete.

Typical use on rank ``r`` of ``W``::

    ds = ShardDataset(["run-a/", "run-b/"], max_length=2048)
    sampler = LengthGroupedBatchSampler(ds.lengths(), max_tokens=16384, rank=r, world_size=W, seed=0)
    loader = DataLoader(ds, batch_sampler=sampler, collate_fn=PackingCollator(16384), num_workers=4,
                        pin_memory=True, persistent_workers=True)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for step, batch in enumerate(loader):
            batch = shift_targets({k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()})
            ...  # checkpoint with sampler.state_dict(step + 1); resume: sampler.load_state_dict(saved), then iterate
"""

from ..store.eagle3 import REQUIRED_TENSORS
from .collate import LOSS_MASK_ALIGNMENTS, PackingCollator, PaddingCollator, has_next_token, shift_targets
from .dataset import (
    COMPATIBILITY_KEYS,
    ON_CORRUPT,
    LazyItems,
    ShardDataset,
    SkippedRecord,
    UnsupervisedSample,
    expand_paths,
    read_item,
)
from .follow import CaptureProgress, FollowingShardDataset, capture_progress, manifest_to_follow
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
