"""The layer-id and width part of the serving preflight: what SGLang will capture and feed, against what the
draft's ``fc`` takes and what it was trained on.

Three numbers must agree (SGLang 0.5.23): the input width of ``fc.weight`` in the checkpoint; the ``fc`` SGLang
allocates from the draft config (:class:`eagle_io.sglang.draft_build.DraftBuild`); and the states the target
actually sends, ``len(captured_ids) x target hidden`` (:func:`eagle_io.sglang.setters.captured_ids` over the
``layers_to_capture`` that the target's setter makes of ``eagle_config`` ids, :data:`~eagle_io.sglang.setters.
SETTER_RULES`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import InvalidArgumentError
from ..sglang.checkpoint import CheckpointInfo, DraftInfo
from ..sglang.draft_build import DraftBuild, fc_skip_problem
from ..sglang.setters import (
    capturable_range,
    captured_ids,
    explicit_ids_for,
    served_aux_layer_ids,
    setter_rule,
    short_capture,
)
from .findings import ERROR, INFO, WARNING, Findings

__all__ = ["check_fc_width", "check_layer_ids", "ids_text"]


def ids_text(ids: Sequence[int]) -> str:
    return "[" + ", ".join(str(i) for i in ids) + "]"


def _fix_for(arch: str, n: int, ids: list[int]) -> str:
    try:
        want = explicit_ids_for(arch, n, ids)
    except InvalidArgumentError:
        want = None
    if want is None:
        lo, hi = capturable_range(arch, n)
        return (
            f"SGLang's {arch} setter cannot capture eagle-io ids {ids_text(ids)} (it captures ids in {lo}..{hi}): "
            "retrain on capturable ids, or serve with the target the draft was trained for"
        )
    return (
        f'set "eagle_config": {{"eagle_aux_hidden_state_layer_ids": {ids_text(want)}}} in the draft\'s '
        f"config.json (SGLang's {arch} setter turns them into eagle-io ids {ids_text(ids)})"
    )


def check_layer_ids(
    out: Findings,
    target: CheckpointInfo,
    draft: DraftInfo,
    build: DraftBuild,
    trained: Sequence[tuple[str, list[int]]],
) -> list[int]:
    """Adds the layer-id findings; returns :func:`~eagle_io.sglang.setters.captured_ids` (what SGLang will
    capture, eagle-io ids). Needs the target's layer count (``target.num_layers``)."""
    arch, n = target.architecture, int(target.num_layers or 0)
    if draft.eagle_layer_ids is None and draft.top_level_layer_ids is not None:
        top_served = served_aux_layer_ids(arch, n, draft.top_level_layer_ids)
        default = served_aux_layer_ids(arch, n, None)
        out.add(
            WARNING if top_served == default else ERROR,
            "layer-ids-top-level-ignored",
            f"the draft config has a top-level eagle_aux_hidden_state_layer_ids = "
            f"{ids_text(draft.top_level_layer_ids)}, which SGLang ignores (it reads only eagle_config); it will "
            f"capture its default {ids_text(default)} (eagle-io ids) instead of {ids_text(top_served)}",
            'move the key into the draft config: "eagle_config": {"eagle_aux_hidden_state_layer_ids": '
            f"{ids_text(draft.top_level_layer_ids)}}}",
        )
    served = served_aux_layer_ids(arch, n, draft.eagle_layer_ids)
    captured = captured_ids(arch, n, served)
    given = ids_text(draft.eagle_layer_ids or [])
    if draft.eagle_layer_ids is None:
        _default_ids(out, arch, n, served, captured, trained, draft.top_level_layer_ids is not None)
    lo, hi = capturable_range(arch, n)
    bad = [i for i in served if not lo <= i <= hi]
    if bad:
        out.add(
            ERROR,
            "layer-ids-out-of-range",
            f"SGLang will ask {arch} ({n} layers) to capture eagle-io ids {ids_text(served)} (from eagle_config ids "
            f"{given}); {ids_text(bad)} lie outside {lo}..{hi}: {short_capture(arch, len(captured), len(served))}",
            f"set eagle_config.eagle_aux_hidden_state_layer_ids to ids whose captured layers lie in {lo}..{hi} "
            f"({setter_rule(arch)})",
        )
    dups = sorted({i for i in served if served.count(i) > 1})
    if dups:
        out.add(
            ERROR,
            "layer-ids-duplicate",
            f"eagle_config ids {given} become layers_to_capture {ids_text(served)} on {arch}: SGLang's forward "
            f"captures layer {', '.join(map(str, dups))} once: {short_capture(arch, len(captured), len(served))}",
            "list each layer once in eagle_config.eagle_aux_hidden_state_layer_ids: the ids the draft was trained on",
        )
    if served != sorted(served) and not dups:
        out.add(
            WARNING,
            "layer-ids-order",
            f"eagle_config ids {given} are not ascending: SGLang concatenates aux states in layer-execution order, "
            "not in the order given",
            "list eagle_config.eagle_aux_hidden_state_layer_ids in ascending order, matching the training data",
        )
    if build.num_aux != len(captured) and not bad and not dups and build.family is not None:
        out.add(
            ERROR,
            "aux-count",
            f"SGLang sizes the draft's fc for {build.num_aux} aux states ({build.num_aux_source}) but the target "
            f"captures {len(captured)} ({ids_text(captured)}, from "
            + (f"eagle_config ids {given}" if draft.eagle_layer_ids is not None else "SGLang's default")
            + ")",
            f"make them agree: list the {build.num_aux} trained layers in eagle_config.eagle_aux_hidden_state_layer_ids"
            + (" and drop num_aux_hidden_states" if build.num_aux_source == "num_aux_hidden_states" else ""),
        )
    if n in captured and not build.norm_before_fc and not build.fc_norm and build.family is not None:
        out.add(
            WARNING,
            "final-state-unnormalised",
            f"SGLang captures id {n}, the final pre-norm boundary of {arch}, whose magnitude grows with depth, and the "
            "draft config normalises nothing before fc (no norm_before_fc, no fc_norm); drafts trained on it "
            "(gpt-oss EAGLE-3 drafts, vLLM's [.., N]) use norm_before_fc",
            "if the draft was trained with a norm before fc, set eagle_config.norm_before_fc: true (and ship "
            "input_norm.weight)",
        )
    for what, ids in trained:
        if sorted(ids) == captured or draft.eagle_layer_ids is None:  # (the default's finding names it)
            continue
        src = (
            f"eagle_config ids {given} through SGLang's {arch} setter"
            if draft.eagle_layer_ids is not None
            else f"SGLang's default [2, N//2, N-3] (the draft config records no eagle_config ids; N = {n})"
        )
        fix = _fix_for(arch, n, ids)
        if len(ids) == len(captured) and len({s - t for s, t in zip(captured, sorted(ids), strict=True)}) == 1:
            d = captured[0] - sorted(ids)[0]
            if abs(d) == 1:
                out.add(
                    ERROR,
                    "layer-ids-off-by-one",
                    f"off by {d:+d} between conventions: SGLang will capture eagle-io ids {ids_text(captured)} ({src}) "
                    f"but the draft was trained on eagle-io ids {ids_text(ids)} ({what}). eagle-io id i = input of "
                    "0-based layer i (= output of layer i-1), the meaning of SGLang's layers_to_capture; SGLang's "
                    "explicit eagle_config ids mean 'output of layer i' where the setter shifts them "
                    f"({setter_rule(arch)})",
                    fix,
                )
                continue
        out.add(
            ERROR,
            "layer-ids-mismatch",
            f"SGLang will capture eagle-io ids {ids_text(captured)} ({src}) but the draft was trained on eagle-io ids "
            f"{ids_text(ids)} ({what})",
            fix,
        )
    return captured


def _default_ids(
    out: Findings,
    arch: str,
    n: int,
    served: list[int],
    captured: list[int],
    trained: Sequence[tuple[str, list[int]]],
    top_level: bool,
) -> None:
    """``layer-ids-default``: the draft config names no ``eagle_config`` ids, so SGLang captures its default. A
    warning naming the default ids while nothing says what the draft was trained on (a retrained or re-exported
    draft silently gets them; none when ``top_level`` ids already have their finding); info when every known
    training source agrees; an error when one differs."""
    default = (
        f"the draft config names no eagle_config.eagle_aux_hidden_state_layer_ids: SGLang's {arch} setter captures "
        f"its default {ids_text(served)} (eagle-io ids: input of 0-based layer i; [2, N//2, N-3] for N = {n} layers)"
    )
    differ = [(what, ids) for what, ids in trained if sorted(ids) != captured]
    if differ:
        what, ids = differ[0]
        shift = {s - t for s, t in zip(captured, sorted(ids), strict=False)} if len(ids) == len(captured) else set()
        note = (
            f"; off by {next(iter(shift)):+d} between conventions (eagle-io id i = input of layer i; SGLang's explicit "
            f"eagle_config ids mean 'output of layer i' where the setter shifts them: {setter_rule(arch)})"
            if len(shift) == 1 and abs(next(iter(shift))) == 1
            else ""
        )
        out.add(ERROR, "layer-ids-default", f"{default}, but the draft was trained on eagle-io ids {ids_text(ids)} "
                f"({what}){note}", _fix_for(arch, n, ids))  # fmt: skip
    elif trained:
        out.add(INFO, "layer-ids-default", f"{default}, the ids the draft was trained on ({trained[0][0]})",
                "nothing to do; naming them in eagle_config keeps them if SGLang's default changes")  # fmt: skip
    elif not top_level:
        out.add(
            WARNING,
            "layer-ids-default",
            f"{default}; nothing here says which layers the draft was trained on",
            "set eagle_config.eagle_aux_hidden_state_layer_ids in the draft's config.json to the ids it was trained "
            "on (check with --dataset or --trained-layer-ids)",
        )


def check_fc_width(
    out: Findings, build: DraftBuild, width: int | None, h_t: int | None, n_captured: int | None
) -> None:
    """``fc-skipped``: the states the target sends are as wide as the draft's embedding, so SGLang skips ``fc``
    (:func:`eagle_io.sglang.draft_build.fc_skip_problem`). ``fc-width``: the checkpoint's ``fc.weight`` input
    against the ``fc`` SGLang allocates (loading fails), then against the states the target sends (``n_captured x
    h_t``; None = the layer count is unknown: SGLang's sizing is used)."""
    k_sent = n_captured if n_captured is not None else build.num_aux
    skip = fc_skip_problem(k_sent, h_t, build.hidden_size) if build.family is not None else None
    if skip:
        out.add(
            ERROR,
            "fc-skipped",
            f"{skip}: the draft reads the target's concatenated states as its own hidden state and acceptance "
            "collapses with no error",
            f"retrain the draft so that aux layers x target hidden {h_t} differs from its hidden size: on 2 or more "
            "aux layers (SGLang's default is 3), or with another hidden size",
        )
    if width is None or h_t is None:
        return
    fc_in = build.fc_in if build.family is not None else None
    hin = build.hidden_size_in
    if fc_in is not None and width != fc_in:
        if build.hidden_size_in_source == "target_hidden_size":
            hin_text = f"target hidden {hin}" if hin == h_t else f"target_hidden_size {hin}"
        else:
            hin_text = f"{build.hidden_size_in_source} {hin}"
        if width % h_t == 0 and build.hidden_size_in_source != "target_hidden_size" and hin != h_t:
            fix = (
                f'add "target_hidden_size": {h_t} to the draft\'s config.json: without it SGLang sizes fc (and shares '
                "the target's embedding) with the draft's own hidden_size"
            )
        elif (other := _other_target(width, h_t, build)) is not None:
            fix = other
        elif width % h_t == 0:
            k = width // h_t
            fix = (
                f"the draft was trained on {k} aux layers: set eagle_config.eagle_aux_hidden_state_layer_ids in the "
                f"draft's config.json to the {k} ids it was trained with (or num_aux_hidden_states = {k})"
            )
        else:
            fix = (
                f"{width} is not a multiple of the target hidden size {h_t}: the draft was trained for another "
                "target; serve it with that target"
            )
        out.add(
            ERROR,
            "fc-width",
            f"draft fc input width {width} != {build.num_aux} aux layers ({build.num_aux_source}) x {hin_text} = "
            f"{fc_in}: SGLang allocates fc for {fc_in} and cannot load the checkpoint's fc.weight",
            fix,
        )
        return
    k = n_captured if n_captured is not None else (build.num_aux if build.family is not None else None)
    if k is None or width == k * h_t or out.has("aux-count", "layer-ids-duplicate", "layer-ids-out-of-range"):
        return
    other = _other_target(width, h_t, build)
    if other is not None:
        fix = other
    elif width % h_t == 0:
        fix = (
            f"the draft was trained on {width // h_t} aux layers: set eagle_config.eagle_aux_hidden_state_layer_ids "
            f"in the draft's config.json to the {width // h_t} ids it was trained with"
        )
    else:
        fix = (
            f"{width} is not a multiple of the target hidden size {h_t}: the draft was trained for another target; "
            "serve it with that target"
        )
    out.add(
        ERROR,
        "fc-width",
        f"draft fc input width {width} != {k} aux layers x target hidden {h_t} = {k * h_t} (what the target sends)",
        fix,
    )


def _other_target(width: int, h_t: int, build: DraftBuild) -> str | None:
    """The fix when the draft's own config says it was trained for a target of another width: its
    ``target_hidden_size`` differs from this target's and its aux layer count x that width is its fc input. Dividing
    the fc width by this target's hidden size instead named a wrong layer count (192 = 3 x 64 read as 2 x 96)."""
    hin, k = build.hidden_size_in, build.num_aux
    if build.hidden_size_in_source != "target_hidden_size" or not hin or hin == h_t or not k or width != k * hin:
        return None
    return (
        f"the draft was trained for a target of hidden size {hin} ({k} aux layers x {hin} = fc input {width}; its "
        f"config.json's target_hidden_size), not this target's {h_t}: serve it with the target it was trained for"
    )
