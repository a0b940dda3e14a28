"""Reference EAGLE-3 draft training on eagle-io shards, and export for SGLang.

* :class:`Eagle3Draft` / :class:`Eagle3DraftConfig`: the draft (SpecForge/SGLang ``LlamaForCausalLMEagle3``
  layout and parameter names).
* :func:`train_draft`: CPU reference training against the target's frozen ``lm_head``, on batches from
  :mod:`eagle_io.feed` (``PaddingCollator`` + ``shift_targets``); reports held-out loss and top-1 agreement before
  and after.
* :func:`save_draft`: ``model.safetensors`` + ``config.json`` that SGLang's EAGLE-3 loader reads.
"""

from .export import draft_config_json, load_draft, save_draft
from .model import Eagle3Draft, Eagle3DraftConfig
from .train import (
    TargetHead,
    TrainConfig,
    TrainResult,
    build_draft,
    evaluate,
    load_target_head,
    make_batch,
    split_positions,
    train_draft,
    write_summary,
)

__all__ = [
    "Eagle3Draft",
    "Eagle3DraftConfig",
    "TargetHead",
    "TrainConfig",
    "TrainResult",
    "build_draft",
    "draft_config_json",
    "evaluate",
    "load_draft",
    "load_target_head",
    "make_batch",
    "save_draft",
    "split_positions",
    "train_draft",
    "write_summary",
]
