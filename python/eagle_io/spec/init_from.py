"""``train-draft --init-from DRAFT``: continue training from a draft that ``train-draft`` exported.

What is kept: the draft's weights (as exported: bfloat16 values, trained on in float32), its vocabulary map
(``d2t`` / ``t2d`` value for value, so the successor can be swapped into a server serving DRAFT), and so its
architecture and every width (hidden size, MLP width, draft vocabulary size, aux layer count). What starts fresh:
AdamW's moments and the learning-rate schedule (warm-up included), the batch order and the held-out split (``--seed``).

What is refused, each difference named: the checks ``eval-draft`` runs on a draft and a dataset, reused as they are
(:func:`eagle_io.spec.load_served_draft`: ``check-serving``'s findings for this draft on this target and dataset,
the draft's record of its target against the target loaded; :func:`eagle_io.spec.check_dataset_fits`: the dataset's
vocabulary size, target and aux layer ids against the draft's); plus an ``--intermediate-size`` or
``--draft-vocab-size`` other than the draft's, and a dataset whose ``hidden_size`` is not the draft's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..draft.model import Eagle3Draft
from ..draft.train import TargetHead
from ..errors import DraftMismatchError, InvalidArgumentError
from ..interop.vocab import draft_vocab_mapping
from .loading import check_dataset_fits, load_served_draft

__all__ = ["load_init_draft"]


def load_init_draft(
    draft_dir: str | os.PathLike[str],
    head: TargetHead,
    metadata: Mapping[str, Any],
    *,
    dataset: str | os.PathLike[str],
    allow_other_target: bool = False,
    intermediate_size: int | None = None,
    draft_vocab_size: int | None = None,
) -> tuple[Eagle3Draft, Any]:
    """The exported draft at ``draft_dir`` loaded to continue training on ``dataset`` (whose ``metadata`` is
    given) for the target ``head``, with its vocabulary map.

    Args:
        head: :func:`eagle_io.draft.load_target_head`'s head (its ``identity`` and ``target_config`` are what the
            draft is checked against).
        allow_other_target: as ``eval-draft``'s: a differing target ``model_id`` (the same weights re-saved) passes.
        intermediate_size, draft_vocab_size: the caller's explicit widths, if any: each must be the draft's.

    Returns:
        ``(draft, mapping)``: the float32 draft with the target's embedding, and its
        :class:`eagle_io.interop.vocab.VocabMapping` (``kept_from`` naming ``draft_dir``).

    Raises:
        DraftMismatchError: every difference between the draft and the target or dataset, one line each.
        InvalidArgumentError: a head without a target identity or config (a head built in memory).
        CheckpointError: an unreadable draft directory, or weights holding NaN/Inf.
    """
    if head.identity is None or head.target_config is None:
        raise InvalidArgumentError(
            "--init-from needs the target's identity and config.json to check the draft against "
            "(load_target_head's head carries them; this one was built otherwise)"
        )
    try:
        served = load_served_draft(
            draft_dir, head, head.identity, dataset=dataset, allow_other_target=allow_other_target
        )
        check_dataset_fits(served, metadata, str(dataset))
    except DraftMismatchError as e:  # eval-draft's wording ("cannot evaluate ..."), said of training here
        raise DraftMismatchError(
            f"--init-from {draft_dir}: cannot continue training this draft on {dataset}: {e}"
        ) from None
    cfg = served.draft.config
    problems = []
    if intermediate_size is not None and intermediate_size != cfg.intermediate_size:
        problems.append(f"--intermediate-size {intermediate_size} (the draft's MLP width is {cfg.intermediate_size})")
    if draft_vocab_size is not None and draft_vocab_size != cfg.draft_vocab_size:
        problems.append(f"--draft-vocab-size {draft_vocab_size} (the draft's is {cfg.draft_vocab_size})")
    if metadata.get("hidden_size") != cfg.hidden_size:
        problems.append(f"the dataset's hidden_size {metadata.get('hidden_size')} (the draft's is {cfg.hidden_size})")
    if problems:
        raise DraftMismatchError(
            f"--init-from {draft_dir}: the draft keeps its widths and cannot continue as asked: " + "; ".join(problems)
        )
    mapping = draft_vocab_mapping(draft_dir, target_vocab_size=int(head.config["vocab_size"]))
    return served.draft, mapping
