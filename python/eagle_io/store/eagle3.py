"""The EAGLE-3 contract of a dataset: what its aux layer ids mean, and the one check that it holds what EAGLE-3
training reads (the schema of :func:`eagle_io.eagle3_schema`).

**Aux layer ids.** Convention used everywhere in eagle-io (and written into dataset manifests as
:data:`AUX_LAYER_CONVENTION`): id ``i`` is the residual stream at the *input* of 0-based decoder layer ``i``,
which equals Hugging Face ``output_hidden_states[i]`` (index 0 is the embedding output, index ``k`` the output
of decoder layer ``k - 1``). SGLang's Llama capture uses the same meaning for the ids it stores in
``LlamaModel.layers_to_capture`` (``sglang/srt/models/llama.py``, ``LlamaModel.forward`` hands layer ``i`` a
capture when ``i in self.layers_to_capture``, and the layer records its input residual). How each SGLang model's
setter turns a draft config's ids into those is :mod:`eagle_io.sglang.setters`.

Valid ids for a target with ``N`` decoder layers are ``1 <= i <= N - 1``, plus ``N`` where the capture path
records the final boundary:

* ``0`` (the embedding output) is refused: it holds nothing beyond the token embedding the draft already reads
  (EAGLE-3 concatenates ``embed(token)`` with ``fc(aux)``), no trainer or SGLang default uses it, and the SGLang
  versions before 0.5.23 in the supported range cannot capture it (``LlamaModel.forward`` added
  ``hidden_states + residual`` with ``residual`` still ``None`` before layer 0). SGLang 0.5.23's layer boundaries
  can record it; eagle-io still refuses it, so a dataset and the drafts trained on it serve on every supported
  version.
* ``N`` is the boundary after the last layer: the final *pre-norm* residual stream (the input of the final
  norm). gpt-oss EAGLE-3 drafts and vLLM's ``[.., N]`` ids use it. The HF capture records it
  (:mod:`eagle_io.capturing.hf`); SGLang only for :data:`eagle_io.sglang.setters.FINAL_BOUNDARY_SETTERS`. The
  final state eagle-io stores separately (``hidden_states``) is the *post-norm* one; a dataset whose last aux id
  is ``N`` records ``final_state_is_prenorm: true`` (:func:`eagle_io.store.metadata.eagle3_metadata`).

Negative ids are never counted from the end: ``-1`` is an error, not ``N - 1``.

**The dataset check.** ``ShardDataset``, ``export-specforge``, the vocabulary mapping and ``train-draft`` all call
:func:`check_eagle3_dataset`, so a dataset written with another schema fails with the same
:class:`~eagle_io.errors.IncompatibleDatasetError` naming its manifest, instead of a ``KeyError`` deep in a loop.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import ArgumentTypeError, IncompatibleDatasetError, InvalidArgumentError
from .reader import Dataset

AUX_LAYER_CONVENTION = "input of 0-based decoder layer i = HF output_hidden_states[i] (index 0 = embedding output)"


# --------------------------------------------------------------------------------------------------------------
# Aux layer ids: the one validator
# --------------------------------------------------------------------------------------------------------------


def aux_id_problems(ids: Sequence[object], num_layers: int | None, *, final_boundary: bool = False) -> list[str]:
    """Every problem of a list of aux-layer ids (eagle-io convention), one sentence each; empty = valid.

    Rules: at least one id; each an ``int`` (``bool`` is not); ``1 <= id <= N - 1``, or ``<= N`` with
    ``final_boundary`` (the capture path records the final pre-norm boundary, see the module docstring); only
    ``id >= 1`` when ``num_layers`` is None (unknown); strictly ascending (hence distinct): the stored
    ``[L, k*H]`` concatenation follows layer-execution order (as SGLang's ``pack_aux_hidden_states`` does), so
    another order is refused, not repaired.
    """
    if num_layers is not None and num_layers < 2:
        return [f"num_layers must be >= 2 to have any valid aux layer id, got {num_layers}"]
    if len(ids) == 0:
        return ["aux layer ids must not be empty"]
    hi = None if num_layers is None else (num_layers if final_boundary else num_layers - 1)
    problems: list[str] = []
    prev: int | None = None
    for pos, i in enumerate(ids):
        if isinstance(i, bool) or not isinstance(i, int):
            problems.append(f"aux layer id at position {pos} is {i!r} ({type(i).__name__}), expected int")
            continue
        if i < 1 or (hi is not None and i > hi):
            if num_layers is None:
                where, final = "1 <= id", ""
            elif final_boundary:
                where = f"1 <= id <= num_layers = {num_layers} (id {num_layers} = the final pre-norm boundary)"
                final = ""
            else:
                where = f"1 <= id <= num_layers-1 = {num_layers - 1}"
                final = f"; {num_layers} = the final pre-norm output is not captured on this path"
            problems.append(
                f"aux layer id {i} out of range: ids must satisfy {where} (id = input of 0-based decoder layer id; "
                f"0 = the embedding output is refused: it adds nothing to the token embedding the draft reads{final}; "
                "negative ids are not counted from the end)"
            )
        if prev is not None and i == prev:
            problems.append(f"aux layer id {i} is duplicated in {list(ids)}: ids must be distinct")
        elif prev is not None and i < prev:
            problems.append(f"aux layer id {i} follows {prev} in {list(ids)}: ids must be sorted ascending")
        prev = i
    return problems


def validate_aux_layer_ids(ids: Sequence[int], num_layers: int | None, *, final_boundary: bool = False) -> list[int]:
    """Check aux-layer ids (:func:`aux_id_problems`' rules) and return them as a list of ``int``.

    Args:
        ids: eagle-io ids (input of 0-based decoder layer i).
        num_layers: the target's decoder layers ``N`` (None: unknown, only ``id >= 1`` is checked).
        final_boundary: whether id ``N`` (final pre-norm boundary) is capturable on this path: True for the HF
            capture, :func:`capturable_range` for an SGLang target.

    Raises:
        ArgumentTypeError: an id is not an integer (``bool`` included; a ``TypeError``).
        InvalidArgumentError: naming every offending id and the rule it breaks, or ``num_layers < 2``
            (a ``ValueError``).
    """
    problems = aux_id_problems(ids, num_layers, final_boundary=final_boundary)
    types = [p for p in problems if p.endswith("expected int")]
    if types:
        raise ArgumentTypeError("; ".join(types))
    if problems:
        raise InvalidArgumentError("; ".join(problems))
    return [int(i) for i in ids]


def sglang_default_ids(num_layers: int) -> list[int]:
    """``[2, N//2, N-3]`` for a target of ``N`` decoder layers, unvalidated: SGLang's default EAGLE-3 aux layers
    (``set_eagle3_layers_to_capture(None)``, ``srt/models/llama.py``), the one place eagle-io writes the list
    (:func:`default_aux_layer_ids` validates it; :func:`eagle_io.sglang.setters.default_capture_ids` shifts it)."""
    return [2, num_layers // 2, num_layers - 3]


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """SGLang's default EAGLE-3 aux layers ``[2, N//2, N-3]`` for a target with ``N`` decoder layers, validated:
    what ``set_eagle3_layers_to_capture(None)`` stores (``srt/models/llama.py``, ``LlamaForCausalLM``; the other
    setters use the same list, :func:`eagle_io.sglang.setters.default_capture_ids`).
    Examples: N=30 -> [2, 15, 27]; N=61 -> [2, 30, 58].

    Raises:
        InvalidArgumentError: if the three ids collide or fall out of range (``N < 7``), e.g. N=6 gives [2, 3, 3];
            pass explicit ids for such tiny models.
    """
    ids = sglang_default_ids(num_layers)
    try:
        return validate_aux_layer_ids(ids, num_layers)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(
            f"default aux layer ids [2, N//2, N-3] = {ids} are invalid for num_layers={num_layers} "
            f"(need N >= 7): {exc}; pass explicit aux layer ids"
        ) from exc


# --------------------------------------------------------------------------------------------------------------
# The dataset check
# --------------------------------------------------------------------------------------------------------------

#: The schema tensors an EAGLE-3 training item needs.
REQUIRED_TENSORS = ("input_ids", "loss_mask", "aux_hidden_states", "hidden_states")


def require_tensors(ds: Dataset, names: Sequence[str], user: str) -> None:
    """Raises :class:`IncompatibleDatasetError` naming ``ds``'s manifest when its schema lacks one of ``names``."""
    have = [s.name for s in ds.schema]
    for name in names:
        if name not in have:
            raise IncompatibleDatasetError(
                f"{ds.manifest_path}: schema has no tensor {name!r} (has {sorted(have)}); {user} needs {list(names)}"
            )


def check_eagle3_dataset(ds: Dataset, user: str) -> None:
    """The dataset holds the EAGLE-3 tensors, and its metadata agrees with its own schema widths and dtype.

    Raises:
        IncompatibleDatasetError: a tensor of :data:`REQUIRED_TENSORS` is missing, or metadata ``hidden_size``,
            ``aux_layer_ids`` or ``dtype`` contradicts the schema (names the manifest and both values).
    """
    require_tensors(ds, REQUIRED_TENSORS, user)
    specs = {s.name: s for s in ds.schema}
    meta = ds.metadata
    hidden, aux = specs["hidden_states"], specs["aux_hidden_states"]
    if "hidden_size" in meta and hidden.width != meta["hidden_size"]:
        raise IncompatibleDatasetError(
            f"{ds.manifest_path}: metadata hidden_size={meta['hidden_size']} but the schema's hidden_states "
            f"width is {hidden.width}"
        )
    if "hidden_size" in meta and "aux_layer_ids" in meta:
        want = len(meta["aux_layer_ids"]) * meta["hidden_size"]
        if aux.width != want:
            raise IncompatibleDatasetError(
                f"{ds.manifest_path}: metadata aux_layer_ids={meta['aux_layer_ids']} x hidden_size="
                f"{meta['hidden_size']} = {want} but the schema's aux_hidden_states width is {aux.width}"
            )
    if "dtype" in meta and meta["dtype"] not in (hidden.dtype, aux.dtype):
        raise IncompatibleDatasetError(
            f"{ds.manifest_path}: metadata dtype={meta['dtype']!r} but the schema stores "
            f"hidden_states as {hidden.dtype} and aux_hidden_states as {aux.dtype}"
        )


def require_samples(ds: Dataset, user: str, minimum: int = 1) -> None:
    """``ds`` holds at least ``minimum`` committed samples, else the refusal says why it has fewer: a capture still
    running (or interrupted: its manifest not marked complete) that has not committed them yet, or one that
    finished with fewer.

    Raises:
        IncompatibleDatasetError: names the manifest, the count and the capture's state.
    """
    n = len(ds)
    if n >= minimum:
        return
    if not ds.manifest["complete"]:
        why = (
            "its capture is not marked complete (still running, or interrupted: `eagle-io generate ... --resume` "
            "continues it); wait until it has committed more"
        )
    else:
        why = "its capture completed with that many; capture more records"
    raise IncompatibleDatasetError(
        f"{ds.manifest_path}: {user} needs at least {minimum} committed sample(s); the dataset holds {n}: {why}"
    )
