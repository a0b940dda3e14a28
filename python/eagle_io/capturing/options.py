"""The options of one capture, defined and checked once: :class:`CaptureOptions` is built by
:func:`eagle_io.capture` (or ``eagle-io generate``) and carried unchanged to the capture core
(:meth:`eagle_io.capturing.store.SampleStore.create`) on both backends: in process for Hugging Face, as JSON to
every SGLang scheduler (the start command over HTTP or ``EAGLE_IO_CAPTURE_OPTIONS``, :meth:`CaptureOptions.to_dict`).
What a backend cannot honour is refused there (:meth:`CaptureOptions.refuse`), never ignored.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import defaults
from ..errors import InvalidArgumentError, check_keywords
from ..store import layout
from ..store.schema import STATE_DTYPES, precision_name
from .ring import check_ring_options

__all__ = ["VALUE_POLICIES", "WRITER_OPTIONS", "CaptureOptions"]

WRITER_OPTIONS = ("shard_bytes", "chunk_bytes", "threads", "zstd_level", "queue_depth", "rank", "world_size", "resume",
                  "staging", "staging_bytes")  # fmt: skip
"""The ``writer_options`` a capture takes: :class:`eagle_io.ShardWriter`'s keyword options, and ``staging`` /
``staging_bytes`` for an object-storage ``out_dir``."""

VALUE_POLICIES = ("raise", "skip")
"""What the capture core does with a sample whose states fail a value check (:data:`eagle_io.store.values.KINDS`):
raise (:class:`~eagle_io.errors.NonFiniteStatesError` for ``nonfinite``,
:class:`~eagle_io.errors.ImplausibleStatesError` for the others), or skip it and count it (``{kind}_skipped``)."""


@dataclass(frozen=True)
class CaptureOptions:
    """Every option of a capture. Checked when built, before a target forward or a file exists.

    Attributes:
        target_info: facts about the target (``load_target``'s info: ``num_layers``, ``hidden_size``,
            ``vocab_size``, ``model_id``...), recorded in the metadata.
        tokenizer_identity: :func:`eagle_io.data.chat_template_identity`, recorded in the metadata.
        aux_layer_ids: eagle-io ids (input of decoder layer i); None = SGLang's default ``[2, N//2, N-3]``.
        state_dtype: the stored dtype's name, one of :data:`eagle_io.store.schema.STATE_DTYPES` (a ``torch.dtype`` is
            accepted); ``"float16"`` warns.
        precision: None/``"bf16"`` (lossless) or ``"fp8"`` (FP8 e4m3fn, one scale per token; docs/FORMAT.md 3.1).
        max_length: longest sample in tokens (None: no limit).
        metadata: extra metadata keys.
        nonfinite, implausible: the value policies, :data:`VALUE_POLICIES`.
        ring_bytes, ring_batch, timeout_s, drop_when_full: the capture ring
            (:class:`~eagle_io.capturing.ring.RingSink`); ``quantize_on_device`` where FP8 states are quantised.
        writer_options: :class:`eagle_io.ShardWriter` options (``shard_bytes``, ``threads``, ``resume``,
            ``rank``, ``world_size``...), and ``staging`` / ``staging_bytes`` for an object-storage ``out_dir``.
        dedup_prefixes: store a system prompt several samples share once (:mod:`eagle_io.capturing.prefixes`,
            docs/FORMAT.md 4.7): True refuses a capture that cannot (an object-storage ``out_dir``, an SGLang
            backend), False stores every sample whole, None (default) does it where the capture can
            (:data:`eagle_io.defaults.DEDUP_PREFIXES`) and stores samples whole elsewhere.

    Raises:
        InvalidArgumentError: a value policy other than ``raise``/``skip``, a ring option the core cannot take, an
            unknown precision, a ``state_dtype`` states cannot be stored in, aux layer ids that are not integers.
    """

    target_info: Mapping[str, Any] = field(default_factory=dict)
    tokenizer_identity: Mapping[str, Any] | None = None
    aux_layer_ids: tuple[int, ...] | None = None
    state_dtype: str = "bfloat16"
    precision: str | None = None
    max_length: int | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    nonfinite: str = "raise"
    implausible: str = "raise"
    ring_bytes: int = defaults.RING_BYTES
    ring_batch: int = defaults.RING_BATCH
    timeout_s: float = defaults.RING_TIMEOUT_S
    drop_when_full: bool = defaults.DROP_WHEN_FULL
    quantize_on_device: bool | None = None
    writer_options: Mapping[str, Any] = field(default_factory=dict)
    dedup_prefixes: bool | None = None

    def __post_init__(self) -> None:
        name = str(self.state_dtype).removeprefix("torch.")
        if name not in STATE_DTYPES:
            raise InvalidArgumentError(
                f"state_dtype: EAGLE-3 states are stored as one of {', '.join(STATE_DTYPES)}, not {name!r}"
            )
        object.__setattr__(self, "state_dtype", name)
        for policy in ("nonfinite", "implausible"):
            if getattr(self, policy) not in VALUE_POLICIES:
                raise InvalidArgumentError(f"{policy} must be 'raise' or 'skip', not {getattr(self, policy)!r}")
        check_ring_options(
            ring_bytes=self.ring_bytes,
            batch=self.ring_batch,
            timeout_s=self.timeout_s,
            quantize_on_device=self.quantize_on_device,
        )
        precision_name(self.precision)
        if self.dedup_prefixes is not None and type(self.dedup_prefixes) is not bool:
            raise InvalidArgumentError(f"dedup_prefixes must be None, True or False, not {self.dedup_prefixes!r}")
        m = self.max_length
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise InvalidArgumentError(f"max_length must be an integer >= 1 (or None: no limit), not {m!r}")
        if self.aux_layer_ids is not None:
            ids = self.aux_layer_ids
            if not isinstance(ids, Sequence) or any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
                raise InvalidArgumentError(f"aux_layer_ids must be a list of integers, not {ids!r}")
            object.__setattr__(self, "aux_layer_ids", tuple(int(i) for i in ids))
        for key in ("target_info", "metadata", "writer_options"):
            object.__setattr__(self, key, dict(getattr(self, key) or {}))
        check_keywords(self.writer_options, WRITER_OPTIONS, "capture writer options")
        if self.tokenizer_identity is not None:
            object.__setattr__(self, "tokenizer_identity", dict(self.tokenizer_identity))

    def to_dict(self) -> dict[str, Any]:
        """The options as a JSON-serialisable dict (what SGLang's schedulers receive)."""
        out = dataclasses.asdict(self)
        if self.aux_layer_ids is not None:
            out["aux_layer_ids"] = list(self.aux_layer_ids)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CaptureOptions:
        """The options of a :meth:`to_dict` dict.

        Raises:
            InvalidArgumentError: a key that is no capture option (an ArgumentTypeError naming it, the closest option
                and every option: :func:`eagle_io.errors.check_keywords`), or a value the checks refuse.
        """
        check_keywords(data, (f.name for f in dataclasses.fields(cls)), "capture options")
        return cls(**dict(data))

    def replace(self, **changes: Any) -> CaptureOptions:
        """A copy with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)

    def stores_prefixes_once(self, out_dir: str | os.PathLike[str]) -> bool:
        """Whether a capture into ``out_dir`` stores prefixes several samples share once (docs/FORMAT.md 4.7):
        ``dedup_prefixes``, default :data:`eagle_io.defaults.DEDUP_PREFIXES`, and never into object storage
        (an ``s3://`` ``out_dir``: prefix records are not uploaded yet, so its samples are stored whole).

        Raises:
            InvalidArgumentError: ``dedup_prefixes=True`` with an object-storage ``out_dir``.
        """
        remote = layout.is_url(out_dir)
        if self.dedup_prefixes and remote:
            raise InvalidArgumentError(
                f"dedup_prefixes=True with out_dir {out_dir}: prefix records are not uploaded to object storage yet; "
                "capture to a local directory, or store the samples whole (dedup_prefixes=False)"
            )
        return not remote and (defaults.DEDUP_PREFIXES if self.dedup_prefixes is None else self.dedup_prefixes)

    def refuse(self, backend: str, **unsupported: str) -> None:
        """Refuses the options ``backend`` cannot honour: each keyword names a writer option and why.

        Raises:
            InvalidArgumentError: naming the first such option that is set.
        """
        for key, why in unsupported.items():
            if key in self.writer_options:
                raise InvalidArgumentError(f"{key}={self.writer_options[key]!r} cannot be honoured by {backend}: {why}")

    def refuse_writer_ranks(self) -> None:
        """Refuses shard-writer ranks set by hand for an SGLang capture: each scheduler's comes from its
        data-parallel layout (:mod:`eagle_io.sglang.ranks`).

        Raises:
            InvalidArgumentError: ``writer_options`` holds ``rank`` or ``world_size``.
        """
        why = "SGLang's data-parallel layout numbers the writers (eagle_io.sglang.ranks); leave it out"
        self.refuse("eagle-io's SGLang capture", rank=why, world_size=why)
