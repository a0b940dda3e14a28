"""Random access to a dataset's samples as CPU tensors."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .. import _native
from ..defaults import CACHE_BYTES, REMOTE_IN_FLIGHT
from ..errors import ArgumentTypeError, EagleIOError, InvalidArgumentError, SampleNotFoundError
from . import fp8, layout
from ._tensors import empty, writable_bytes
from .schema import TensorSpec


def _check_threads(threads: object) -> None:
    if type(threads) is not int or threads < 0:  # a negative count raised OverflowError in the binding
        raise InvalidArgumentError(f"threads must be an integer >= 0 (0 = one per CPU), not {threads!r}")


def check_flag(name: str, value: object) -> bool:
    """``value`` when it is a bool (numpy's too): an on/off option is never read from another object's truth
    (``"no"``, ``"false"`` and ``[0]`` are all truthy).

    Raises:
        ArgumentTypeError: any other value, naming the option.
    """
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(f"{name} must be True or False, not {value!r}")
    return bool(value)


def check_output_shape(spec: TensorSpec, t: torch.Tensor, rows: int, where: str) -> None:
    """The one shape check of an output tensor (:meth:`Dataset.read_into` and the feed's ``ShardDataset.read_into``):
    ``t`` must be ``[rows]`` (``spec.width`` None) or ``[rows, spec.width]``.

    Raises:
        InvalidArgumentError: ``"{where}{spec.name!r} has shape [...], expected [...]"``.
    """
    want = [rows] if spec.width is None else [rows, spec.width]
    if list(t.shape) != want:
        raise InvalidArgumentError(f"{where}{spec.name!r} has shape {list(t.shape)}, expected {want}")


@dataclass(frozen=True)
class SampleInfo:
    """A sample's index entry: its id, token count ``L`` and source key."""

    sample_id: int
    n_tokens: int
    key: str


class Dataset:
    """A dataset opened from its manifest and shard indexes alone (no payload is read).

    ``dataset[pos]`` returns a dict of CPU tensors named by the schema (for the EAGLE-3
    schema: ``input_ids [L]`` int64, ``loss_mask [L]`` uint8, ``aux_hidden_states [L, k*H]``,
    ``hidden_states [L, H]``) plus ``sample_id`` (int). Every read is checksummed.

    Safe in DataLoader workers: after ``fork`` the open files are shared (reads are
    positioned) and the decode pool is rebuilt; with ``spawn`` the object pickles as its path.

    Tensors stored as FP8 (``TensorSpec.precision``, docs/FORMAT.md "FP8 storage") are dequantised on the
    reader's threads into their schema dtype (``x = e4m3fn(q) * scale``, rounded once). With ``dequantize=False``
    such a tensor ``name`` comes back as stored: ``name`` ``[L, width]`` ``torch.float8_e4m3fn`` and
    ``name + "_scales"`` ``[L, S]`` float32 (S = 1 for one scale per token, else ceil(width / scale_block)), so a
    trainer can dequantise on the GPU (:func:`eagle_io.store.fp8.dequantize`).

    Args:
        path: a manifest file, or a directory holding ``manifest.json``.
        threads: decode threads per read (0 = one per CPU).
        dequantize: False returns FP8 tensors as stored (above).
        in_flight: object storage only: ranged GETs in flight at once for this reader in :meth:`read_batch`
            (default :data:`eagle_io.defaults.REMOTE_IN_FLIGHT`); a batch's adjacent records are fetched by one
            GET (docs/STORAGE.md).
        cache_dir: object storage only: a local directory keeping read-through copies of the shard objects (the
            first read of a shard downloads it whole; a copy is used only when its size, footer and index match
            the manifest, and every record is checksummed; a bad copy is deleted and read again). Several
            readers and processes may share one. None (default): no cache.
        cache_bytes: the cache's size cap in bytes (default :data:`eagle_io.defaults.CACHE_BYTES`); least
            recently used shards are evicted to stay under it; a shard larger than the cap is read uncached.
            ``_native.storage_stats()`` counts ``cache_hits``, ``cache_fills``, ``cache_evicted``,
            ``cache_refetched`` and ``cache_too_big``.

    Raises:
        CorruptRecordError, FormatVersionError, StorageError: when the manifest or a shard
            index cannot be trusted; reads raise CorruptRecordError on a bad record.
        InvalidArgumentError: ``path`` is a multi-writer root not merged yet (``eagle-io merge`` it), ``threads``
            is negative, ``in_flight`` < 1 or ``cache_bytes`` < 0.
        ArgumentTypeError: ``dequantize`` not a bool.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        threads: int = 0,
        dequantize: bool = True,
        in_flight: int = REMOTE_IN_FLIGHT,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_bytes: int = CACHE_BYTES,
    ) -> None:
        self._path = os.fspath(path)
        self._threads = threads
        self._in_flight = in_flight
        self._cache = (None if cache_dir is None else os.fspath(cache_dir), cache_bytes)
        self.dequantize = check_flag("dequantize", dequantize)
        _check_threads(threads)
        if type(in_flight) is not int or in_flight < 1:
            raise InvalidArgumentError(f"in_flight must be an integer >= 1, not {in_flight!r}")
        if type(cache_bytes) is not int or cache_bytes < 0:
            raise InvalidArgumentError(f"cache_bytes must be an integer >= 0, not {cache_bytes!r}")
        layout.manifest_file(self._path)  # an unmerged multi-writer root: say so, not "no manifest.json"
        self._native = _native.Reader(self._path, threads, in_flight, None, None, self._cache[0], cache_bytes)
        self.manifest_path: str = os.fspath(self._native.manifest_path)
        # Typed values built by the native reader once per open (no JSON text crosses the boundary).
        self.manifest: dict[str, Any] = self._native.manifest()
        self.schema: list[TensorSpec] = [TensorSpec(*t) for t in self._native.schema()]
        self.metadata: dict[str, Any] = self.manifest["metadata"]

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self._path, "threads": self._threads, "dequantize": self.dequantize,
                "in_flight": self._in_flight, "cache": self._cache}  # fmt: skip

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            state["path"], threads=state["threads"], dequantize=state["dequantize"], in_flight=state["in_flight"],
            cache_dir=state["cache"][0], cache_bytes=state["cache"][1],
        )  # fmt: skip

    def __len__(self) -> int:
        return len(self._native)

    def entry(self, pos: int) -> SampleInfo:
        """The index entry at position ``pos``. Raises SampleNotFoundError when out of range."""
        return SampleInfo(*self._native.entry(pos))

    def position(self, sample_id: int) -> int | None:
        """Position of the sample with this id, or None."""
        return self._native.position(sample_id)

    def lengths(self) -> list[int]:
        """Token counts ``L`` of all samples in position order (from the index; no payload read)."""
        return self._native.lengths()

    def read(self, pos: int, *, pin_memory: bool = False) -> dict[str, Any]:
        """Decodes the sample at ``pos`` into new CPU tensors (pinned when ``pin_memory``)."""
        info = self.entry(pos)  # the one index lookup of this read
        if not self.dequantize and any(s.precision for s in self.schema):
            return {**self._read_stored(pos, info.n_tokens), "sample_id": info.sample_id}
        out = {s.name: empty(s, info.n_tokens, pin_memory) for s in self.schema}
        self._native.read_into(pos, self._out_buffers(pos, out, info.n_tokens))
        return {**out, "sample_id": info.sample_id}

    def _read_stored(self, pos: int, n: int) -> dict[str, torch.Tensor]:
        """The sample with FP8 tensors as stored: FP8 bytes and f32 scales (see the class docstring)."""
        bufs = [
            torch.empty((n, fp8.stored_row_bytes(s)), dtype=torch.uint8) if s.precision else empty(s, n, False)
            for s in self.schema
        ]
        self._native.read_stored_into(pos, [writable_bytes(b) for b in bufs])
        out: dict[str, torch.Tensor] = {}
        for s, b in zip(self.schema, bufs, strict=True):
            if s.precision:
                k = 4 * fp8.scales_per_row(s)
                out[s.name] = b[:, k:].contiguous().view(torch.float8_e4m3fn)
                out[s.name + "_scales"] = b[:, :k].contiguous().view(torch.float32)
            else:
                out[s.name] = b
        return out

    def read_into(self, pos: int, out: dict[str, torch.Tensor]) -> None:
        """Decodes the sample at ``pos`` (0-based) into caller-provided contiguous, writable CPU tensors, one per
        schema tensor, each of the exact shape and dtype (``[L]`` / ``[L, width]``), not overlapping each other.

        An output whose memory the kernel refuses to write (``torch.from_numpy`` over a read-only memory map) is
        refused before anything is written. A tensor over a numpy array merely flagged ``writeable=False`` (torch
        warns when making it; it has no read-only tensors) cannot be told from any other and is written.

        Raises:
            ArgumentTypeError: ``pos`` not an int, or an output not a tensor.
            SampleNotFoundError: ``pos`` out of range.
            InvalidArgumentError: an output missing, of the wrong shape, dtype or device, not writable (read-only
                memory, named), or overlapping another.
            CorruptRecordError: the record fails its checksum or does not decode.
        """
        self._native.read_into(pos, self._out_buffers(pos, out))

    def read_batch(
        self, items: Sequence[tuple[int, dict[str, torch.Tensor]]], *, n_tokens: Sequence[int] | None = None
    ) -> None:
        """:meth:`read_into` for several samples in one call: ``[(pos, out)]``, each ``out`` as for
        :meth:`read_into`, no two outputs overlapping. ``n_tokens``: the items' token counts, in order, when the
        caller has them from :meth:`entry` (spares a second index lookup; a wrong count is refused as an output of
        the wrong size). All records are read (one positioned read each; from object
        storage, a batch's adjacent records by one ranged GET, up to ``in_flight`` GETs at once), checksummed and
        decoded on the reader's ``threads`` with the GIL released once.

        Raises:
            As :meth:`read_into`; CorruptRecordError: the first item (in ``items`` order) whose record fails; the
            others are decoded.
        """
        if n_tokens is None:
            self._native.read_batch([(pos, self._out_buffers(pos, out)) for pos, out in items])
        else:
            batch = zip(items, n_tokens, strict=True)
            self._native.read_batch([(pos, self._out_buffers(pos, out, n)) for (pos, out), n in batch])

    def read_tensor(
        self, name: str, positions: Sequence[int], *, on_error: str = "raise"
    ) -> list[torch.Tensor | EagleIOError]:
        """One schema tensor, ``name``, of each sample at ``positions``, as new CPU tensors (``[L]`` / ``[L, width]``
        of the schema dtype; FP8 dequantised), decoding nothing else. Each record is read whole and its CRC-32
        checked (the checksum covers the record), on the reader's threads with the GIL released once; from object
        storage the records are fetched together, as by :meth:`read_batch`. Cheap for small tensors (a loss mask
        is about ``L / 20`` bytes to decode), though every record's bytes are read.

        Args:
            on_error: ``"raise"``: raise the error of the first failing position (every record is attempted);
                ``"return"``: put each failing position's error (e.g. its :class:`eagle_io.CorruptRecordError`,
                naming the shard, sample id and byte offset) in its place in the list.

        Raises:
            InvalidArgumentError: a tensor the schema lacks, or an unknown ``on_error``.
            ArgumentTypeError / SampleNotFoundError: a position that is not an int / out of range.
            CorruptRecordError: a record that fails its checks (``on_error="raise"``).
        """
        if on_error not in ("raise", "return"):
            raise InvalidArgumentError(f"on_error must be 'raise' or 'return', not {on_error!r}")
        spec = next((s for s in self.schema if s.name == name), None)
        if spec is None:
            raise InvalidArgumentError(f"the schema has no tensor {name!r} (it has {[s.name for s in self.schema]})")
        outs = []
        for pos in positions:
            if isinstance(pos, bool) or not isinstance(pos, int):
                raise ArgumentTypeError(f"position must be an int, got {type(pos).__name__}")
            if not 0 <= pos < len(self):
                raise SampleNotFoundError(f"position {pos} out of range for a dataset of {len(self)} samples")
            outs.append(empty(spec, self.entry(pos).n_tokens, False))
        errors = self._native.read_tensor(name, [(p, writable_bytes(t)) for p, t in zip(positions, outs, strict=True)])
        if on_error == "raise":
            first = next((e for e in errors if e is not None), None)
            if first is not None:
                raise first
        return [t if e is None else e for t, e in zip(outs, errors, strict=True)]

    def _out_buffers(self, pos: int, out: dict[str, torch.Tensor], n: int | None = None) -> list:
        """The writable bytes of ``out``'s tensors in schema order, after checking them against the sample at
        ``pos`` of ``n`` tokens (None: looked up in the index) (the native reader checks byte counts and overlaps
        only)."""
        if isinstance(pos, bool) or not isinstance(pos, int):
            raise ArgumentTypeError(f"position must be an int, got {type(pos).__name__}")
        if not 0 <= pos < len(self):
            raise SampleNotFoundError(f"position {pos} out of range for a dataset of {len(self)} samples")
        if n is None:
            n = self.entry(pos).n_tokens
        buffers = []
        for s in self.schema:
            t = out.get(s.name)
            if t is None:
                raise InvalidArgumentError(f"position {pos}: no output tensor for {s.name!r}")
            if not isinstance(t, torch.Tensor):
                raise ArgumentTypeError(f"position {pos}: output {s.name!r} is a {type(t).__name__}, not a tensor")
            if t.dtype != getattr(torch, s.dtype) or not t.is_contiguous() or t.device.type != "cpu":
                raise InvalidArgumentError(f"output {s.name!r} must be a contiguous CPU tensor of dtype {s.dtype}")
            check_output_shape(s, t, n, f"position {pos}: output ")
            buffers.append(writable_bytes(t))
        return buffers

    def prefix_records(self) -> list[tuple[int, int, str, str]]:
        """The dataset's shared-prefix records (docs/FORMAT.md 4.7), in manifest order: ``(prefix_id, n_tokens,
        "sha256:<hex>" of their token ids, their prefix shard's file as the manifest lists it)``; empty before
        format version 3. They are no samples: no position, not counted by ``len``."""
        return self._native.prefix_records()

    def __getitem__(self, pos: int) -> dict[str, Any]:
        if not -len(self) <= pos < len(self):
            raise SampleNotFoundError(f"position {pos} out of range for a dataset of {len(self)} samples")
        return self.read(pos % len(self))

    @staticmethod
    def verify(path: str | os.PathLike[str], *, threads: int = 0) -> list[tuple[str, int | None, int, str]]:
        """Reads, checksums and decodes every record of the dataset at ``path``. Returns every
        problem as ``(shard_path, sample_id or None, byte_offset, message)``; empty when all is well."""
        _check_threads(threads)
        return [(os.fspath(p), s, o, m) for p, s, o, m in _native.Reader.verify(os.fspath(path), threads)]
