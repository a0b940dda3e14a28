"""eagle-io: EAGLE-3 draft training data, from a target model's forward to a draft trainer.

Capture the target's aux hidden states into indexed, checksummed, zstd-compressed shards
(:class:`ShardWriter`), read them back with no start-up scan (:class:`Dataset`).
The shard format is specified in docs/FORMAT.md.
"""

from ._native import FORMAT_VERSION, __version__
from .errors import (
    CorruptRecordError,
    EagleIOError,
    FormatVersionError,
    IncompatibleDatasetError,
    InvalidArgumentError,
    RingTimeoutError,
    SampleNotFoundError,
    SchemaError,
    StorageError,
)
from .reader import Dataset, SampleInfo
from .schema import TensorSpec, eagle3_schema
from .writer import ShardWriter

__all__ = [
    "FORMAT_VERSION",
    "CorruptRecordError",
    "Dataset",
    "EagleIOError",
    "FormatVersionError",
    "IncompatibleDatasetError",
    "InvalidArgumentError",
    "RingTimeoutError",
    "SampleInfo",
    "SampleNotFoundError",
    "SchemaError",
    "ShardWriter",
    "StorageError",
    "TensorSpec",
    "__version__",
    "eagle3_schema",
]
