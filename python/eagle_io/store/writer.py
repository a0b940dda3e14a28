"""The dataset writer: samples in, committed shards and a manifest out."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from .. import _native, defaults
from ..errors import InvalidArgumentError, SchemaError
from . import layout
from ._tensors import as_native
from .schema import TensorSpec


def check_sample_id(sample_id: Any) -> None:
    """The one sample-id check of every writer and capture path: an ``int`` (not ``bool``) in ``[0, 2**64)``, the
    index's unsigned 64-bit id (docs/FORMAT.md).

    Raises:
        SchemaError: naming the id.
    """
    if type(sample_id) is not int or not 0 <= sample_id < 2**64:
        raise SchemaError.for_sample(sample_id, "sample ids are integers in [0, 2**64)")


class ShardWriter:
    """Writes samples into a dataset directory: ``root/shards/*.eio`` and ``root/<manifest_name>``.

    Each sample is a mapping from schema tensor name to a CPU ``torch.Tensor``, numpy array or
    buffer; every tensor's first dimension is the sample's token count ``L``. Samples are
    validated (dtype, shape, contiguity, unique ``sample_id``) before anything is written,
    encoded on ``threads`` Rust threads with the GIL released, and appended in order by an I/O
    thread. Shards rotate at ``shard_bytes`` and are committed atomically; the manifest is
    rewritten atomically after each commit, so a crash loses at most the open shard.

    Args:
        root: dataset directory (created if missing).
        schema: the tensors of every sample (see :func:`eagle_io.store.schema.eagle3_schema`).
        metadata: JSON-serialisable facts every consumer needs (target model, layer ids and
            their convention, tokenizer...); stored in the manifest; must match on resume.
        shard_bytes: shard size at which a shard is committed (bytes).
        chunk_bytes: decoded bytes per codec chunk (whole rows; rows of 16 KiB or more, e.g. 8,192+ bf16 channels,
            go at least 64 to a chunk).
        threads: encoding threads (0 = one per CPU).
        zstd_level: zstd level of the byte planes of floating tensors (literals always Huffman-coded; the
            default, :data:`eagle_io.defaults.ZSTD_LEVEL`, is order-0 entropy coding at high speed, see
            benches/README.md). Every default comes from :mod:`eagle_io.defaults`.
        queue_depth: encoded records in flight before ``write`` blocks (backpressure).
        rank: writer rank; shard names start ``r{rank:05}-`` and, for ``world_size > 1``, the
            manifest is ``manifest.r{rank:05}.json`` so ranks sharing a root never collide.
        world_size: number of writers sharing ``root``.
        resume: continue an existing dataset (its schema and metadata must match).
        uploaded_to: the object prefix (``s3://bucket/run``) this root's committed shards are uploaded to
            (:mod:`eagle_io.store.upload`): on resume, a listed shard whose staged copy was removed after its upload
            is read from there.

    Raises:
        InvalidArgumentError: ``root`` already holds this writer's data and ``resume`` is False,
            or another live writer holds it; ``rank`` outside ``[0, world_size)``, a negative ``threads``, or
            ``metadata`` that is not JSON (NaN/Inf included).
        IncompatibleDatasetError: resuming with a different schema or metadata.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        schema: Sequence[TensorSpec],
        metadata: Mapping[str, Any],
        *,
        shard_bytes: int = defaults.SHARD_BYTES,
        chunk_bytes: int = defaults.CHUNK_BYTES,
        threads: int = defaults.THREADS,
        zstd_level: int = defaults.ZSTD_LEVEL,
        queue_depth: int = defaults.QUEUE_DEPTH,
        rank: int = 0,
        world_size: int = 1,
        resume: bool = False,
        uploaded_to: str | None = None,
    ) -> None:
        for name, value, low in (("world_size", world_size, 1), ("rank", rank, 0), ("threads", threads, 0)):
            if type(value) is not int or value < low:
                raise InvalidArgumentError(f"{name} must be an integer >= {low}, not {value!r}")
        if rank >= world_size:  # rank 2 of 2 wrote manifest.r00002.json, which merge never expects
            raise InvalidArgumentError(f"rank {rank} is outside [0, world_size = {world_size})")
        self.schema = list(schema)
        for i, spec in enumerate(self.schema):
            if not isinstance(spec, TensorSpec):  # a dict here ended in an AttributeError traceback
                raise InvalidArgumentError(
                    f"schema item {i} is a {type(spec).__name__}, not an eagle_io.TensorSpec "
                    "(build schemas with eagle_io.TensorSpec(name, dtype, width) or eagle_io.eagle3_schema)"
                )
        self.root = os.fspath(root)
        manifest_name = layout.manifest_name(rank, world_size)
        # The core makes the root, shards/ and the lock before it looks at what the root holds: a refusal takes
        # them back (a writer refused over another dataset left shards/ and a lock in it).
        footprint = layout.Footprint(self.root)
        try:
            self._native = _native.Writer(
                self.root,
                [(s.name, s.dtype, s.width, s.precision, s.scale_block) for s in self.schema],
                metadata,
                shard_bytes=shard_bytes,
                chunk_bytes=chunk_bytes,
                threads=threads,
                zstd_level=zstd_level,
                queue_depth=queue_depth,
                shard_prefix=layout.shard_prefix(rank),
                manifest_name=manifest_name,
                resume=resume,
                uploaded_to=uploaded_to,
                rank=rank,
            )
        except BaseException:
            footprint.take_back([manifest_name, layout.lock_name(manifest_name), layout.SHARD_DIR])
            raise
        self.manifest_path = os.path.join(self.root, manifest_name)
        self._footprint, self._rank = footprint, rank

    def _convert(self, sample_id: int, tensors: Mapping[str, Any], key: str) -> tuple:
        check_sample_id(sample_id)
        names = [s.name for s in self.schema]
        if set(tensors) != set(names):
            missing, extra = sorted(set(names) - set(tensors)), sorted(set(tensors) - set(names))
            raise SchemaError.for_sample(
                sample_id, f"tensors do not match the schema (missing {missing}, unexpected {extra})"
            )
        try:
            return (sample_id, key, [as_native(n, tensors[n]) for n in names])
        except (ValueError, TypeError) as e:
            raise SchemaError.for_sample(sample_id, str(e)) from e

    def write(
        self,
        sample_id: int,
        tensors: Mapping[str, Any],
        key: str = "",
        prefix: int | None = None,
        *,
        shared_prefix: int = 0,
    ) -> None:
        """Writes one sample. ``sample_id`` is the caller's unique id (e.g. the source record
        number), ``key`` an optional string id (e.g. ShareGPT's ``id``). With ``prefix`` (an id
        ``write_prefix`` returned), the sample's first tokens are that prefix record's and
        ``tensors`` hold only the rows after it (``[L - prefix_tokens, ...]``); readers return the
        whole sample. With ``shared_prefix=P`` (``tensors`` whole), the sample's first ``P`` tokens
        are a prefix other samples share (a system prompt): the first sample with those token ids
        stores them as a prefix record (docs/FORMAT.md 4.7), numbered by the writer from
        ``rank * 2**40`` on (apart from every other rank's, so ``eagle-io merge`` carries them), and
        each such sample stores its rows after them with a reference. Blocks while the queue is full.

        Raises:
            SchemaError: a tensor's dtype, shape or contiguity does not match, the id is taken,
                ``prefix`` names no prefix record of this dataset, or ``shared_prefix`` leaves no token
                of the sample (or comes with ``prefix``).
        """
        self._native.write_batch([self._convert(sample_id, tensors, key)], [prefix], [shared_prefix])

    def write_batch(
        self,
        samples: Sequence[tuple[int, Mapping[str, Any], str]],
        prefixes: Sequence[int | None] | None = None,
        shared: Sequence[int] | None = None,
    ) -> None:
        """Writes ``[(sample_id, tensors, key)]``, encoding all of them in parallel; ``prefixes`` and
        ``shared``, one per sample when given, as ``write``'s ``prefix`` and ``shared_prefix``. Nothing
        is written when any sample is invalid."""
        self._native.write_batch([self._convert(i, t, k) for i, t, k in samples], prefixes, shared)

    def write_prefix(self, prefix_id: int, tensors: Mapping[str, Any]) -> tuple[int, int, str]:
        """Stores a shared prefix (e.g. a system prompt's tokens and states, every schema tensor
        ``[P, ...]``) once, as a prefix record (docs/FORMAT.md 4.7), and makes the dataset format
        version 3. ``prefix_id`` is unique among this dataset's prefixes (its own namespace, apart
        from sample ids). Returns ``(prefix_id, P, "sha256:<hex>")``, the digest of its int64
        ``input_ids``; samples then pass ``prefix=prefix_id``.

        Raises:
            SchemaError: the schema has no int64 ``input_ids [L]``, the id is taken, the same token
                ids are stored already, P is 0, or a tensor does not match the schema.
        """
        return self._native.write_prefix(self._convert(prefix_id, tensors, ""))

    def prefixes(self) -> dict[str, tuple[int, int]]:
        """The prefix records written or found on resume: ``{"sha256:<hex>": (prefix_id, P)}``."""
        return self._native.prefixes()

    def __contains__(self, sample_id: int) -> bool:
        """True when ``sample_id`` is written or queued (including samples found on resume)."""
        return sample_id in self._native

    def sample_ids(self) -> list[int]:
        """Sorted ids of every sample written or queued (including samples found on resume)."""
        return self._native.sample_ids()

    def stats(self) -> dict[str, float]:
        """Counters: samples, tokens, raw_bytes, stored_bytes, shards_committed,
        encode_seconds, blocked_seconds, elapsed_seconds, removed_temp_files, adopted_shards."""
        return self._native.stats()

    def close(self, complete: bool = True) -> dict[str, Any]:
        """Commits the last shard, marks the manifest complete (unless ``complete`` is False: a capture that stopped
        before its end, which ``resume`` continues and a ``follow=True`` reader waits on), and returns it."""
        return self._native.close(complete=complete)

    def take_back(self) -> bool:
        """After :meth:`close` (or the close of the sink that took the writer over), for a run that ended before it
        stored anything (it failed while starting): when this writer created its dataset (no manifest of it was there
        when it opened) and committed no shard, removes what it created (:class:`~eagle_io.store.layout.Footprint`),
        as a refused writer does; a dataset it resumed is left as it is. True when it did."""
        from .manifest import read_manifest

        name = os.path.basename(self.manifest_path)
        if not self._footprint.is_new(name) or read_manifest(self.manifest_path)["shards"]:
            return False
        return bool(self._footprint.take_back([name, layout.lock_name(name), layout.SHARD_DIR], shards_of=[self._rank]))

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.close(complete=exc is None)
