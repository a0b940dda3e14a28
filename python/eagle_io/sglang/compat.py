"""SGLang's version rules: the supported and tested versions, the speculative algorithm aliases, the context
length SGLang derives from a config.

Supported SGLang: :data:`SUPPORTED_SGLANG` (``>=0.5.14,<0.6``) for the serving guard. Tested against
:data:`TESTED_SGLANG` (0.5.23: the tests in ``tests/test_serving_plugin.py`` run against it); the 0.5.14, 0.5.18
and 0.5.21 wheels were read for every hook target and signature used here (``Scheduler.init_all_cuda_graphs``,
``EagleDraftWorker._draft_extend_for_prefill(self, batch, target_hidden_states, ...)`` /
``_draft_extend_for_decode(self, batch, batch_result)``, ``EAGLEWorkerV2.on_verify_complete_cpu``,
``EAGLEWorkerV2._draft_worker``, ``EagleDraftWorker.draft_runner``, ``plugins/hook_registry.py``): identical; 0.5.14
keeps the spec-aux flags on ``ModelRunner`` itself (``eagle_use_aux_hidden_state``), read as a fallback. The SGLang
capture (:data:`CAPTURE_MIN_SGLANG`) needs 0.5.23: its capture-only mode and ``last_hidden_states`` are new there.
Outside the range the plugin logs a warning and still runs its lookups, each of which fails loudly
(:class:`SGLangCompatError`) instead of silently skipping a check.

Nothing here imports SGLang: the version rules, the algorithm aliases and the context-length rule work without
it, so ``eagle-io check-serving`` needs no SGLang install. The rest of the SGLang room: hook targets
(:mod:`.hooks`), launch arguments (:mod:`.launch_args`), layer-id setters (:mod:`.setters`), the draft SGLang builds
(:mod:`.draft_build`), checkpoint headers (:mod:`.checkpoint`), live-object probes (:mod:`.probe`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import SGLangCompatError

__all__ = [
    "CAPTURE_MIN_SGLANG",
    "CONTEXT_LENGTH_KEYS",
    "SUPPORTED_SGLANG",
    "TESTED_SGLANG",
    "SGLangCompatError",
    "capture_supported",
    "context_length",
    "resolve_algorithm",
    "sglang_version",
    "version_supported",
]

SUPPORTED_SGLANG = ">=0.5.14,<0.6"
TESTED_SGLANG = "0.5.23"
CAPTURE_MIN_SGLANG = "0.5.23"
_MIN, _MAX_EXCL = (0, 5, 14), (0, 6, 0)


def sglang_version() -> str | None:
    """The installed SGLang's version: from package metadata, without importing it; else, for an SGLang without
    metadata (run from a source tree) that this process has imported, ``sglang.__version__`` (``sglang/version.py``:
    setuptools-scm's version of the tree, or ``0.0.0.dev0``); else None."""
    import sys
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang")
    except PackageNotFoundError:
        v = getattr(sys.modules.get("sglang"), "__version__", None)
        return str(v) if v else None


def _version_tuple(v: str) -> tuple[int, ...]:
    parts: list[int] = []
    for p in v.split(".")[:3]:
        digits = "".join(c for c in p if c.isdigit()) if p[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts + [0] * (3 - len(parts)))


def version_supported(v: str | None) -> bool:
    """Whether ``v`` (e.g. ``"0.5.23"``, ``"0.5.23.post1"``) lies in :data:`SUPPORTED_SGLANG`."""
    return bool(v) and _MIN <= _version_tuple(str(v)) < _MAX_EXCL


def capture_supported(v: str | None) -> bool:
    """Whether ``v`` has the capture-only mode the SGLang capture needs (>= :data:`CAPTURE_MIN_SGLANG`)."""
    return bool(v) and _version_tuple(CAPTURE_MIN_SGLANG) <= _version_tuple(str(v)) < _MAX_EXCL


# --------------------------------------------------------------------------------------------------------------
# Speculative algorithm names
# --------------------------------------------------------------------------------------------------------------

_ALIASES = {"NEXTN": "EAGLE"}
"""``sglang/srt/speculative/spec_info.py``: ``SpeculativeAlgorithm.from_string`` maps the reserved alias
``NEXTN`` to ``EAGLE``; ``srt/arg_groups/speculative_hook.py`` (``handle_speculative_decoding`` /
``_resolve_speculative_algorithm_alias``) declares the resolved name. Nothing there inspects the draft."""


def resolve_algorithm(name: str | None) -> str | None:
    """The algorithm SGLang actually runs for ``--speculative-algorithm name``: upper-cased, ``NEXTN -> EAGLE``.

    (SGLang 0.5.23 also turns NEXTN/EAGLE into ``FROZEN_KV_MTP`` for Gemma-4 assistant drafts; irrelevant to
    EAGLE-3 drafts and not modelled here.)
    """
    if name is None:
        return None
    up = str(name).strip().upper()
    return _ALIASES.get(up, up)


# --------------------------------------------------------------------------------------------------------------
# Context length
# --------------------------------------------------------------------------------------------------------------


CONTEXT_LENGTH_KEYS = (
    "max_sequence_length",
    "seq_length",
    "max_seq_len",
    "model_max_length",
    "max_position_embeddings",
)
"""``srt/utils/hf_transformers/common.py``: ``CONTEXT_LENGTH_KEYS``, the first present wins."""


def context_length(config: Mapping[str, Any]) -> int:
    """The context length SGLang derives from a (text) config: ``get_context_length`` in
    ``srt/utils/hf_transformers/common.py``: the first of :data:`CONTEXT_LENGTH_KEYS` times the ``rope_scaling``
    ``factor`` (1 when the scaling has ``original_max_position_embeddings`` or ``rope_type: llama3``); 2048 when no
    key is present. A draft is given the target's context length (``EAGLEWorkerV2``: ``TpModelWorker(...,
    context_length=target ... context_len)``) and ``ModelConfig._derive_context_length`` refuses one above this
    value unless ``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1``, which then overrides the draft's
    ``max_position_embeddings``."""
    rs = config.get("rope_scaling")
    factor: Any = 1
    if isinstance(rs, Mapping) and rs:
        factor = rs.get("factor", 1)
        if "original_max_position_embeddings" in rs or rs.get("rope_type") == "llama3":
            factor = 1
    for key in CONTEXT_LENGTH_KEYS:
        v = config.get(key)
        if v is not None:
            return int(float(factor) * int(v))
    return 2048
