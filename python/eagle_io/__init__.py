"""eagle-io: EAGLE-3 draft training data, from a target model's forward to a draft trainer.

Capture the target's aux hidden states into indexed, checksummed, zstd-compressed shards
(:class:`ShardWriter`), read them back with no start-up scan (:class:`Dataset`).
The shard format is specified in docs/FORMAT.md.
"""

from ._native import FORMAT_VERSION, __version__
from .capturing.session import Capture, CaptureSession, capture
from .errors import (
    CorruptRecordError,
    EagleIOError,
    FormatVersionError,
    ImplausibleStatesError,
    IncompatibleDatasetError,
    InvalidArgumentError,
    NonFiniteStatesError,
    ObjectStorageError,
    RingSlotError,
    RingTimeoutError,
    SampleNotFoundError,
    SchemaError,
    StorageError,
)
from .feed import (
    LengthGroupedBatchSampler,
    Loader,
    PackingCollator,
    PaddingCollator,
    RankSampler,
    ShardDataset,
    shift_targets,
)
from .store.reader import Dataset, SampleInfo
from .store.schema import TensorSpec, eagle3_schema
from .store.writer import ShardWriter

__all__ = [
    "FORMAT_VERSION",
    "Capture",
    "CaptureSession",
    "CorruptRecordError",
    "Dataset",
    "EagleIOError",
    "FormatVersionError",
    "ImplausibleStatesError",
    "IncompatibleDatasetError",
    "InvalidArgumentError",
    "LengthGroupedBatchSampler",
    "Loader",
    "NonFiniteStatesError",
    "ObjectStorageError",
    "PackingCollator",
    "PaddingCollator",
    "RankSampler",
    "RingSlotError",
    "RingTimeoutError",
    "SampleInfo",
    "SampleNotFoundError",
    "SchemaError",
    "ShardDataset",
    "ShardWriter",
    "StorageError",
    "TensorSpec",
    "__version__",
    "capture",
    "eagle3_schema",
    "shift_targets",
]
