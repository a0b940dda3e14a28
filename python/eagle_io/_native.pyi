"""Type stubs of the native module (src/python/). Checked against the module by `make stubtest`."""

from collections.abc import Sequence
from os import PathLike
from typing import Any, final

__all__ = ["FORMAT_VERSION", "Reader", "Writer", "__version__"]

__version__: str
FORMAT_VERSION: int

_Tensor = tuple[str, Sequence[int], Any]  # (dtype name, shape, buffer)
_Sample = tuple[int, str, Sequence[_Tensor]]  # (sample_id, key, tensors in schema order)

@final
class Writer:
    def __new__(
        cls,
        root: str | PathLike[str],
        schema_json: str,
        metadata_json: str,
        *,
        shard_bytes: int,
        chunk_bytes: int,
        threads: int,
        zstd_level: int,
        queue_depth: int,
        shard_prefix: str,
        manifest_name: str,
        resume: bool,
    ) -> Writer: ...
    def write_batch(self, samples: Sequence[_Sample]) -> None: ...
    def __contains__(self, key: int, /) -> bool: ...
    def stats(self) -> dict[str, Any]: ...
    def close(self) -> str: ...

@final
class Reader:
    def __new__(cls, path: str | PathLike[str], threads: int = 0) -> Reader: ...
    def __len__(self) -> int: ...
    def entry(self, pos: int) -> tuple[int, int, str]: ...
    def position(self, sample_id: int) -> int | None: ...
    def lengths(self) -> list[int]: ...
    def read_into(self, pos: int, outs: Sequence[Any]) -> None: ...
    @property
    def manifest_json(self) -> str: ...
    @property
    def manifest_path(self) -> str: ...
    @staticmethod
    def verify(path: str | PathLike[str], threads: int = 0) -> list[tuple[str, int | None, int, str]]: ...
