"""Reference EAGLE-3 draft training on eagle-io shards, and export for SGLang.

* :class:`Eagle3Draft` / :class:`Eagle3DraftConfig`: the draft (SpecForge/SGLang ``LlamaForCausalLMEagle3``
  layout and parameter names).
* :func:`train_draft`: CPU reference training against the target's frozen ``lm_head``, on batches from
  :mod:`eagle_io.feed` (``PaddingCollator`` + ``shift_targets``), optionally unrolled SpecForge's test-time-training
  way (``TrainConfig.ttt_length``); reports held-out loss, top-1 agreement and offline accept length before and
  after.
* :mod:`.acceptance`: accept-length counts in SGLang's convention (:class:`AcceptHistogram`) and the offline accept
  length from stored shards (:func:`offline_accept`).
* :mod:`.caches`: the draft's incremental KV cache (speculative decoding, :mod:`eagle_io.spec`) and TTT attention.
* :func:`save_draft`: ``model.safetensors`` + ``config.json`` that SGLang's EAGLE-3 loader reads.
"""

from .acceptance import AcceptHistogram, OfflineAccept, offline_accept
from .batches import make_batch
from .export import draft_config_json, load_draft, save_draft
from .model import Eagle3Draft, Eagle3DraftConfig
from .train import (
    TargetHead,
    TrainConfig,
    TrainResult,
    build_draft,
    evaluate,
    load_target_head,
    split_positions,
    train_draft,
    write_summary,
)

__all__ = [
    "AcceptHistogram",
    "Eagle3Draft",
    "Eagle3DraftConfig",
    "OfflineAccept",
    "TargetHead",
    "TrainConfig",
    "TrainResult",
    "build_draft",
    "draft_config_json",
    "evaluate",
    "load_draft",
    "load_target_head",
    "make_batch",
    "offline_accept",
    "save_draft",
    "split_positions",
    "train_draft",
    "write_summary",
]
