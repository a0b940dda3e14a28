"""Load an SGLang-format EAGLE-3 draft for a loaded target as SGLang would, refusing what SGLang would refuse (or
silently serve wrong), with ``check-serving``'s own findings.

What SGLang does with the draft (``srt/models/llama_eagle3.py``, ``srt/speculative/eagle_worker_v2.py``):
``LlamaForCausalLMEagle3`` from ``config.json``; weights ``fc``, ``midlayer.*``, ``norm``, ``lm_head``, ``d2t`` (read
as ``hot_token_id = d2t + arange``; ``t2d`` skipped); ``EagleDraftWorker.init_lm_head`` -> ``set_embed`` replaces the
draft's embedding with the target's; the target captures the layers its setter makes of
``eagle_config.eagle_aux_hidden_state_layer_ids`` (:func:`eagle_io.sglang.setters.served_aux_layer_ids`).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..draft.export import load_draft
from ..draft.model import Eagle3Draft
from ..draft.train import TargetHead, config_json
from ..errors import DraftMismatchError
from ..serving.findings import ERROR, Finding
from ..serving.preflight import check_serving
from ..sglang.setters import captured_ids, served_aux_layer_ids
from .target import Target

__all__ = ["ServedDraft", "check_dataset_fits", "load_served_draft"]

_UNSUPPORTED_SWITCHES = ("norm_before_fc", "fc_norm", "use_aux_norm", "norm_output")


@dataclass
class ServedDraft:
    """A draft loaded for a target: the model (float32, eval mode, the target's embedding), the
    :class:`eagle_io.spec.target.Target` capturing the layers SGLang would capture for it (None when only the
    target's head was loaded: offline figures only), the draft's ``config.json``, the non-error findings of
    ``check-serving`` (warnings worth printing), the aux layer ids the target serves it and the target's
    ``lm_head`` weight (``[vocab, H]``, the offline teacher)."""

    draft: Eagle3Draft
    target: Target | None
    config: dict[str, Any]
    warnings: list[Finding] = field(default_factory=list)
    aux_layer_ids: list[int] = field(default_factory=list)
    lm_head: torch.Tensor | None = None

    @property
    def record(self) -> dict[str, Any]:
        """The draft's ``eagle_io`` record (``{}`` for a draft another tool exported)."""
        rec = self.config.get("eagle_io")
        return rec if isinstance(rec, dict) else {}


def _refuse(what: str, errors: list[Finding]) -> DraftMismatchError:
    lines = "\n  - ".join(f"[{f.code}] {f.message} (fix: {f.fix})" for f in errors)
    return DraftMismatchError(f"{what}:\n  - {lines}")


def load_served_draft(
    draft_dir: str | os.PathLike[str],
    model: torch.nn.Module | TargetHead,
    info: Mapping[str, Any],
    *,
    dataset: str | os.PathLike[str] | None = None,
    allow_other_target: bool = False,
) -> ServedDraft:
    """Loads ``draft_dir`` for the target ``model``: :func:`eagle_io.capturing.models.load_target`'s model and info
    (live and offline figures), or :func:`eagle_io.draft.load_target_head`'s head and its ``identity`` (offline only:
    ``target`` is then None).

        Checks, before any weight is read: ``check-serving``'s findings for an ``EAGLE3`` launch of this draft on this
        target (the target's ``config.json`` is its loaded config), with ``dataset`` as the training data when given;
        the draft's ``eagle_io`` record of its target (``model_id``, ``architecture``, ``num_layers``, ``hidden_size``)
        against ``info`` (``allow_other_target`` lets a differing ``model_id`` through, e.g. a renamed file); config
        switches this reference draft does not model (``norm_before_fc``, ``fc_norm``, ``use_aux_norm``,
        ``norm_output``, a ``rope_scaling`` / ``rope_parameters`` ``rope_type`` other than ``default``).

        Raises:
            DraftMismatchError: any of those, every problem named with its fix.
            CheckpointError: an unreadable draft directory.
    """
    draft_dir = Path(draft_dir)
    if isinstance(model, TargetHead):
        target_config, embed, lm_head, live = model.target_config, model.embed, model.lm_head, None
    else:
        target_config, live = config_json(model.config, str(info.get("architecture") or type(model).__name__)), model
        embed, lm_head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    with tempfile.TemporaryDirectory(prefix="eagle-io-target-") as tmp:
        Path(tmp, "config.json").write_text(json.dumps(target_config))
        findings = check_serving(tmp, draft_dir, algorithm="EAGLE3", dataset_manifest=dataset)
    errors = [f for f in findings if f.severity == ERROR]
    with open(draft_dir / "config.json", encoding="utf-8") as f:
        cfg = json.load(f)
    rec = cfg.get("eagle_io") if isinstance(cfg.get("eagle_io"), dict) else {}
    rec_target = rec.get("target") if isinstance(rec.get("target"), dict) else {}
    for key in ("architecture", "num_layers", "hidden_size", "model_id"):
        want, got = rec_target.get(key), info.get(key)
        if want is None or got is None or want == got or (key == "model_id" and allow_other_target):
            continue
        errors.append(
            Finding(
                ERROR,
                "draft-for-another-target",
                f"the draft was trained for target {key} {want!r} (its config.json eagle_io.target) but the target "
                f"loaded has {key} {got!r}",
                "evaluate the draft with the target it was trained for"
                + (" (or pass --allow-other-target if only the file name differs)" if key == "model_id" else ""),
            )
        )
    switched = [k for k in _UNSUPPORTED_SWITCHES if cfg.get(k) or (cfg.get("eagle_config") or {}).get(k)]
    if switched:
        errors.append(
            Finding(
                ERROR,
                "draft-switch-unsupported",
                f"the draft config sets {', '.join(switched)}: SGLang builds extra norms for it that eagle-io's "
                "reference draft does not model",
                "evaluate this draft in SGLang itself",
            )
        )
    scaling = cfg.get("rope_scaling") if isinstance(cfg.get("rope_scaling"), dict) else {}
    params = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    rope_type = scaling.get("rope_type", scaling.get("type")) if scaling else params.get("rope_type")
    if rope_type not in (None, "default"):  # was measured with plain RoPE, silently
        errors.append(
            Finding(
                ERROR,
                "draft-rope-scaling-unsupported",
                f"the draft config scales RoPE (rope_type {rope_type!r}): SGLang's draft applies it to every position "
                "but eagle-io's reference draft has plain RoPE only, so its figures would be another draft's",
                "evaluate this draft in SGLang itself",
            )
        )
    if errors:
        raise _refuse(f"cannot evaluate the draft {draft_dir} on target {info.get('model_id')}", errors)
    draft = load_draft(draft_dir).eval()
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(embed.float())  # set_embed
    arch = str(info.get("architecture") or type(model).__name__)
    n = int(live.config.num_hidden_layers) if live is not None else int(info["num_layers"])
    explicit = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    ids = captured_ids(arch, n, served_aux_layer_ids(arch, n, explicit))
    return ServedDraft(
        draft=draft,
        target=None if live is None else Target(live, ids),
        config=cfg,
        warnings=list(findings),
        aux_layer_ids=ids,
        lm_head=lm_head.detach(),
    )


def check_dataset_fits(served: ServedDraft, metadata: Mapping[str, Any], where: str) -> None:
    """Refuses a dataset whose metadata does not match the served draft and target (what ``check-serving``'s
    dataset findings leave out): ``vocab_size`` against the draft's, ``target_model.model_id`` against the draft's
    record, ``aux_layer_ids`` against the layers served.

    Raises:
        DraftMismatchError: naming each key, both values and ``where`` (the dataset's path).
    """
    problems = []
    cfg = served.config
    if metadata.get("vocab_size") not in (None, cfg.get("vocab_size")):
        problems.append(f"vocab_size {metadata['vocab_size']} (draft config: {cfg.get('vocab_size')})")
    tm = metadata.get("target_model") if isinstance(metadata.get("target_model"), dict) else {}
    rec_model = (served.record.get("target") or {}).get("model_id")
    if tm.get("model_id") and rec_model and tm["model_id"] != rec_model:
        problems.append(f"target_model.model_id {tm['model_id']!r} (the draft was trained for {rec_model!r})")
    ids = metadata.get("aux_layer_ids")
    if isinstance(ids, list) and [int(i) for i in ids] != served.aux_layer_ids:
        problems.append(f"aux_layer_ids {ids} (the target serves this draft layers {served.aux_layer_ids})")
    if problems:
        raise DraftMismatchError(f"{where}: the dataset metadata does not match the draft: " + "; ".join(problems))
