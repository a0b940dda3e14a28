"""The exception hierarchy. Every error eagle-io raises derives from :class:`EagleIOError`;
the native core maps each of its error variants to one class here (``src/python/errors.rs``).
"""

from __future__ import annotations


class EagleIOError(Exception):
    """Base class of every eagle-io error."""


class StorageError(EagleIOError, OSError):
    """An operating-system error on a file. Attributes: ``path``, ``errno`` (or None)."""

    path: str
    errno: int | None  # type: ignore[assignment]


class CorruptRecordError(EagleIOError):
    """Bytes on disk that do not follow docs/FORMAT.md (bad checksum, magic, bounds, chunk).

    Attributes: ``path`` (the file), ``sample_id`` (None when no single record is to blame),
    ``offset`` (byte offset in ``path``).
    """

    path: str
    sample_id: int | None
    offset: int


class FormatVersionError(EagleIOError):
    """A shard or manifest of a newer format version. Attributes: ``path``, ``found``, ``supported``."""

    path: str
    found: int
    supported: int


class SchemaError(EagleIOError, ValueError):
    """A sample that does not match the dataset schema (dtype, shape, length, contiguity,
    duplicate sample id). Attribute: ``sample_id``."""

    sample_id: int

    @classmethod
    def for_sample(cls, sample_id: int, problem: str) -> SchemaError:
        """``SchemaError("sample {sample_id}: {problem}")`` with ``sample_id`` set."""
        err = cls(f"sample {sample_id}: {problem}")
        err.sample_id = sample_id
        return err


class IncompatibleDatasetError(EagleIOError, ValueError):
    """Datasets or a resumed run whose schema or metadata disagree; the message names the difference."""


class SampleNotFoundError(EagleIOError, LookupError):
    """A position or sample id the dataset does not hold."""


class InvalidArgumentError(EagleIOError, ValueError):
    """A caller mistake in arguments or call order (e.g. writing after close)."""


class RingTimeoutError(EagleIOError, TimeoutError):
    """The capture ring stayed full longer than the producer's timeout (writers too slow)."""


__all__ = [
    "CorruptRecordError",
    "EagleIOError",
    "FormatVersionError",
    "IncompatibleDatasetError",
    "InvalidArgumentError",
    "RingTimeoutError",
    "SampleNotFoundError",
    "SchemaError",
    "StorageError",
]
