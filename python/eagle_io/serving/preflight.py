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
from pathlib import Path
from typing import Any

from ..interop.speculation_profile import read_profile
from ..sglang.checkpoint import CheckpointError, DraftInfo, read_checkpoint, read_draft
from ..sglang.compat import resolve_algorithm
from ..sglang.draft_build import draft_build
from ..sglang.launch_args import launch_args
from ..sglang.spec_params import speculative_param_problems
from ..store.value_stats import range_warnings
from .check_draft import check_draft_build, check_positions, check_tensors, check_vocab
from .check_layers import check_fc_width, check_layer_ids
from .check_training import trained_layer_ids
from .findings import ERROR, INFO, WARNING, Finding, Findings, format_findings

__all__ = ["ERROR", "INFO", "WARNING", "Finding", "check_serving", "eagle3_signals", "format_findings"]


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


def check_serving(
    target_path: str | os.PathLike[str] | None,
    draft_path: str | os.PathLike[str] | None,
    *,
    algorithm: str | None = None,
    layer_ids: Sequence[int] | None = None,
    dataset_manifest: str | os.PathLike[str] | None = None,
    server_args: Any = None,
) -> list[Finding]:
    """Checks an EAGLE-3 serving launch before it is made, with SGLang 0.5.23's own rules: the draft SGLang will
    build from the draft config (:mod:`.draft_build`; every safetensors tensor shape against it), the states the
    target will capture and feed (:mod:`.check_layers`: the target's setter rule, duplicates, range, count and
    width), what the draft was trained on (:mod:`.check_training`: ``layer_ids``, the dataset, the draft's eagle-io
    record), the vocab map's values, positions and RoPE (:mod:`.check_draft`). Returns the findings: empty, or only
    ``info`` ones (e.g. the default layer ids SGLang will capture), when nothing is wrong.

    Args:
        target_path / draft_path: model directories (``config.json``; the draft's ``*.safetensors`` headers).
            None = take them from ``server_args`` (``--model-path`` / ``--speculative-draft-model-path``).
        algorithm: ``--speculative-algorithm`` (``EAGLE``, ``EAGLE3``, ``NEXTN`` = ``EAGLE``, ...); None = from
            ``server_args``.
        layer_ids: the aux layer ids the draft was trained on, in eagle-io's convention
            (:data:`eagle_io.store.eagle3.AUX_LAYER_CONVENTION`: input of 0-based decoder layer i).
        dataset_manifest: an eagle-io dataset directory or manifest the draft was trained on; its
            ``aux_layer_ids`` / ``aux_layer_convention`` / ``hidden_size`` / ``num_layers`` and aux width are
            checked against the launch.
        server_args: raw SGLang launch arguments (list of strings), a ``ServerArgs`` or a mapping of its fields;
            fills what the explicit arguments leave out (a conflict is an error finding).

    Raises:
        CheckpointError: a directory, ``config.json``, safetensors header or manifest that cannot be read.
        InvalidArgumentError / ArgumentTypeError: ``layer_ids`` outside ``1..N`` of the target, not ascending,
            duplicated or not integers (:func:`eagle_io.store.eagle3.validate_aux_layer_ids`).
    """
    findings = Findings()
    add = findings.add

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
    if la.use_ray:
        add(
            WARNING,
            "ray-no-guard",
            "--use-ray: SGLang's Ray scheduler actors (srt/ray/scheduler_actor.py) replace run_scheduler_process and "
            "never call load_plugins(), so eagle-io's startup guard, draft-extend width check and acceptance watchdog "
            "will not run in this launch (nor eagle-io's capture); this preflight is the only check it gets",
            "launch without --use-ray to keep the guard",
        )
    if la.config_ignored is not None:
        add(
            WARNING,
            "config-ignored",
            f"SGLang parses this launch's config file {la.config_ignored!r} but never reads it: prepare_server_args "
            "merges a config file only when the exact token --config is in argv (not --config=FILE, not an "
            "abbreviation), so the server runs without the file's settings, speculative ones included",
            f"write --config {la.config_ignored} (two tokens)",
        )
    if la.parser == "eagle-io":
        add(
            INFO,
            "launch-args-parser",
            "SGLang is not importable here, so the launch arguments were read by eagle-io's own parser (the flags it "
            "checks, spelled out; SGLang would also accept abbreviations and --config, which this parser refuses)",
            "",
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
    target = read_checkpoint(target_path, revision=la.model_revision)  # a Hub id: the snapshot SGLang loads
    draft = read_draft(draft_path, revision=la.draft_revision)
    resolved = resolve_algorithm(algorithm)
    h_t = target.hidden_size
    n_t = target.num_layers
    build = draft_build(draft.config)

    signals = eagle3_signals(draft, h_t)
    is_eagle3 = bool(signals)
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

    # 2. The draft SGLang builds: its class, config switches and every tensor shape.
    if is_eagle3:
        if resolved == "EAGLE3":
            check_draft_build(findings, draft, build, h_t)
        check_tensors(findings, draft, build)
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

    # 3. Training, layer ids and widths: what SGLang captures and feeds vs the fc and the training.
    n_captured: int | None = None
    if is_eagle3:
        trained = trained_layer_ids(findings, target, draft, layer_ids=layer_ids, dataset_manifest=dataset_manifest)
        if n_t is not None:
            n_captured = len(check_layer_ids(findings, target, draft, build, trained))
        else:  # the layer checks were skipped without a word
            add(
                WARNING,
                "layer-ids-unknown",
                f"the target's config.json ({target_path}) has no num_hidden_layers: which layers SGLang captures "
                "(its default [2, N//2, N-3], the range of the draft's ids) cannot be checked",
                "check against a target checkpoint whose config.json has num_hidden_layers (the one SGLang loads)",
            )
        check_fc_width(findings, build, width, h_t, n_captured)
    if dataset_manifest is not None:
        check_dataset_range(findings, target, dataset_manifest)

    # 4. Vocab map.
    if is_eagle3:
        check_vocab(findings, draft, target)
    if draft.vocab_size is not None and target.vocab_size is not None and draft.vocab_size != target.vocab_size:
        add(
            ERROR if is_eagle3 else WARNING,
            "vocab-size",
            f"draft vocab_size {draft.vocab_size} != target vocab_size {target.vocab_size}: the draft embeds target "
            "token ids",
            "use a draft trained with this target's tokenizer",
        )

    # 5. Positions and RoPE.
    check_positions(findings, draft, target, la.context_length)

    # 6. The speculative knobs, as SGLang can serve them (it parses a topk of -5 and fails, or not, later).
    for problem in speculative_param_problems(
        la.num_steps,
        la.eagle_topk,
        la.num_draft_tokens,
        context_length=la.context_length,
        draft_vocab_size=draft.draft_vocab_size or draft.vocab_size,
    ):
        add(ERROR, "speculative-params", problem, "launch with values inside the bound named")

    # 7. The speculation profile the plugin's acceptance watchdog reads, through the same check (read_profile).
    try:
        read_profile(draft.path)
    except CheckpointError as e:  # was "OK": the plugin logs and ignores such a file at startup
        add(
            ERROR,
            "speculation-profile",
            f"{e}: the plugin's acceptance watchdog ignores it, so its expected-accept-length rule is off in this "
            "launch (only the exactly-1.00 rule runs)",
            "measure the draft again (`eagle-io eval-draft` writes the profile), or remove the file",
        )

    if not draft.weight_files and not draft.other_weight_files:
        add(WARNING, "no-draft-weights", f"{draft.path}: no weight files found", "point at the draft's directory")
    return list(findings)


def check_dataset_range(findings: Findings, target: Any, dataset_manifest: str | os.PathLike[str]) -> None:
    """A float16 target (``torch_dtype`` / ``dtype`` of its config: what SGLang's ``--dtype auto`` serves) whose
    training data's recorded per-layer max |x| (``value_stats.json``, docs/FORMAT.md 2.2) exceeds float16's range:
    the target overflows at serving where the captured data did not."""
    dtype = target.get("torch_dtype") or target.get("dtype")
    if dtype not in ("float16", "half"):
        return
    for message in range_warnings(dataset_manifest, "float16"):
        findings.add(WARNING, "dataset-range-exceeds-fp16", message, "serve the target in bfloat16 (--dtype bfloat16)")
