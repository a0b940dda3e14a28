"""Guards for serving EAGLE-3 drafts (and the SGLang side of capture).

* :mod:`.preflight`: ``check_serving`` / ``eagle-io check-serving``: reads the target's and the draft's
  ``config.json`` and the draft's safetensors header (no weights; the vocab maps' values) and reports serving
  mistakes, each with its fix (:mod:`.findings`). Its parts: :mod:`.draft_build` (the draft SGLang builds from the
  config, and the one shape checker), :mod:`.check_draft` (class, config switches, tensors, vocab map, positions),
  :mod:`.check_layers` (captured ids, count and ``fc`` width), :mod:`.check_training` (what the draft was trained on).
* :mod:`.plugin`: the SGLang plugin (entry-point group ``sglang.srt.plugins``): a startup guard in the scheduler
  process and runtime checks. Imported only by SGLang's plugin loader.
* :mod:`.sglang_compat`: every SGLang-version-specific name eagle-io relies on, in one place;
  :mod:`.sglang_probe`: the live-object probes (incl. the capture-wiring probe of the startup guard).

Nothing here imports SGLang at import time.
"""

from __future__ import annotations

from .checkpoint import CheckpointInfo, DraftInfo, read_checkpoint, read_draft, read_safetensors_header
from .preflight import Finding, check_serving, format_findings

__all__ = [
    "CheckpointInfo",
    "DraftInfo",
    "Finding",
    "check_serving",
    "format_findings",
    "read_checkpoint",
    "read_draft",
    "read_safetensors_header",
]
