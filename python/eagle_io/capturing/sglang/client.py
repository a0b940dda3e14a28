"""The client side of the SGLang capture: drive an ``sglang.Engine`` whose schedulers capture (see
:mod:`.scheduler`), with :class:`eagle_io.CaptureSession`'s interface, and stop it through the stop file
(:mod:`.protocol`)."""

from __future__ import annotations

import glob
import json
import logging
import os
import time
import uuid
from collections.abc import Sequence
from typing import Any

from ... import defaults
from ...errors import CaptureStopTimeoutError, InvalidArgumentError, ObjectStorageError, StorageError
from ...sglang.ranks import writers_of
from ...store import layout
from ...store.manifest import read_manifest
from ...store.upload import local_dir
from ..options import CaptureOptions
from .protocol import (
    ENV_CAPTURE_DIR,
    ENV_CAPTURE_OPTIONS,
    KEY_PARAM,
    MASK_PARAM,
    POLL_S,
    SAMPLE_PARAM,
    STOP_FILE,
    ack_path,
)

logger = logging.getLogger("eagle_io.serving")


def sample_params(sample: Any) -> dict[str, Any]:
    """The ``custom_params`` that make a request the sample ``sample`` (``index``, ``loss_mask [L]``, optional
    ``id`` stored as the key); put them in the request's ``sampling_params``."""
    params: dict[str, Any] = {SAMPLE_PARAM: int(sample.index), MASK_PARAM: [int(v) for v in sample.loss_mask.tolist()]}
    if getattr(sample, "id", None):
        params[KEY_PARAM] = str(sample.id)
    return params


def _manifests(out_dir: str, writers: int) -> list[str]:
    return [os.path.join(out_dir, layout.manifest_name(r, writers)) for r in range(writers)]


def committed_ids(out_dir: str | os.PathLike[str], writers: int = 1) -> set[int]:
    """Sample ids the ``writers`` shard writers of a capture into ``out_dir`` have committed (all of them). For an
    object-storage ``out_dir`` (``s3://...``): those its remote manifests list. Shards committed in the staging but
    not uploaded yet are left out; the schedulers' writers know them and skip their samples, counted as
    ``already_done``.

    Raises:
        ObjectStorageError: a request failed (other than a 404 on a manifest: that rank has uploaded nothing yet).
    """
    from ...store.reader import Dataset

    ids: set[int] = set()
    remote = layout.is_url(out_dir)
    for m in _manifests(os.fspath(out_dir), writers):
        if not remote and not os.path.exists(m):
            continue
        try:
            ds = Dataset(m, threads=1)
        except ObjectStorageError as e:
            if e.status == 404 and e.url.endswith(os.path.basename(m)):  # no such manifest (not: a shard missing)
                continue
            raise
        ids.update(ds.entry(p).sample_id for p in range(len(ds)))
    return ids


def stop_capture(
    out_dir: str | os.PathLike[str],
    writers: int = 1,
    timeout_s: float = defaults.STOP_TIMEOUT_S,
    staging: str | os.PathLike[str] | None = None,
    complete: bool = True,
) -> list[dict[str, Any]]:
    """Asks every writing scheduler of the capture into ``out_dir`` to drain, commit and answer (see the module
        docstring); waits for the answers of the ``writers`` shard writers (one per data-parallel rank:
    :func:`eagle_io.sglang.ranks.writers_of`) and returns them, in writer-rank order. For an object-storage
        ``out_dir`` (``s3://...``) the stop and answer files live in its local ``staging`` directory (the capture's
        ``writer_options["staging"]``, default ``./eagle-io-staging/BUCKET/PREFIX``). ``complete=False``: the
        capture was interrupted; each writer commits what it holds and leaves its manifest marked incomplete.

        Raises:
            StorageError: a writer failed while closing (the answer's error, naming the rank).
            CaptureStopTimeoutError: not every writer answered within ``timeout_s`` (a scheduler died, or no capture
                runs; a ``TimeoutError``).
    """
    out_dir = local_dir(out_dir, staging)
    token = uuid.uuid4().hex
    for old in glob.glob(os.path.join(glob.escape(out_dir), f"{STOP_FILE}.r*.json")):
        os.remove(old)
    stop = os.path.join(out_dir, STOP_FILE)
    layout.write_atomic(stop, json.dumps({"token": token, "complete": complete}).encode())
    deadline = time.monotonic() + timeout_s
    answers: dict[int, dict[str, Any]] = {}
    try:
        while len(answers) < writers:
            for r in range(writers):
                try:
                    with open(ack_path(out_dir, r), encoding="utf-8") as f:
                        a = json.load(f)
                except (OSError, ValueError):
                    continue
                if a.get("token") == token:
                    answers[r] = a
            if len(answers) < writers:
                if time.monotonic() > deadline:
                    missing = [r for r in range(writers) if r not in answers]
                    raise CaptureStopTimeoutError(
                        f"{out_dir}: shard writers {missing} of {writers} did not stop their capture in "
                        f"{timeout_s:.0f} s"
                    )
                time.sleep(POLL_S)
    finally:
        os.remove(stop)
        for r in answers:
            os.remove(ack_path(out_dir, r))
    bad = [f"writer {r}: {a['error']}" for r, a in sorted(answers.items()) if a.get("error")]
    if bad:
        raise StorageError(f"{out_dir}: the capture failed while closing: " + "; ".join(bad))
    return [answers[r] for r in range(writers)]


class SGLangCaptureSession:
    """A capture through an ``sglang.Engine``, with :class:`eagle_io.CaptureSession`'s interface (``submit``,
    ``close``, context manager, ``done``, ``counts``, ``stats``, ``manifest``), so ``eagle_io.capture`` can hand it
    out for an engine. ``aux_layer_ids`` are the captured layers, from the writers' manifests.

    With ``options`` it starts the scheduler-side capture through ``Engine.collective_rpc("eagle_io_capture_start",
    ...)`` (one data-parallel rank only); with ``started=True`` it attaches to a capture the engine started at launch
    by environment (``EAGLE_IO_CAPTURE_DIR``, options from ``EAGLE_IO_CAPTURE_OPTIONS``:
    :func:`eagle_io.capturing.sglang.launch.launch_capture_engine`), and takes no options of its own. Each
    :meth:`submit` runs one prefill per sample (``max_new_tokens=1``) whose ``custom_params`` carry the sample id and
    loss mask; :meth:`close` stops every writing scheduler and waits for their manifests (:func:`stop_capture`).

    Args:
        engine: an ``sglang.Engine`` in capture-only mode.
        options: the capture's :class:`~eagle_io.capturing.options.CaptureOptions`, carried to every scheduler's
            capture core. ``aux_layer_ids``, when given, must equal the layers the target captures (SGLang sets them
            at launch). ``writer_options`` ``rank`` / ``world_size`` are refused: the data-parallel layout sets them.
        staging: the local directory of an object-storage ``out_dir`` (an attached session; else
            ``options.writer_options["staging"]``).

    Raises:
        InvalidArgumentError: ``options`` with several data-parallel ranks, or with ``started=True``; neither; a
            writer rank set by hand; or, from the schedulers, a launch that is not capture-only mode, chunked prefill
            or the radix cache on, other aux layers than ``aux_layer_ids``.
    """

    def __init__(
        self,
        engine: Any,
        out_dir: str | os.PathLike[str],
        options: CaptureOptions | None = None,
        *,
        started: bool = False,
        staging: str | os.PathLike[str] | None = None,
    ) -> None:
        if started == (options is not None):
            raise InvalidArgumentError(
                "an SGLang capture either starts with options, or attaches (started=True) to one the engine started "
                f"at launch with its own ({ENV_CAPTURE_OPTIONS}); options given: {options is not None}, started: "
                f"{started}"
            )
        if options is not None:
            refuse_writer_ranks(options)
            staging = options.writer_options.get("staging")
        self.engine = engine
        self.url = os.fspath(out_dir)  # the dataset: a directory, or an object-storage prefix (staged locally)
        self.out_dir = local_dir(self.url, staging)
        self.writers = writers_of(engine.server_args)
        self.manifest_path = _manifests(self.out_dir, self.writers)[0] if self.writers == 1 else self.out_dir
        self.counts = dict.fromkeys(("submitted", "already_done"), 0)
        self.answers: list[dict[str, Any]] = []
        self.manifest: dict[str, Any] | None = None
        if options is not None:
            if self.writers > 1:
                raise InvalidArgumentError(
                    f"{self.writers} data-parallel ranks: SGLang's collective_rpc does not reach DP schedulers; start "
                    f"the capture at launch by environment ({ENV_CAPTURE_DIR}, {ENV_CAPTURE_OPTIONS}) and pass "
                    "started=True"
                )
            engine.collective_rpc("eagle_io_capture_start", out_dir=self.url, options=options.to_json())
        self.done = committed_ids(self.url if layout.is_url(self.url) else self.out_dir, self.writers)
        first = _manifests(self.out_dir, self.writers)[0]
        self.aux_layer_ids = list(read_manifest(first)["metadata"]["aux_layer_ids"]) if os.path.exists(first) else []

    def submit(self, samples: Sequence[Any]) -> None:
        """Each sample has ``index`` (sample id), ``input_ids [L]``, ``loss_mask [L]`` and optionally ``id`` (the
        key), e.g. :class:`eagle_io.data.TokenizedSample`. Already committed samples are skipped and counted.

        Raises:
            InvalidArgumentError: the session is closed (the schedulers would count the samples, not write them).
        """
        if self.manifest is not None:
            raise InvalidArgumentError(f"the SGLang capture into {self.out_dir} is closed; start a new session")
        self.counts["submitted"] += len(samples)
        todo = [s for s in samples if int(s.index) not in self.done]
        self.counts["already_done"] += len(samples) - len(todo)
        if not todo:
            return
        self.engine.generate(
            input_ids=[[int(t) for t in s.input_ids.tolist()] for s in todo],
            sampling_params=[{"max_new_tokens": 1, "temperature": 0, "custom_params": sample_params(s)} for s in todo],
        )
        self.done.update(int(s.index) for s in todo)

    def stats(self) -> dict[str, Any]:
        """``counts``; after :meth:`close`, plus the writers' and rings' counters over the writers: summed, except
        sizes and times per rank (``ring_capacity``, ``ring_high_water_bytes``, ``elapsed_seconds``: the largest);
        the schedulers' counters (:data:`eagle_io.capturing.store.COUNTS`: ``written``, ``dropped``,
        ``nonfinite_skipped`` and the other value skips, ``already_done``, ``after_stop``) as ``scheduler_*``."""
        out: dict[str, Any] = dict(self.counts)
        per_rank = ("ring_capacity", "ring_high_water_bytes", "elapsed_seconds")
        for a in self.answers:
            for k, v in {**a.get("stats", {}), **{f"scheduler_{k}": v for k, v in a["counts"].items()}}.items():
                out[k] = max(out.get(k, 0), v) if k in per_rank else out.get(k, 0) + v
        return out

    def close(self, timeout_s: float = defaults.STOP_TIMEOUT_S, complete: bool = True) -> dict[str, Any]:
        """Stops the capture in every writing scheduler (waiting up to ``timeout_s`` for them to commit); returns
        ``manifest.json`` (``{}`` when several writers each wrote their ``manifest.rNNNNN.json``), marked complete
        unless ``complete`` is False (an interrupted capture)."""
        if self.manifest is None:
            self.answers = stop_capture(self.out_dir, self.writers, timeout_s, complete=complete)
            self.manifest = read_manifest(self.manifest_path) if self.writers == 1 else {}
        return self.manifest

    def __enter__(self) -> SGLangCaptureSession:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            self.close()
            return
        # Commit what the schedulers hold, marked incomplete, without hiding the error (a dead engine never answers).
        try:
            self.close(timeout_s=120.0, complete=False)
        except Exception as e:
            logger.error("eagle-io: could not stop the SGLang capture after %s: %s", exc_type.__name__, e)


def refuse_writer_ranks(options: CaptureOptions) -> None:
    """Refuses shard-writer ranks set by hand on SGLang: each scheduler's comes from its data-parallel layout
    (:mod:`eagle_io.sglang.ranks`).

    Raises:
        InvalidArgumentError: ``writer_options`` holds ``rank`` or ``world_size``.
    """
    why = "SGLang's data-parallel layout numbers the writers (eagle_io.sglang.ranks); leave it out"
    options.refuse("eagle-io's SGLang capture", rank=why, world_size=why)


def is_sglang_engine(obj: Any) -> bool:
    """Whether ``obj`` is an ``sglang.Engine`` (checked by module, without importing SGLang)."""
    return any(c.__module__.startswith("sglang.") and c.__name__ == "Engine" for c in type(obj).__mro__)
