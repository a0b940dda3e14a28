"""Speculative decoding with an EAGLE-3 draft, as SGLang runs it: the outcome eagle-io's data is for.

* :class:`SpeculativeDecoder` (:mod:`.decoder`): chain drafts (top-k 1, ``num_steps`` per verify), greedy
  verification, KV caches on both sides; lossless (its tokens are the target's greedy decoding, :func:`greedy_decode`).
  ``as_algorithm="EAGLE"`` feeds the draft what SGLang feeds an EAGLE-3 draft launched with the wrong flag.
* :func:`load_served_draft` (:mod:`.loading`): an SGLang-format draft loaded for a target the way SGLang loads it,
  refused with ``check-serving``'s findings where SGLang would serve it wrong; :func:`.init_from.load_init_draft`
  reuses those checks for ``train-draft --init-from``.
* Counts: :class:`eagle_io.draft.acceptance.AcceptHistogram` (SGLang's convention: bonus token counted, pooled);
  the offline accept length from stored shards is :func:`eagle_io.draft.acceptance.offline_accept`.
"""

from .decoder import ALGORITHMS, SpecOutput, SpeculativeDecoder, greedy_decode
from .loading import ServedDraft, check_dataset_fits, load_served_draft
from .target import Target, TargetStep

__all__ = [
    "ALGORITHMS",
    "ServedDraft",
    "SpecOutput",
    "SpeculativeDecoder",
    "Target",
    "TargetStep",
    "check_dataset_fits",
    "greedy_decode",
    "load_served_draft",
]
