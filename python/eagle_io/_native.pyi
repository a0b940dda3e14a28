"""Type stubs of the native module (src/python/). Checked against the module by `make stubtest`."""

from collections.abc import Sequence
from os import PathLike
from typing import Any, final

__all__ = [
    "DEFAULTS",
    "FORMAT_VERSION",
    "LAYOUT",
    "CaptureSink",
    "Reader",
    "RingSlot",
    "RootLock",
    "Writer",
    "__version__",
    "list_objects",
    "load_manifest",
    "manifest_name",
    "put_manifest",
    "seal_manifest",
    "shard_prefix",
    "storage_stats",
    "upload_dataset",
]

__version__: str
FORMAT_VERSION: int
DEFAULTS: dict[str, Any]
LAYOUT: dict[str, Any]

_Tensor = tuple[str, Sequence[int], Any]  # (dtype name, shape, buffer)
_Sample = tuple[int, str, Sequence[_Tensor]]  # (sample_id, key, tensors in schema order)

def load_manifest(path: str | PathLike[str]) -> dict[str, Any]: ...
def seal_manifest(manifest: dict[str, Any]) -> bytes: ...
def storage_stats() -> dict[str, int]: ...
def upload_dataset(manifest: str | PathLike[str], url: str) -> tuple[list[str], list[str], int]: ...
def list_objects(url: str, subs: list[str]) -> list[tuple[str, int]]: ...
def put_manifest(data: bytes, url: str) -> None: ...
def manifest_name(rank: int, world_size: int) -> str: ...
def shard_prefix(rank: int) -> str: ...

@final
class RootLock:
    def __new__(cls, root: str | PathLike[str], manifest_name: str) -> RootLock: ...
    def release(self) -> None: ...

@final
class Writer:
    def __new__(
        cls,
        root: str | PathLike[str],
        schema: Sequence[tuple[str, str, int | None, str | None, int | None]],
        metadata: dict[str, Any],
        *,
        shard_bytes: int,
        chunk_bytes: int,
        threads: int,
        zstd_level: int,
        queue_depth: int,
        shard_prefix: str,
        manifest_name: str,
        resume: bool,
        uploaded_to: str | None = None,
        rank: int | None = None,
    ) -> Writer: ...
    def write_batch(
        self,
        samples: Sequence[_Sample],
        prefixes: Sequence[int | None] | None = None,
        shared: Sequence[int] | None = None,
    ) -> None: ...
    def write_prefix(self, prefix: _Sample) -> tuple[int, int, str]: ...
    def prefixes(self) -> dict[str, tuple[int, int]]: ...
    def __contains__(self, key: int, /) -> bool: ...
    def sample_ids(self) -> list[int]: ...
    def stats(self) -> dict[str, Any]: ...
    def close(self, complete: bool = True) -> dict[str, Any]: ...

@final
class CaptureSink:
    def __new__(cls, writer: Writer, ring_bytes: int, batch: int) -> CaptureSink: ...
    def reserve(self, nbytes: int, timeout_s: float, drop_when_full: bool) -> RingSlot | None: ...
    def commit(
        self,
        slot: RingSlot,
        sample_id: int,
        key: str,
        n_tokens: int,
        cancelled: bool = False,
        fp8_clamped: int | None = None,
        shared_prefix: int | None = None,
        stored_prefix: bytes | None = None,
    ) -> None: ...
    def arena_span(self) -> tuple[int, int]: ...
    def stats(self) -> dict[str, Any]: ...
    def close(self, complete: bool = True) -> dict[str, Any]: ...

@final
class RingSlot:
    def __len__(self) -> int: ...
    # Also exports the slot's bytes through the buffer protocol (C level; no __buffer__ method).

@final
class Reader:
    def __new__(
        cls,
        path: str | PathLike[str],
        threads: int | None = None,
        in_flight: int | None = None,
        coalesce_gap: int | None = None,
        part_bytes: int | None = None,
        cache_dir: str | PathLike[str] | None = None,
        cache_bytes: int | None = None,
    ) -> Reader: ...
    def __len__(self) -> int: ...
    def entry(self, pos: int) -> tuple[int, int, str]: ...
    def position(self, sample_id: int) -> int | None: ...
    def lengths(self) -> list[int]: ...
    def read_into(self, pos: int, outs: Sequence[Any]) -> None: ...
    def read_batch(self, items: Sequence[tuple[int, Sequence[Any]]]) -> None: ...
    def read_stored_into(self, pos: int, outs: Sequence[Any]) -> None: ...
    def read_tensor(self, name: str, items: Sequence[tuple[int, Any]]) -> list[BaseException | None]: ...
    def manifest(self) -> dict[str, Any]: ...
    def schema(self) -> list[tuple[str, str, int | None, str | None, int | None]]: ...
    def prefix_records(self) -> list[tuple[int, int, str, str]]: ...
    @property
    def manifest_path(self) -> str: ...
    @staticmethod
    def verify(path: str | PathLike[str], threads: int | None = None) -> list[tuple[str, int | None, int, str]]: ...
