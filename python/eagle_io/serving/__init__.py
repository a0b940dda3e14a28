"""Guards for serving EAGLE-3 drafts.

* :mod:`.preflight`: ``check_serving`` / ``eagle-io check-serving``: reads the target's and the draft's
  ``config.json`` and the draft's safetensors header (no weights; the vocab maps' values) and reports serving
  mistakes, each with its fix (:mod:`.findings`). Its parts: :mod:`.check_draft` (class, config switches, tensors,
  vocab map, positions), :mod:`.check_layers` (captured ids, count and ``fc`` width), :mod:`.check_training` (what
  the draft was trained on).
* :mod:`.plugin`: the SGLang plugin (entry-point group ``sglang.srt.plugins``): a startup guard in the scheduler
  process and runtime checks. Imported only by SGLang's plugin loader.

What SGLang does (version rules, hook targets, launch arguments, layer-id setters, the draft it builds, checkpoint
headers, live-object probes) is the room below, :mod:`eagle_io.sglang`; nothing here imports ``eagle_io.capturing``.
Nothing here imports SGLang at import time.
"""

from __future__ import annotations

from ..sglang.checkpoint import CheckpointInfo, DraftInfo, read_checkpoint, read_draft, read_safetensors_header
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
