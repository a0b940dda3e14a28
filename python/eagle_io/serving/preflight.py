"""Preflight check of an EAGLE-3 serving launch: configs and safetensors headers only, no weights, no SGLang.

The failure this exists for: an EAGLE-3 draft launched with ``--speculative-algorithm EAGLE`` (or ``NEXTN``,
an alias of ``EAGLE``) starts cleanly in SGLang, the target never captures aux states, the draft receives the
``H``-wide final states instead of ``k*H`` (7168 instead of 21504 for Kimi-K2.5), skips its ``fc``
(``srt/models/llama_eagle3.py``: ``if hidden_states.shape[-1] != embeds.shape[-1]``) and acceptance is exactly
1.00 with no error.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..capturing.layers import (
    AUX_LAYER_CONVENTION,
    capturable_range,
    explicit_ids_for,
    served_aux_layer_ids,
    setter_rule,
)
from ..errors import EagleIOError
from ..store import layout
from ..store.manifest import read_manifest
from .checkpoint import CheckpointError, DraftInfo, read_checkpoint, read_draft
from .sglang_compat import draft_num_aux_layers, launch_args, resolve_algorithm

__all__ = ["ERROR", "INFO", "WARNING", "Finding", "check_serving", "eagle3_signals", "format_findings"]

ERROR, WARNING, INFO = "error", "warning", "info"

MAX_POSITION_RATIO = 4
"""A draft whose ``max_position_embeddings`` is below ``target / MAX_POSITION_RATIO`` (and below the context
length actually served) is reported: past its trained positions acceptance collapses on long prompts."""


@dataclass(frozen=True)
class Finding:
    """One problem found. ``code`` is stable (tests and scripts match on it); ``fix`` says exactly what to do."""

    severity: str  # "error" | "warning" | "info"
    code: str
    message: str
    fix: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def format_findings(findings: Sequence[Finding]) -> str:
    """Human-readable report, one block per finding."""
    if not findings:
        return "OK: no problems found"
    lines = []
    for f in findings:
        lines.append(f"{f.severity.upper()} [{f.code}] {f.message}")
        lines.append(f"    fix: {f.fix}")
    n_err = sum(f.severity == ERROR for f in findings)
    n_warn = sum(f.severity == WARNING for f in findings)
    lines.append(f"{n_err} error(s), {n_warn} warning(s)")
    return "\n".join(lines)


def eagle3_signals(draft: DraftInfo, target_hidden: int | None) -> list[str]:
    """Evidence that ``draft`` is an EAGLE-3 draft, one string each; empty if none.

    Not the architecture name alone (some EAGLE-3 drafts declare plain ``LlamaForCausalLM``): the ``fc`` input
    width (``[H_draft, k * H_target]`` with ``k >= 3``, never EAGLE-1/2's ``[H, 2H]``), ``eagle_config`` layer
    ids, ``draft_vocab_size``, ``target_hidden_size``, a ``d2t`` tensor, EAGLE-3's ``midlayer`` layout.
    """
    sig: list[str] = []
    w = draft.fc_in_width
    if w is not None:
        if target_hidden and w % target_hidden == 0 and w // target_hidden >= 3:
            sig.append(f"fc.weight input width {w} = {w // target_hidden} x target hidden {target_hidden}")
        elif (
            draft.hidden_size
            and w != 2 * draft.hidden_size
            and w % draft.hidden_size == 0
            and w // draft.hidden_size >= 3
        ):
            sig.append(f"fc.weight input width {w} = {w // draft.hidden_size} x draft hidden {draft.hidden_size}")
    if draft.eagle_layer_ids is not None:
        sig.append(f"eagle_config.eagle_aux_hidden_state_layer_ids = {draft.eagle_layer_ids}")
    if draft.top_level_layer_ids is not None:
        sig.append(f"eagle_aux_hidden_state_layer_ids = {draft.top_level_layer_ids} (top level)")
    if draft.draft_vocab_size is not None:
        sig.append(f"draft_vocab_size = {draft.draft_vocab_size}")
    if draft.target_hidden_size is not None:
        sig.append(f"target_hidden_size = {draft.target_hidden_size}")
    if draft.d2t is not None:
        sig.append(f"d2t tensor {list(draft.d2t.shape)}")
    if draft.has_midlayer:
        sig.append("midlayer.* tensors (EAGLE-3 layout)")
    if any("eagle3" in a.lower() for a in draft.architectures):
        sig.append(f"architecture {draft.architecture}")
    return sig


def _read_manifest_metadata(path: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]]:
    p = Path(path)
    if p.is_dir():
        found = layout.dataset_manifests(p)
        if not found:
            raise CheckpointError(f"{p}: no manifest.json (or manifest.rNNNNN.json): not an eagle-io dataset", p)
        p = found[0]
    try:
        manifest = read_manifest(p)
    except EagleIOError as e:
        raise CheckpointError(f"{p}: cannot read the dataset manifest: {e}", p) from e
    meta = manifest.get("metadata")
    if not isinstance(meta, dict):
        raise CheckpointError(f"{p}: manifest has no metadata object", p)
    return p, meta


def _ids_text(ids: Sequence[int]) -> str:
    return "[" + ", ".join(str(i) for i in ids) + "]"


def check_serving(
    target_path: str | os.PathLike[str] | None,
    draft_path: str | os.PathLike[str] | None,
    *,
    algorithm: str | None = None,
    layer_ids: Sequence[int] | None = None,
    dataset_manifest: str | os.PathLike[str] | None = None,
    server_args: Any = None,
) -> list[Finding]:
    """Checks an EAGLE-3 serving launch before it is made; returns the findings (empty = nothing wrong).

    Args:
        target_path / draft_path: model directories (``config.json``; the draft's ``*.safetensors`` headers).
            None = take them from ``server_args`` (``--model-path`` / ``--speculative-draft-model-path``).
        algorithm: ``--speculative-algorithm`` (``EAGLE``, ``EAGLE3``, ``NEXTN`` = ``EAGLE``, ...); None = from
            ``server_args``.
        layer_ids: the aux layer ids the draft was trained on, in eagle-io's convention
            (:data:`eagle_io.capturing.layers.AUX_LAYER_CONVENTION`: input of 0-based decoder layer i).
        dataset_manifest: an eagle-io dataset directory or manifest the draft was trained on; its
            ``aux_layer_ids`` / ``aux_layer_convention`` / ``hidden_size`` are checked against the launch.
        server_args: raw SGLang launch arguments (list of strings), a ``ServerArgs`` or a mapping of its fields;
            fills what the explicit arguments leave out (a conflict is an error finding).

    Raises:
        CheckpointError: a directory, ``config.json``, safetensors header or manifest that cannot be read.
    """
    findings: list[Finding] = []

    def add(sev: str, code: str, message: str, fix: str) -> None:
        findings.append(Finding(sev, code, message, fix))

    la = launch_args(server_args)
    for name, given, from_args, flag in (
        ("target", target_path, la.model_path, "--model-path"),
        ("draft", draft_path, la.draft_path, "--speculative-draft-model-path"),
        ("algorithm", algorithm, la.algorithm, "--speculative-algorithm"),
    ):
        if given is not None and from_args is not None and str(given) != str(from_args):
            same_dir = name != "algorithm" and Path(str(given)).resolve() == Path(str(from_args)).resolve()
            same_algo = name == "algorithm" and str(given).upper() == str(from_args).upper()
            if not (same_dir or same_algo):
                add(
                    ERROR,
                    "launch-args-conflict",
                    f"{name} is {given!r} here but the SGLang launch arguments say {flag} {from_args!r}",
                    f"check the launch you mean to run: pass {flag} {given} to SGLang, or check that one",
                )
    target_path = target_path if target_path is not None else la.model_path
    draft_path = draft_path if draft_path is not None else la.draft_path
    if algorithm is None:
        algorithm = la.algorithm
    if target_path is None or draft_path is None:
        raise CheckpointError(
            "need the target and the draft checkpoint (arguments or --model-path / --speculative-draft-model-path)",
            str(target_path or draft_path or ""),
        )
    target = read_checkpoint(target_path)
    draft = read_draft(draft_path)
    resolved = resolve_algorithm(algorithm)
    h_t = target.hidden_size
    n_t = target.num_layers
    arch_t = target.architecture

    signals = eagle3_signals(draft, h_t)
    is_eagle3 = bool(signals)
    n_aux, n_aux_src = draft_num_aux_layers(draft.config)
    width = draft.fc_in_width

    # 1. The algorithm.
    if is_eagle3 and resolved != "EAGLE3":
        how = "no --speculative-algorithm" if algorithm is None else f"--speculative-algorithm {algorithm}"
        alias = (
            f" (SGLang resolves {algorithm} to {resolved})" if algorithm and resolved != str(algorithm).upper() else ""
        )
        exp = ""
        if width and h_t:
            exp = (
                f": SGLang will not capture aux states, the draft gets the target's {h_t}-wide final states instead "
                f"of {width} wide, skips its fc and acceptance stays at 1.00 with no error"
            )
        add(
            ERROR,
            "eagle3-draft-wrong-algorithm",
            f"the draft is an EAGLE-3 draft ({'; '.join(signals)}) but is served with {how}{alias}{exp}",
            "launch with --speculative-algorithm EAGLE3",
        )
    elif not is_eagle3 and resolved == "EAGLE3":
        if width is not None and draft.hidden_size and width == 2 * draft.hidden_size:
            add(
                ERROR,
                "eagle-draft-under-eagle3",
                f"--speculative-algorithm EAGLE3 with a draft that shows no EAGLE-3 signal and an EAGLE-1/2 fc "
                f"[{draft.hidden_size}, {width}] (input = embedding + one hidden state)",
                "launch with --speculative-algorithm EAGLE, or use an EAGLE-3 draft",
            )
        else:
            add(
                WARNING,
                "no-eagle3-signal",
                "--speculative-algorithm EAGLE3 but the draft shows no EAGLE-3 signal (no fc.weight of k x target "
                "hidden width, eagle_config, draft_vocab_size, target_hidden_size or d2t)",
                "check that the draft is an EAGLE-3 draft; add eagle_config / target_hidden_size to its config.json",
            )

    # 2. Widths: fc input = number of aux layers x target hidden.
    if is_eagle3:
        if draft.target_hidden_size is not None and h_t is not None and draft.target_hidden_size != h_t:
            add(
                ERROR,
                "target-hidden-size",
                f"draft config target_hidden_size = {draft.target_hidden_size} but the target's hidden size is {h_t}",
                "serve the draft with the target it was trained for (or retrain it on this target)",
            )
        if width is None:
            where = (
                f"its weights are in {', '.join(draft.other_weight_files)} (not read: only safetensors headers are)"
                if draft.other_weight_files
                else "no fc.weight in its safetensors files"
            )
            add(
                WARNING,
                "fc-unknown",
                f"cannot check the draft's fc input width: {where}",
                "convert the draft to safetensors (model.safetensors) so its fc width can be checked",
            )
        elif h_t is not None and width != n_aux * h_t:
            if width % h_t == 0:
                k = width // h_t
                fix = (
                    f"the draft was trained on {k} aux layers: set eagle_config.eagle_aux_hidden_state_layer_ids in "
                    f"the draft's config.json to the {k} ids it was trained with (or num_aux_hidden_states = {k})"
                )
            else:
                fix = (
                    f"{width} is not a multiple of the target hidden size {h_t}: the draft was trained for another "
                    "target; serve it with that target"
                )
            add(
                ERROR,
                "fc-width",
                f"draft fc input width {width} != {n_aux} aux layers ({n_aux_src}) x target hidden {h_t} "
                f"= {n_aux * h_t}",
                fix,
            )

    # 3. Layer ids: what SGLang will capture vs what the draft was trained on.
    if is_eagle3 and n_t is not None:
        if draft.eagle_layer_ids is None and draft.top_level_layer_ids is not None:
            top_served = served_aux_layer_ids(arch_t, n_t, draft.top_level_layer_ids)
            default = served_aux_layer_ids(arch_t, n_t, None)
            add(
                WARNING if top_served == default else ERROR,
                "layer-ids-top-level-ignored",
                f"the draft config has a top-level eagle_aux_hidden_state_layer_ids = "
                f"{_ids_text(draft.top_level_layer_ids)}, which SGLang ignores (it reads only eagle_config); it will "
                f"capture its default {_ids_text(default)} (eagle-io ids) instead of {_ids_text(top_served)}",
                'move the key into the draft config: "eagle_config": {"eagle_aux_hidden_state_layer_ids": '
                f"{_ids_text(draft.top_level_layer_ids)}}}",
            )
        served = served_aux_layer_ids(arch_t, n_t, draft.eagle_layer_ids)
        lo, hi = capturable_range(arch_t, n_t)
        bad = [i for i in served if not lo <= i <= hi]
        if bad:
            got = len(served) - len(bad)
            add(
                ERROR,
                "layer-ids-out-of-range",
                f"SGLang will ask {arch_t} ({n_t} layers) to capture eagle-io ids {_ids_text(served)} (from "
                f"eagle_config ids {_ids_text(draft.eagle_layer_ids or [])}); {_ids_text(bad)} lie outside "
                f"{lo}..{hi}, so only {got} of {len(served)} states are captured",
                f"set eagle_config.eagle_aux_hidden_state_layer_ids to ids whose captured layers lie in {lo}..{hi} "
                f"({setter_rule(arch_t)})",
            )
        if served != sorted(served):
            add(
                WARNING,
                "layer-ids-order",
                f"eagle_config ids {_ids_text(draft.eagle_layer_ids or [])} are not ascending: SGLang concatenates aux "
                "states in layer-execution order, not in the order given",
                "list eagle_config.eagle_aux_hidden_state_layer_ids in ascending order, matching the training data",
            )
        trained: list[tuple[str, list[int]]] = []
        if layer_ids is not None:
            trained.append(("the given training layer ids", [int(i) for i in layer_ids]))
        if dataset_manifest is not None:
            mpath, meta = _read_manifest_metadata(dataset_manifest)
            conv = meta.get("aux_layer_convention")
            ids = meta.get("aux_layer_ids")
            if conv != AUX_LAYER_CONVENTION:
                add(
                    WARNING,
                    "dataset-convention-unknown",
                    f"{mpath}: aux_layer_convention {conv!r} is not eagle-io's ({AUX_LAYER_CONVENTION!r}); its ids "
                    "are not compared",
                    "compare the layer ids by hand, or regenerate the data with eagle-io",
                )
            elif isinstance(ids, list):
                trained.append((f"the training data {mpath}", [int(i) for i in ids]))
            mh = meta.get("hidden_size")
            if isinstance(mh, int) and h_t is not None and mh != h_t:
                add(
                    ERROR,
                    "dataset-hidden-size",
                    f"the training data {mpath} has hidden_size {mh} but the target's is {h_t}",
                    "serve the draft with the target its training data came from",
                )
            mn = meta.get("num_layers")
            if isinstance(mn, int) and mn != n_t:
                add(
                    WARNING,
                    "dataset-num-layers",
                    f"the training data {mpath} came from a {mn}-layer target, this target has {n_t} layers",
                    "serve the draft with the target its training data came from",
                )
        for what, ids in trained:
            if sorted(ids) == sorted(served):
                continue
            src = (
                f"eagle_config ids {_ids_text(draft.eagle_layer_ids)} through SGLang's {arch_t} setter"
                if draft.eagle_layer_ids is not None
                else f"SGLang's default [2, N//2, N-3] (the draft config records no eagle_config ids; N = {n_t})"
            )
            want = explicit_ids_for(arch_t, n_t, ids)
            fix = (
                f'set "eagle_config": {{"eagle_aux_hidden_state_layer_ids": {_ids_text(want)}}} in the draft\'s '
                f"config.json (SGLang's {arch_t} setter turns them into eagle-io ids {_ids_text(ids)})"
                if want is not None
                else f"SGLang's {arch_t} setter cannot capture eagle-io ids {_ids_text(ids)}: retrain on capturable ids"
            )
            if len(ids) == len(served) and len({s - t for s, t in zip(sorted(served), sorted(ids), strict=True)}) == 1:
                d = sorted(served)[0] - sorted(ids)[0]
                if abs(d) == 1:
                    add(
                        ERROR,
                        "layer-ids-off-by-one",
                        f"off by {d:+d} between conventions: SGLang will capture eagle-io ids {_ids_text(served)} "
                        f"({src}) but the draft was trained on eagle-io ids {_ids_text(ids)} ({what}). eagle-io "
                        "id i = input of 0-based layer i (= output of layer i-1), the meaning of SGLang's "
                        "layers_to_capture; SGLang's explicit eagle_config ids mean 'output of layer i' where the "
                        f"setter shifts them ({setter_rule(arch_t)})",
                        fix,
                    )
                    continue
            add(
                ERROR,
                "layer-ids-mismatch",
                f"SGLang will capture eagle-io ids {_ids_text(served)} ({src}) but the draft was trained on "
                f"eagle-io ids {_ids_text(ids)} ({what})",
                fix,
            )

    # 4. Vocab map.
    if is_eagle3:
        dvs = draft.draft_vocab_size if draft.draft_vocab_size is not None else draft.vocab_size
        dvs_src = "draft_vocab_size" if draft.draft_vocab_size is not None else "vocab_size (no draft_vocab_size)"
        if draft.d2t is not None and dvs is not None and draft.d2t.shape[:1] != (dvs,):
            add(
                ERROR,
                "d2t-size",
                f"d2t has shape {list(draft.d2t.shape)} but the draft config's {dvs_src} is {dvs}",
                f'set "draft_vocab_size": {draft.d2t.shape[0]} in the draft config.json if d2t is right, else '
                "regenerate d2t/t2d for this draft's vocab size",
            )
        if draft.lm_head is not None and dvs is not None and draft.lm_head.shape[:1] != (dvs,):
            add(
                ERROR,
                "lm-head-size",
                f"lm_head.weight has {draft.lm_head.shape[0]} rows but the draft config's {dvs_src} is {dvs}",
                f'set "draft_vocab_size": {draft.lm_head.shape[0]} in the draft config.json',
            )
        if draft.d2t is None and dvs is not None and target.vocab_size is not None and dvs < target.vocab_size:
            add(
                ERROR,
                "d2t-missing",
                f"draft vocab {dvs} < target vocab {target.vocab_size} but the checkpoint has no d2t tensor: "
                "draft token indices would be read as target token ids",
                "add the d2t tensor (draft index -> target id offsets) the draft was trained with to its safetensors",
            )
        if draft.t2d is not None and target.vocab_size is not None and draft.t2d.shape[:1] != (target.vocab_size,):
            add(
                WARNING,
                "t2d-size",
                f"t2d has shape {list(draft.t2d.shape)} but the target vocab is {target.vocab_size}",
                "regenerate the vocab map for this target's tokenizer",
            )
    if draft.vocab_size is not None and target.vocab_size is not None and draft.vocab_size != target.vocab_size:
        add(
            ERROR if is_eagle3 else WARNING,
            "vocab-size",
            f"draft vocab_size {draft.vocab_size} != target vocab_size {target.vocab_size}: the draft embeds target "
            "token ids",
            "use a draft trained with this target's tokenizer",
        )

    # 5. Positions.
    dm, tm = draft.max_position_embeddings, target.max_position_embeddings
    if dm is not None and tm is not None and dm * MAX_POSITION_RATIO <= tm:
        served_ctx = la.context_length or tm
        if served_ctx > dm:
            add(
                WARNING,
                "draft-max-positions",
                f"draft max_position_embeddings {dm} is far below the target's {tm} (served context "
                f"{served_ctx}): past position {dm} the draft runs outside its trained positions and acceptance drops",
                f"launch with --context-length {dm}, or use a draft trained (or rope-scaled) for longer contexts",
            )

    if not draft.weight_files and not draft.other_weight_files:
        add(WARNING, "no-draft-weights", f"{draft.path}: no weight files found", "point at the draft's directory")
    return findings
