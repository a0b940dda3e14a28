"""``eagle_io.capture``: attach to a target, stream every forward's per-sample aux and final hidden
states through the capture ring into shards, and leave a committed manifest on exit. Every backend's session is a
:class:`Capture`: the Hugging Face one here (:class:`CaptureSession`), SGLang servers over HTTP
(:class:`~eagle_io.capturing.sglang.client.ServerCapture`)."""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from .. import defaults
from ..errors import ArgumentTypeError, InternalError, InvalidArgumentError, SchemaError, check_keywords
from .hf import HFCapture
from .options import WRITER_OPTIONS, CaptureOptions
from .prefixes import SharedPrefixes
from .store import ForwardSample, SampleStore


@runtime_checkable
class Capture(Protocol):
    """A capture in progress, whatever its backend: what :func:`capture` returns. Use as a context manager: leaving
    it closes the capture, complete unless an exception left it.

    Attributes:
        done: ids of samples already in the dataset (on resume) or submitted since, which :meth:`submit` skips.
        aux_layer_ids: the captured layers (eagle-io ids: input of decoder layer i).
        counts: the session's own counters (``submitted``, ``already_done``, and the backend's).
        manifest: None until :meth:`close`, then the committed manifest (``{}`` when several writers' manifests
            are left to merge where the dataset is).
        manifest_path: the manifest file (or the dataset directory of several writers' manifests).
        merge_warnings: after a close that merged several writers' manifests, what the merge reported; else None.
        upload_report: after the close of a capture into object storage, what was uploaded
            (:func:`eagle_io.store.upload.combine_upload_reports`); else None.
        forward_seconds, store_seconds: seconds in the target's forward and copying into the ring, where this
            process runs the forward; None for a server capture.
    """

    done: set[int]
    aux_layer_ids: list[int]
    manifest: dict[str, Any] | None
    manifest_path: str
    merge_warnings: list[str] | None

    @property
    def counts(self) -> dict[str, int]: ...

    @property
    def upload_report(self) -> dict[str, Any] | None: ...

    @property
    def forward_seconds(self) -> float | None: ...

    @property
    def store_seconds(self) -> float | None: ...

    def submit(self, samples: Sequence[Any]) -> None:
        """Captures ``samples`` (each ``index``, ``input_ids [L]``, ``loss_mask [L]``, optional ``id``)."""

    def stats(self) -> dict[str, Any]:
        """:attr:`counts`, and after :meth:`close` the writers' and rings' counters."""

    def close(self, complete: bool = True) -> dict[str, Any]:
        """Commits what was captured; returns :attr:`manifest`, marked complete unless ``complete`` is False."""

    def __enter__(self) -> Capture: ...

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None: ...


class CaptureSession:
    """A capture through a Hugging Face model's forward in this process (a :class:`Capture`); build it with
    :func:`capture`.

    Attributes:
        counts: ``submitted`` plus the capture core's counters (:data:`eagle_io.capturing.store.COUNTS`).
        forward_seconds / store_seconds: time in the target's forward vs. copying into the ring.
        prefixes: the shared prefixes seen (:class:`~eagle_io.capturing.prefixes.SharedPrefixes`), or None when every
            sample is stored whole (``dedup_prefixes`` off, or an object-storage ``out_dir``).
    """

    merge_warnings: list[str] | None = None  # one writer: nothing to merge

    def __init__(self, target: Any, out_dir: str | os.PathLike[str], options: CaptureOptions) -> None:
        if not isinstance(target, torch.nn.Module):
            raise InvalidArgumentError(
                f"cannot capture from a {type(target).__name__}: expected a Hugging Face model (torch.nn.Module)"
            )
        state_dtype = getattr(torch, options.state_dtype)
        dedup = options.stores_prefixes_once(out_dir)
        self._hooks = HFCapture(target, options.aux_layer_ids, state_dtype=state_dtype)
        self.aux_layer_ids = list(self._hooks.aux_layer_ids)
        self._store = SampleStore.create(out_dir, options, aux_layer_ids=self.aux_layer_ids)
        # Whether system prompts shared by several samples are stored once (a remote out_dir stores samples whole).
        self.prefixes = SharedPrefixes(self._store.known_prefixes) if dedup else None
        self.manifest_path = self._store.manifest_path
        self.done = self._store.done
        self._device = next(target.parameters()).device
        self._dtype = next(target.parameters()).dtype
        self.submitted = 0
        self.forward_seconds = self.store_seconds = 0.0
        self.manifest: dict[str, Any] | None = None
        self._hooks.__enter__()

    @property
    def counts(self) -> dict[str, int]:
        return {"submitted": self.submitted, **self._store.counts}

    @property
    def upload_report(self) -> dict[str, Any] | None:
        return self._store.upload_report

    def submit(self, samples: Sequence[Any]) -> None:
        """Runs one batched forward over ``samples`` and stores each sample's states unpadded.

        Each sample has ``index`` (int, the sample id), ``id`` (str or None, stored as the key),
        ``input_ids [L]`` int64 and ``loss_mask [L]`` (0/1), e.g. :class:`eagle_io.data.TokenizedSample`, and may have
        ``system_tokens`` (int: its first tokens that are its system prompt): where the session stores shared
        prefixes once (:attr:`prefixes`), at most that many of them are (:mod:`eagle_io.capturing.prefixes`).
        Samples already in the dataset are skipped and counted (``already_done``).

        Raises:
            SchemaError: a sample with 0 tokens, more than ``max_length``, a loss mask of another length or with
                values other than 0/1, token ids that are not integers or lie outside the target's vocabulary, or an
                id twice in ``samples`` (checked before the forward).
            ArgumentTypeError: a sample ``id`` that is neither a str nor None (checked before the forward).
            NonFiniteStatesError: NaN/Inf states (or a storage-cast overflow) under ``nonfinite="raise"`` (names
                sample, tensor, layer and row).
            ImplausibleStatesError: all-zero or copied states under ``implausible="raise"``.
            RingTimeoutError: the writers could not keep up for the ring's timeout.
            InvalidArgumentError: the session is closed.
        """
        if self.manifest is not None:
            raise InvalidArgumentError(f"the capture into {self.manifest_path} is closed; start a new session")
        self.submitted += len(samples)
        seen: set[int] = set()
        for s in samples:
            self._store.check(s.index, s.input_ids, s.loss_mask)
            if s.index in seen:  # the second used to be dropped as "already_done" after the forward
                raise SchemaError.for_sample(
                    s.index, "it appears twice in this batch; nothing of the batch was written"
                )
            seen.add(s.index)
            if s.id is not None and not isinstance(s.id, str):
                raise ArgumentTypeError(f"sample {s.index}: its id (stored as the key) must be a str or None, not "
                                        f"{type(s.id).__name__}; nothing of the batch was written")  # fmt: skip
        todo = [s for s in samples if not self._store.is_done(s.index)]
        if not todo:
            return
        width = max(len(s.input_ids) for s in todo)
        ids = torch.zeros(len(todo), width, dtype=torch.int64)
        mask = torch.zeros(len(todo), width, dtype=torch.int64)
        for b, s in enumerate(todo):
            ids[b, : len(s.input_ids)] = torch.as_tensor(s.input_ids)
            mask[b, : len(s.input_ids)] = 1
        t0 = time.perf_counter()
        out = self._hooks.forward(ids.to(self._device), mask.to(self._device))
        t1 = time.perf_counter()
        self.forward_seconds += t1 - t0
        for b, s in enumerate(todo):
            if out.lengths[b] != len(s.input_ids):
                raise InternalError(f"sample {s.index}: captured {out.lengths[b]} tokens for {len(s.input_ids)} inputs")
        t = out.aux_hidden_states.shape[1]
        shared = [self._shared(s) for s in todo]
        rows = [ForwardSample(s.index, s.input_ids, s.loss_mask, b * t + out.starts[b], out.lengths[b], s.id or "",
                              shared[b]) for b, s in enumerate(todo)]  # fmt: skip
        aux, hidden = out.aux_hidden_states.flatten(0, 1), out.hidden_states.flatten(0, 1)
        # the value checks: one host sync per forward; the hooks cast to state_dtype, the forward ran in the model's
        self._store.put_forward(aux, hidden, rows, forward_dtype=self._dtype)
        self.store_seconds += time.perf_counter() - t1

    def _shared(self, sample: Any) -> int:
        """The tokens of ``sample`` stored once as a shared prefix (0: none, or no dedup)."""
        if self.prefixes is None:
            return 0
        return self.prefixes.shared(sample.input_ids, int(getattr(sample, "system_tokens", 0)))

    def stats(self) -> dict[str, Any]:
        """Counts, forward/store seconds and the writer's and ring's counters."""
        return {**self.counts, "forward_seconds": self.forward_seconds, "store_seconds": self.store_seconds,
                **self._store.stats()}  # fmt: skip

    def close(self, complete: bool = True) -> dict[str, Any]:
        """Removes the hooks, drains the ring and commits the last shard; returns the manifest, marked complete
        unless ``complete`` is False (a capture that stopped before its end: interrupted, or failed)."""
        if self.manifest is None:
            self._hooks.__exit__(None, None, None)
            self.manifest = self._store.close(complete=complete)
        return self.manifest

    def __enter__(self) -> CaptureSession:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        # Leaving on an exception (Ctrl-C, SIGTERM, an error) commits what was captured but does not mark it
        # complete: the capture did not reach its end, and a reader following it must not take it as done.
        self.close(complete=exc is None)


def capture(
    target: Any,
    out_dir: str | os.PathLike[str],
    *,
    target_info: Mapping[str, Any] | None = None,
    tokenizer_identity: Mapping[str, Any] | None = None,
    aux_layer_ids: Sequence[int] | None = None,
    state_dtype: torch.dtype | str = torch.bfloat16,
    precision: str | None = None,
    max_length: int | None = None,
    metadata: Mapping[str, Any] | None = None,
    nonfinite: str = "raise",
    implausible: str = "raise",
    ring_bytes: int = defaults.RING_BYTES,
    timeout_s: float = defaults.RING_TIMEOUT_S,
    drop_when_full: bool = defaults.DROP_WHEN_FULL,
    sampling_params: Mapping[str, Any] | None = None,
    concurrency: int = defaults.SERVER_CONCURRENCY,
    retries: int = defaults.SERVER_RETRIES,
    progress: bool = False,
    api_key: str | None = None,
    admin_api_key: str | None = None,
    dedup_prefixes: bool | None = None,
    **writer_options: Any,
) -> Capture:
    """Starts capturing EAGLE-3 training data from ``target`` into ``out_dir``: a directory, or an object-storage
    prefix ``s3://bucket/run`` (docs/STORAGE.md: written to a local staging directory, each shard uploaded when it
    commits and its staged copy removed, the manifest last with a conditional PUT; ``staging=`` and
    ``staging_bytes=`` among ``writer_options`` set the directory and the bound on committed shards awaiting upload,
    default :data:`eagle_io.defaults.STAGING_BYTES`).

    ``target`` is a Hugging Face Llama-like model (the reference path, :mod:`eagle_io.capturing.hf`), or a running
    SGLang server's URL ``"http://host:port"`` or a list of them (:class:`~eagle_io.capturing.sglang.client
    .ServerCapture`: launched with ``--enable-return-aux-hidden-states --speculative-algorithm EAGLE3`` and SGLang's
    other defaults, eagle-io installed beside it; docs/SERVING.md section 3). HTTP is the one way to an SGLang
    target: an in-process ``sglang.Engine`` is refused (launch a server,
    :func:`eagle_io.capturing.sglang.launch.launch_capture_server`, and capture from its URL). Each
    :meth:`CaptureSession.submit` runs one batched forward and stores, per sample, ``input_ids [L]`` int64,
    ``loss_mask [L]`` uint8, ``aux_hidden_states [L, k*H]`` and ``hidden_states [L, H]`` (post-norm) in
    ``state_dtype``; padding is never stored. On exit (also on an exception) the ring is drained and the
    manifest committed, so everything submitted before stays valid; leaving on an exception (Ctrl-C included)
    leaves the manifest marked incomplete (``resume=True`` continues it).

    The arguments become one :class:`~eagle_io.capturing.options.CaptureOptions` (where each is described and
    checked), carried unchanged to the capture core on either backend.

    Args:
        target_info: facts about the target (``load_target``'s info: ``num_layers``, ``hidden_size``, ...); required
            for a model; a server's come from the server when not given.
        tokenizer_identity: :func:`eagle_io.data.chat_template_identity`, recorded in the manifest.
        aux_layer_ids: eagle-io ids (input of decoder layer i); None = SGLang's default ``[2, N//2, N-3]``.
        state_dtype: stored dtype (float32 forwards are rounded to nearest-even); float16 (stored, or the target's
            forward) warns: its range ends at 65504, bfloat16 is recommended.
        precision: ``None``/``"bf16"`` (lossless) or ``"fp8"``: states stored as FP8 e4m3fn with one fp32 scale per
            token (lossy, ~2.4x smaller than bf16 lossless' 1.47x: benches/README.md), read back as ``state_dtype``
            (bfloat16 or float32).
        nonfinite: ``"raise"`` (default) or ``"skip"`` (counted) for samples with NaN/Inf states, or values the
            storage dtype cannot hold.
        implausible: ``"raise"`` (default) or ``"skip"`` (counted) for samples whose states are finite but cannot be
            real: all zeros, a layer all zeros in a row, rows equal to another sample's of the same forward
            (:mod:`eagle_io.store.values`).
        ring_bytes, timeout_s, drop_when_full: the capture ring (:class:`eagle_io.capturing.ring.RingSink`).
        sampling_params, concurrency, retries, progress: a server capture's (:class:`~eagle_io.capturing.sglang
            .server.ServerCapture`): ``sampling_params`` with ``max_new_tokens`` above 1 store the server's answer
            after each prompt; refused for the other targets.
        api_key, admin_api_key: a server capture's SGLang keys (``--api-key`` on every request, ``--admin-api-key``
            on the control route; default ``EAGLE_IO_API_KEY`` / ``EAGLE_IO_ADMIN_API_KEY``).
        dedup_prefixes: store a system prompt several samples share once (docs/FORMAT.md 4.7,
            :class:`~eagle_io.capturing.options.CaptureOptions`): None (default) where the capture can (a model into a
            local directory), True refuses a capture that cannot, False stores samples whole.
        writer_options: :class:`eagle_io.ShardWriter` options (``shard_bytes``, ``threads``, ``rank``,
            ``world_size``, ``resume``, ...), and ``staging`` / ``staging_bytes`` for an object-storage ``out_dir``.
            A server capture sets ``rank`` / ``world_size`` from the servers' data-parallel layout and refuses them.

    Raises:
        InvalidArgumentError: an option :class:`~eagle_io.capturing.options.CaptureOptions` refuses, or one the
            backend cannot honour; an ``sglang.Engine`` target.
        ObjectStorageError: a request to the object store failed (names the URL and the HTTP status), at start
            (resume), while capturing or at exit.
    """
    own = [p for p in inspect.signature(capture).parameters if p not in ("target", "out_dir", "writer_options")]
    check_keywords(
        writer_options, (*own, *WRITER_OPTIONS), "eagle_io.capture()"
    )  # misspelt: refused here, not remotely
    urls = [target] if isinstance(target, str) else target if isinstance(target, (list, tuple)) else None
    if urls is not None and not all(isinstance(u, str) for u in urls):
        raise InvalidArgumentError(
            f"cannot capture from {target!r}: a server is named by its URL (http://host:port), a model is a "
            "torch.nn.Module"
        )
    if urls is not None:
        from ..sglang.servers import server_url

        urls = [server_url(u) for u in urls]  # the scheme checked (a bare host:port is http://) before anything
    if urls is None and sampling_params is not None:
        raise InvalidArgumentError("sampling_params are a server capture's (a URL target): a model's forward generates "
                                   "nothing")  # fmt: skip
    if urls is None and (api_key or admin_api_key):
        raise InvalidArgumentError("api_key / admin_api_key are a server capture's (a URL target)")
    if urls is None and _is_sglang_engine(target):
        raise InvalidArgumentError(
            "cannot capture from an in-process sglang.Engine: eagle-io drives SGLang over HTTP only; launch a server "
            "(eagle_io.capturing.sglang.launch.launch_capture_server, or python -m sglang.launch_server with "
            "--enable-return-aux-hidden-states --speculative-algorithm EAGLE3) and pass its URL to eagle_io.capture"
        )
    if urls is None and target_info is None:
        raise InvalidArgumentError("target_info is required for a model (load_target's info)")
    options = CaptureOptions(
        target_info=target_info or {},
        tokenizer_identity=tokenizer_identity,
        aux_layer_ids=aux_layer_ids,
        state_dtype=state_dtype,
        precision=precision,
        max_length=max_length,
        metadata=metadata or {},
        nonfinite=nonfinite,
        implausible=implausible,
        ring_bytes=ring_bytes,
        timeout_s=timeout_s,
        drop_when_full=drop_when_full,
        writer_options=writer_options,
        dedup_prefixes=dedup_prefixes,
    )
    if urls is not None:
        from .sglang.client import ServerCapture

        return ServerCapture(urls, out_dir, options, sampling_params=sampling_params, concurrency=concurrency,
                             retries=retries, progress=progress, api_key=api_key,
                             admin_api_key=admin_api_key)  # fmt: skip
    return CaptureSession(target, out_dir, options)


def _is_sglang_engine(obj: Any) -> bool:
    """Whether ``obj`` is an ``sglang.Engine`` (checked by module, without importing SGLang)."""
    return any(c.__module__.startswith("sglang.") and c.__name__ == "Engine" for c in type(obj).__mro__)
