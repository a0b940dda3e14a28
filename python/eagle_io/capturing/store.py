"""The capture core: what every backend (the Hugging Face hooks, SGLang's scheduler hook) does with a forward's
per-sample states. One place checks a sample, checks its values (NaN/Inf, storage-cast overflow, all-zero layers or
samples, rows copied from another request: :mod:`eagle_io.store.values`) and applies the value policies, skips what
the dataset already holds, counts, records per-layer max |x| (``value_stats.json``), and puts the sample into the
capture ring (:class:`~eagle_io.capturing.ring.RingSink`), which copies it asynchronously and feeds the shard writer.

A backend calls :func:`check_sample` (or :meth:`SampleStore.check`) before or while it runs the forward, then
:meth:`SampleStore.put_forward` with the forward's states and where each sample's rows are (one host sync for the
value checks of the whole forward), then :meth:`SampleStore.close`.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import torch

from .. import defaults
from ..errors import ImplausibleStatesError, InvalidArgumentError, NonFiniteStatesError, SchemaError
from ..store import layout, value_stats, values
from ..store.metadata import eagle3_metadata
from ..store.schema import eagle3_schema
from ..store.target_identity import target_differences
from ..store.upload import StagedUpload, local_dir, stage_remote_manifests
from ..store.writer import ShardWriter, check_sample_id
from .options import VALUE_POLICIES, CaptureOptions
from .ring import RingSink, check_ring_memory

__all__ = ["COUNTS", "ForwardSample", "SampleStore", "check_sample"]

logger = logging.getLogger("eagle_io.capture")

COUNTS = (
    "written",
    "already_done",
    "dropped",
    "nonfinite_skipped",
    "zero_sample_skipped",
    "zero_rows_skipped",
    "copied_layers_skipped",
    "copied_rows_skipped",
    "unsupervised_skipped",
    "after_stop",
)
"""The store's counters: samples put into the ring; skipped because the dataset holds them (resume); dropped by a
full ring (``drop_when_full``); skipped by a value policy, per kind; skipped because their loss mask is all 0 (no
token to train on: every backend's samples, e.g. SGLang requests whose mask was cut to nothing before capture);
arriving after :meth:`SampleStore.close`."""

FP16_WARNING = (
    "float16 {what}: its range ends at 65504, and residual-stream states of large models exceed it (an overflow "
    "becomes Inf, caught as nonfinite); bfloat16 is recommended"
)


def _same_target_as_recorded(
    out_dir: str | os.PathLike[str], writer_options: Mapping[str, Any], meta: dict[str, Any]
) -> dict[str, Any]:
    """``meta`` with the ``target_model`` record of the manifest being resumed when that record describes this same
    target (the writer refuses a resume whose metadata differs in any byte, and the target's identity is computed
    afresh: sampled where an older record holds every file's sha256); else ``meta`` as it is, for the writer to
    refuse naming ``target_model``."""
    name = layout.manifest_name(writer_options.get("rank", 0), writer_options.get("world_size", 1))
    try:
        with open(os.path.join(out_dir, name), encoding="utf-8") as f:
            recorded = (json.load(f).get("metadata") or {}).get("target_model")
    except (OSError, ValueError, AttributeError):
        return meta  # no manifest yet, or one the writer will name as unreadable
    if not isinstance(recorded, dict) or target_differences(recorded, meta.get("target_model") or {}):
        return meta
    return {**meta, "target_model": recorded}


class ForwardSample(NamedTuple):
    """One sample of a forward for :meth:`SampleStore.put_forward`: its rows are ``[start, start + length)`` of the
    forward's ``[N, ...]`` states; ``input_ids [L]`` and ``loss_mask [L]`` as for :meth:`SampleStore.put`;
    ``shared_prefix``: its first tokens that other samples share, stored once (:mod:`eagle_io.capturing.prefixes`;
    0: none). ``stored_prefix``: the SHA-256 digest of a prefix record's token ids put before; ``input_ids``,
    ``loss_mask`` and the rows are then the sample's tokens after that prefix only
    (:meth:`eagle_io.capturing.ring.RingSink.put`)."""

    sample_id: int
    input_ids: Sequence[int] | torch.Tensor
    loss_mask: Sequence[int] | torch.Tensor
    start: int
    length: int
    key: str = ""
    shared_prefix: int = 0
    stored_prefix: bytes | None = None


def _check_policy(name: str, policy: str) -> None:
    if policy not in VALUE_POLICIES:
        raise InvalidArgumentError(f"{name} must be 'raise' or 'skip', not {policy!r}")


def check_sample(
    sample_id: Any,
    input_ids: Sequence[int] | torch.Tensor,
    loss_mask: Sequence[int] | torch.Tensor,
    *,
    max_length: int | None,
    vocab_size: int | None,
) -> None:
    """Refuses a sample the capture cannot store as declared, before anything of it is written.

    Args:
        sample_id: must be an ``int`` (not ``bool``) in ``[0, 2**64)``.
        input_ids: ``[L]`` integer token ids, ``1 <= L <= max_length``, each in ``[0, vocab_size)``.
        loss_mask: ``[L]`` values 0 or 1.

    Raises:
        SchemaError: naming the sample and the problem (``sample_id`` attribute set).
    """
    check_sample_id(sample_id)
    ids = torch.as_tensor(input_ids)
    mask = torch.as_tensor(loss_mask)
    n = int(ids.shape[0]) if ids.dim() else 0
    problem = None
    if ids.dim() != 1 or n == 0:
        problem = "it has 0 tokens" if n == 0 else f"input_ids has shape {tuple(ids.shape)}, not [L]"
    elif ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        problem = f"its input_ids are {str(ids.dtype).removeprefix('torch.')}, not integers"
    elif max_length is not None and n > max_length:
        problem = f"it has {n} tokens, more than this run's max_length {max_length}"
    elif mask.dim() != 1 or mask.shape[0] != n:
        problem = f"its loss_mask has {mask.shape[0] if mask.dim() else 0} tokens for {n} input_ids"
    elif bool(((mask != 0) & (mask != 1)).any()):
        problem = f"its loss_mask holds {int(mask[(mask != 0) & (mask != 1)][0])}; values must be 0 or 1"
    elif vocab_size is not None and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        bad = int(ids.max()) if int(ids.max()) >= vocab_size else int(ids.min())
        problem = f"it holds token id {bad}, outside the target's vocab of {vocab_size}"
    if problem:
        raise SchemaError.for_sample(sample_id, f"{problem}; nothing of it was written")


class SampleStore:
    """Stores captured samples through a capture ring; thread-safe (SGLang calls it from its forward thread while a
    stop may arrive on another).

    Args:
        sink: the capture ring feeding a shard writer (:class:`~eagle_io.capturing.ring.RingSink`); see
            :meth:`create` for the usual construction.
        state_dtype: dtype the states are stored in (``torch.bfloat16``...); float32 forwards are rounded to nearest.
        max_length, vocab_size: :func:`check_sample`'s limits (None: unchecked).
        nonfinite: the :data:`VALUE_POLICIES` policy for NaN/Inf (and storage-cast overflow).
        implausible: the policy for all-zero samples, all-zero layers in a row and rows copied from another sample
            of the forward (:data:`eagle_io.store.values.IMPLAUSIBLE`).
        done: ids the dataset already holds (resume); :meth:`put` skips them.
        manifest_path: the writer's manifest file; ``value_stats.json`` is written beside it at :meth:`close`.
        aux_layer_ids: the captured layers, to name them in errors and stats (None: ``aux block j``).

    Attributes:
        counts: :data:`COUNTS` as a dict.
        done: ids already in the dataset or put since.
        absmax: max |x| per aux layer then of the final state (``k + 1`` floats) over the samples written, or None
            before the first.
        known_prefixes: the ``"sha256:<hex>"`` keys of the shared-prefix records the dataset held when
            :meth:`create` opened it (a resumed capture's), where its backend looks for earlier prefixes.

    Raises:
        InvalidArgumentError: an unknown policy.
    """

    def __init__(
        self,
        sink: RingSink,
        *,
        state_dtype: torch.dtype,
        max_length: int | None,
        vocab_size: int | None,
        nonfinite: str = "raise",
        implausible: str = "raise",
        done: Iterable[int] = (),
        manifest_path: str | None = None,
        aux_layer_ids: Sequence[int] | None = None,
    ) -> None:
        _check_policy("nonfinite", nonfinite)
        _check_policy("implausible", implausible)
        self._sink = sink
        self._final_stats: dict[str, Any] | None = None
        self.state_dtype = state_dtype
        self.max_length, self.vocab_size, self.nonfinite = max_length, vocab_size, nonfinite
        self.implausible = implausible
        self.done = set(done)
        self.manifest_path = manifest_path
        self.aux_layer_ids = list(aux_layer_ids) if aux_layer_ids is not None else None
        self.counts = dict.fromkeys(COUNTS, 0)
        self.absmax: list[float] | None = None
        self.source_dtype: torch.dtype | None = None
        self.manifest: dict[str, Any] | None = None
        self._closed = False
        self._close_error: Exception | None = None
        self._stats_written = False
        self.upload: StagedUpload | None = None  # set by create() for an object-storage out_dir
        self.known_prefixes: list[str] = []  # set by create(): the prefix records of the dataset resumed
        self.upload_report: dict[str, Any] | None = None
        self._lock = threading.Lock()
        if state_dtype == torch.float16:
            warnings.warn(FP16_WARNING.format(what="storage (state_dtype)"), stacklevel=2)

    @classmethod
    def create(
        cls,
        out_dir: str | os.PathLike[str],
        options: CaptureOptions,
        *,
        aux_layer_ids: Sequence[int],
        target_info: Mapping[str, Any] | None = None,
    ) -> SampleStore:
        """Opens (or, with ``writer_options["resume"]``, continues) the EAGLE-3 dataset in ``out_dir`` behind a
        capture ring, with ``options`` (:class:`~eagle_io.capturing.options.CaptureOptions`, checked when built).

        ``out_dir`` may be an object-storage prefix (``s3://bucket/run``, docs/STORAGE.md): the dataset is then
        written to the local directory ``writer_options["staging"]`` (default ``./eagle-io-staging/BUCKET/PREFIX``),
        each shard uploaded when it commits and its staged copy removed (:class:`eagle_io.store.upload.StagedUpload`),
        the manifest last; :meth:`put_forward` blocks while more than ``writer_options["staging_bytes"]`` (default
        :data:`eagle_io.defaults.STAGING_BYTES`) of committed shards await upload. Resuming continues the remote
        dataset (its manifest is fetched when the staging directory has none); the prefix is checked first
        (:func:`eagle_io.store.upload.stage_remote_manifests`).

        Args:
            aux_layer_ids: the layers the backend captures (eagle-io ids, :mod:`eagle_io.store.eagle3`): ``options``'
                ids once the backend placed them, or the target's default.
            target_info: ``num_layers``, ``hidden_size``, ``vocab_size`` (and ``model_id``, ``files``,
                ``architecture`` when known), recorded in the metadata
                (:func:`eagle_io.store.metadata.eagle3_metadata`); default ``options.target_info``.

        FP8 states (``options.precision="fp8"``) are quantised where the copy happens: on their GPU before the
        device-to-host copy for CUDA states, in the writer's encode pass for CPU ones (``quantize_on_device``:
        :class:`~eagle_io.capturing.ring.RingSink`).

        Raises:
            ObjectStorageError: a request to the object store failed (at resume, or an upload, raised by
                :meth:`put_forward` / :meth:`close`), naming the object's URL and the HTTP status.
            InvalidArgumentError: ``out_dir`` holds this writer's data without ``resume`` (or, an object-storage one,
                a capture by another number of writers), a bad writer option, ``staging`` with a local ``out_dir``,
                a ``target_info`` without positive ``num_layers`` / ``hidden_size`` / ``vocab_size``, or a ring
                larger than this process' available memory (:func:`~eagle_io.capturing.ring.check_ring_memory`).
            IncompatibleDatasetError: resuming a dataset of another schema or metadata, or from a staging directory
                that is not the remote dataset's state nor a later one. A resumed dataset's ``target_model`` record
                is kept when it describes the same target (:func:`~eagle_io.store.target_identity.target_differences`
                finds nothing: one written before the sampled identity records every file's full sha256).
        """
        check_ring_memory(options.ring_bytes)  # this process allocates the ring
        target_info = dict(options.target_info if target_info is None else target_info)
        writer_options = dict(options.writer_options)
        staging = writer_options.pop("staging", None)
        staging_bytes = writer_options.pop("staging_bytes", defaults.STAGING_BYTES)
        meta = eagle3_metadata(  # checks target_info
            target_info=target_info,
            aux_layer_ids=aux_layer_ids,
            dtype=options.state_dtype,
            tokenizer_identity=options.tokenizer_identity,
            max_length=options.max_length,
            extra=options.metadata,
        )
        hidden = int(target_info["hidden_size"])
        schema = eagle3_schema(hidden, len(aux_layer_ids), options.state_dtype, options.precision)
        url = os.fspath(out_dir) if layout.is_url(out_dir) else None
        if url is None and staging is not None:
            raise InvalidArgumentError(f"staging is for an object-storage out_dir (s3://...), not {out_dir}")
        if url is not None:
            out_dir = local_dir(url, staging)
            rank, world = writer_options.get("rank", 0), writer_options.get("world_size", 1)
            mine = [layout.manifest_name(rank, world)]
            stage_remote_manifests(url, out_dir, mine, resume=bool(writer_options.get("resume")))
            writer_options["uploaded_to"] = url
        if writer_options.get("resume"):
            meta = _same_target_as_recorded(out_dir, writer_options, meta)
        writer = ShardWriter(out_dir, schema, meta, **writer_options)
        sink = None
        try:
            upload = None if url is None else StagedUpload(writer.manifest_path, url, staging_bytes=staging_bytes)
            done, known = writer.sample_ids(), list(writer.prefixes())
            sink = RingSink(
                writer,
                ring_bytes=options.ring_bytes,
                batch=options.ring_batch,
                timeout_s=options.timeout_s,
                drop_when_full=options.drop_when_full,
                quantize_on_device=options.quantize_on_device,
            )
            store = cls(
                sink,
                state_dtype=getattr(torch, options.state_dtype),
                max_length=options.max_length,
                vocab_size=int(target_info["vocab_size"]),
                nonfinite=options.nonfinite,
                implausible=options.implausible,
                done=done,
                manifest_path=writer.manifest_path,
                aux_layer_ids=aux_layer_ids,
            )
        except BaseException:  # a writer dropped unclosed marks its manifest complete: a start that failed said "done"
            (sink or writer).close(complete=False)
            writer.take_back()
            raise
        store.upload, store.known_prefixes = upload, known
        return store

    def check(self, sample_id: Any, input_ids: Any, loss_mask: Any) -> None:
        """:func:`check_sample` with this store's ``max_length`` and ``vocab_size``."""
        check_sample(sample_id, input_ids, loss_mask, max_length=self.max_length, vocab_size=self.vocab_size)

    def is_done(self, sample_id: int) -> bool:
        """Whether the dataset already holds ``sample_id`` (counted as ``already_done`` when it does), so a backend
        can leave it out of its forward."""
        with self._lock:
            if sample_id in self.done:
                self.counts["already_done"] += 1
                return True
            return False

    def put(
        self,
        sample_id: int,
        input_ids: Sequence[int] | torch.Tensor,
        loss_mask: Sequence[int] | torch.Tensor,
        aux_hidden_states: torch.Tensor,
        hidden_states: torch.Tensor,
        *,
        key: str = "",
    ) -> bool:
        """Puts one sample (``aux_hidden_states [L, k*H]``, ``hidden_states [L, H]``, on any device) into the ring:
        :meth:`put_forward` of a forward of one sample. Returns True when it was put, False when it was skipped and
        counted."""
        sample = ForwardSample(sample_id, input_ids, loss_mask, 0, int(aux_hidden_states.shape[0]), key)
        return self.put_forward(aux_hidden_states, hidden_states, [sample])[0]

    def put_forward(
        self,
        aux_hidden_states: torch.Tensor,
        hidden_states: torch.Tensor,
        samples: Sequence[ForwardSample],
        *,
        forward_dtype: torch.dtype | None = None,
    ) -> list[bool]:
        """Checks the values of a forward's samples (one host sync, :func:`eagle_io.store.values.row_stats`), then
        puts each sample into the ring, in order. The caller has checked the samples (:meth:`check`).

        Args:
            aux_hidden_states: ``[N, k*H]`` states of the forward's rows (any float dtype, any device; rows that
                belong to no sample, such as padding, are ignored).
            hidden_states: ``[N, H]`` final post-norm states of the same rows.
            samples: where each sample's rows are; copies are looked for across these samples.
            forward_dtype: the dtype the target computed in, when the states were cast before (the HF hooks copy
                them in ``state_dtype``); default their dtype.

        Returns:
            Per sample, True when it was put, False when it was skipped and counted: a loss mask with no 1
            (``unsupervised_skipped``), a value policy ``"skip"``, already in the dataset, the ring full under
            ``drop_when_full``, or the store closed.

        Raises:
            NonFiniteStatesError: NaN/Inf (or a storage-cast overflow) under ``nonfinite="raise"``: names the
                sample, tensor, layer and row; the samples before it were put.
            ImplausibleStatesError: all-zero or copied states under ``implausible="raise"``.
            SchemaError: tensors that do not fit the dataset's schema.
            RingTimeoutError: the writers could not keep up for the ring's timeout.
            ObjectStorageError, IncompatibleDatasetError: uploading to an object-storage ``out_dir`` failed.
        """
        if not samples:
            return []
        if self.upload is not None:
            self.upload.wait_for_room()
        source = forward_dtype or aux_hidden_states.dtype
        self._note_source_dtype(source)
        stats = values.row_stats(aux_hidden_states, hidden_states)
        k = int(stats.absmax.shape[1]) - 1
        rows = [values.SampleRows(s.sample_id, s.input_ids, s.start, s.length) for s in samples]

        def same_rows(tensor: str, a: int, b: int) -> bool:
            x = aux_hidden_states if tensor == "aux_hidden_states" else hidden_states
            return torch.equal(x[a], x[b])

        def same_blocks(row: int, a: int, b: int) -> bool:
            h = hidden_states.shape[1]
            return torch.equal(aux_hidden_states[row, a * h : (a + 1) * h], aux_hidden_states[row, b * h : (b + 1) * h])

        found = values.find_problems(
            stats,
            rows,
            names=values.block_names(k, self.aux_layer_ids),
            source_dtype=source,
            held_dtype=aux_hidden_states.dtype,
            store_dtype=self.state_dtype,
            same_rows=same_rows,
            same_blocks=same_blocks,
        )
        out = []
        for s, problems in zip(samples, found, strict=True):
            if not bool(torch.as_tensor(s.loss_mask).any()):
                logger.warning(
                    "eagle-io capture: sample %d has no supervised token (its loss_mask is all 0: a template or "
                    "max_length that left no assistant token); skipped (unsupervised_skipped)", s.sample_id,
                )  # fmt: skip
                with self._lock:
                    self.counts["unsupervised_skipped"] += 1
                out.append(False)
                continue
            if problems and not self._policy_allows(problems[0]):
                out.append(False)
                continue
            end = s.start + s.length
            put = self._put_one(s, aux_hidden_states[s.start : end], hidden_states[s.start : end])
            if put:
                self._add_absmax(values.sample_absmax(stats, s.start, s.length))
            out.append(put)
        return out

    def _note_source_dtype(self, dtype: torch.dtype) -> None:
        if self.source_dtype is None:
            self.source_dtype = dtype
            if dtype == torch.float16:
                warnings.warn(FP16_WARNING.format(what="target forward"), stacklevel=3)

    def _policy_allows(self, problem: dict[str, Any]) -> bool:
        """False (and counted) when the policy of the sample's first problem skips it; raises under ``raise``."""
        kind = problem["kind"]
        policy = self.nonfinite if kind == "nonfinite" else self.implausible
        if policy == "skip":
            logger.warning("eagle-io capture: %s; skipped", problem["message"])
            with self._lock:
                self.counts[f"{kind}_skipped"] += 1
            return False
        tail = "; nothing of this sample was written"
        if kind == "nonfinite":
            err: Exception = NonFiniteStatesError(problem["message"] + tail)
            err.layer, err.overflow = problem["where"], problem["overflow"]
        else:
            err = ImplausibleStatesError(problem["message"] + " (broken capture wiring?)" + tail)
            err.kind = kind
        err.sample_id, err.row, err.tensor = problem["sample_id"], problem["row"], problem["tensor"]
        raise err

    def _add_absmax(self, sample: list[float]) -> None:
        with self._lock:
            old = self.absmax
            self.absmax = sample if old is None else [max(a, b) for a, b in zip(old, sample, strict=True)]

    def _put_one(self, s: ForwardSample, aux: torch.Tensor, hidden: torch.Tensor) -> bool:
        tensors = {
            "input_ids": torch.as_tensor(s.input_ids, dtype=torch.int64),
            "loss_mask": torch.as_tensor(s.loss_mask).to(torch.uint8),
            "aux_hidden_states": aux.to(self.state_dtype),
            "hidden_states": hidden.to(self.state_dtype),
        }
        sid = s.sample_id
        with self._lock:
            if self._closed:
                self.counts["after_stop"] += 1
                logger.warning("eagle-io capture: sample %d arrived after the capture stopped; not written", sid)
                return False
            if s.sample_id in self.done:
                self.counts["already_done"] += 1
                return False
            put = self._sink.put(
                s.sample_id, tensors, key=s.key, shared_prefix=s.shared_prefix, stored_prefix=s.stored_prefix
            )
            if not put:
                self.counts["dropped"] += 1
                return False
            self.done.add(s.sample_id)
            self.counts["written"] += 1
            return True

    def value_stats(self) -> dict[str, Any]:
        """What ``value_stats.json`` holds for this capture (docs/FORMAT.md section 2.2): ``aux_layer_ids``,
        ``state_dtype``, ``source_dtype``, ``samples`` (written), ``absmax`` (``{"aux_hidden_states": [per layer],
        "hidden_states": float}``, max |x| over the samples written) and ``skipped`` (``{kind: samples}``)."""
        with self._lock:
            a = self.absmax
            return {
                "format": value_stats.STATS_FORMAT,
                "version": 1,
                "aux_layer_ids": self.aux_layer_ids,
                "state_dtype": str(self.state_dtype).removeprefix("torch."),
                "source_dtype": str(self.source_dtype).removeprefix("torch.") if self.source_dtype else None,
                "samples": self.counts["written"],
                "absmax": None if a is None else {"aux_hidden_states": a[:-1], "hidden_states": a[-1]},
                "skipped": {k: self.counts[f"{k}_skipped"] for k in values.KINDS},
            }

    def _write_value_stats(self) -> None:
        """Writes (merging with a resumed run's) ``value_stats.json`` beside the manifest."""
        if self.manifest_path is None:
            return
        path = value_stats.value_stats_path(self.manifest_path)
        new = self.value_stats()
        try:
            old = json.loads(path.read_text()) if path.is_file() else None
        except (OSError, ValueError):
            old = None
        try:
            layout.write_atomic(path, (json.dumps(value_stats.merge_value_stats(old, new), indent=2) + "\n").encode())
        except OSError as e:  # the shards and manifest are committed; the stats are informational
            logger.warning("eagle-io capture: could not write %s: %s", path, e)

    def stats(self) -> dict[str, Any]:
        """The ring's and the writer's counters (:meth:`~eagle_io.capturing.ring.RingSink.stats`; after
        :meth:`close`, their final values); the store's own are :attr:`counts`."""
        with self._lock:
            return dict(self._final_stats) if self._final_stats is not None else self._sink.stats()

    def close(self, complete: bool = True) -> dict[str, Any]:
        """Drains the ring, commits the last shard and returns the manifest, marked ``complete`` unless
        ``complete`` is False (an interrupted capture: what was captured is committed, ``resume`` continues it and a
        ``follow=True`` reader waits for more). Samples put from now on are counted (``after_stop``), not written; a
        later call returns the same manifest, or raises the same error.

        Raises:
            StorageError, InternalError: the writer failed while committing (what it committed before stays valid).
            ObjectStorageError, IncompatibleDatasetError: the last uploads to an object-storage ``out_dir`` failed
                (the shards not uploaded stay staged: resume to complete it).
        """
        with self._lock:
            if not self._closed:
                self._closed = True
                try:
                    # (a sink that is not eagle-io's RingSink may take no argument: the plain close completes)
                    self.manifest = self._sink.close() if complete else self._sink.close(complete=False)
                except Exception as e:
                    self._close_error = e
                # the ring's memory goes back now, not when the last reference to this store does (a serving
                # process starts and stops captures for its whole life)
                try:
                    self._final_stats = self._sink.stats()
                except Exception:  # a sink that failed its close: its counters are gone with it
                    self._final_stats = {}
                self._sink = None
            write_stats = self._close_error is None and not self._stats_written
            self._stats_written = True
        if write_stats:
            self._write_value_stats()
            if self.upload is not None:
                try:
                    self.upload_report = self.upload.finish()
                except Exception as e:
                    with self._lock:
                        self._close_error = e
        with self._lock:
            if self._close_error is not None:
                raise self._close_error
            return self.manifest
