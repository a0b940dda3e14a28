"""vLLM speculators interop: import and export of its offline training input.

Conventions, read from speculators 0.9.0 and hs-connectors 0.9.0 (the PyPI wheels; the tests run their code):

* **Training directory** (``speculators train --data-path D``; ``speculators/train/data.py``: ``ArrowDataset``,
  ``hs_connectors/transfer.py``: ``FileBackend`` / ``FP8Backend``): ``D`` is the preprocessed dataset
  (``datasets.save_to_disk``, torch format, columns ``input_ids [L]`` int64, ``loss_mask [L]`` int64, ``seq_len``;
  ``speculators/data_generation/preprocessing.py``), ``D/hidden_states/hs_{row}.safetensors`` one file per row,
  ``D/token_freq.pt`` (``{token_id: count}`` over ``loss_mask == 1`` tokens,
  ``speculators/train/vocab_mapping.py``: ``save_token_frequency_distribution``) and, for a reduced draft vocabulary,
  ``D/d2t-{V}.npy`` (int64 offsets) and ``D/t2d-{V}.npy`` (bool over the target vocabulary), the files its trainer
  looks for first (``speculators/train/cli.py``: ``parse_vocab_mappings``).
* **Hidden-state file**: ``token_ids [L]`` int64 and ``hidden_states [L, k+1, H]`` in the target dtype: the ``k``
  aux layers (default ``[2, N//2, N-3]``, ``speculators/models/utils.py``: ``resolve_target_layer_ids``), then the
  final *pre-norm* state (``ArrowDataset`` splits ``hidden_states[:, :-1].flatten(1)`` = aux and
  ``hidden_states[:, -1]`` = ``verifier_last_hidden_states``).
* **FP8 file** (``hs_connectors/fp8_hidden_states_connector.py``, ``hs_connectors/fp8_utils.py``):
  ``hidden_states`` float8_e4m3fn ``[L, k+1, H]`` plus ``hidden_states_scales`` float32 ``[L, 1, 1]``: one scale per
  token over all planes, ``scale = max(amax / 448, 1e-12)``, ``q = e4m3fn(x_f32 / scale)``; ``FP8Transfer``
  dequantises it for the trainer (``--hidden-states-backend fp8``).

eagle-io stores the pre-norm plane under its own name, :data:`PRE_NORM`, so an imported dataset exports back to the
same file bytes (FP8 files: the same FP8 bytes and scales, stored as given). A capture holds the same plane when its
last aux id is ``N`` (``eagle-io generate --aux-layer-ids 2,N//2,N-3,N``: the final pre-norm boundary, metadata
``final_state_is_prenorm``). ``hidden_states`` (post-norm, what eagle-io's EAGLE-3 trainer reads) is computed at
import with the target's final RMSNorm when one is given.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .. import defaults
from ..errors import IncompatibleDatasetError, InvalidArgumentError, SpeculatorsFileError
from ..store import layout
from ..store.eagle3 import sglang_default_ids

__all__ = [
    "PRE_NORM",
    "SCALES",
    "SpeculatorsImport",
    "TargetNorm",
    "export_speculators",
    "import_speculators",
    "quantize_like_speculators",
]

#: eagle-io's tensor name for the last layer's pre-norm output (speculators' last ``hidden_states`` plane).
PRE_NORM = "last_hidden_states_pre_norm"
#: hs-connectors' key of the per-token FP8 scales (``hs_connectors.fp8_utils.SCALES_KEY``).
SCALES = "hidden_states_scales"
#: hs-connectors' smallest scale (``quantize_tensor_to_fp8``: ``clamp(min=1e-12)``).
_MIN_SCALE = 1e-12
_NAME = re.compile(r"^hs_(0|[1-9][0-9]*)\.safetensors$")
_FLOAT = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}


@dataclass(frozen=True)
class TargetNorm:
    """The target's final RMSNorm (HF ``LlamaRMSNorm`` rule): ``weight [H]`` and ``eps``."""

    weight: torch.Tensor
    eps: float

    @classmethod
    def from_checkpoint(cls, directory: str | os.PathLike[str]) -> TargetNorm:
        """Reads the final norm's weight (``model.norm.weight``) from the checkpoint's safetensors shards, that
        tensor's bytes alone (:func:`eagle_io.capturing.weights.read_final_norm`), and ``rms_norm_eps`` from its
        ``config.json`` (a wrapper's ``text_config`` first).

        Raises:
            InvalidArgumentError: no ``config.json`` with ``rms_norm_eps``. CheckpointError (an InvalidArgumentError):
                no ``model.norm.weight`` tensor, or unreadable shards.
        """
        from ..capturing.weights import read_final_norm
        from ..sglang.checkpoint import read_checkpoint

        d = Path(directory)
        eps = read_checkpoint(d).get("rms_norm_eps")
        if isinstance(eps, bool) or not isinstance(eps, (int, float)):
            raise InvalidArgumentError(f"{d}: no config.json with rms_norm_eps (found {eps!r})")
        return cls(read_final_norm(d), float(eps))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x [L, H]`` -> ``weight * (x / sqrt(mean(x^2) + eps))`` computed in float32, cast back to x's dtype
        before the weight (HF Llama's order), result in x's dtype."""
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.to(x.dtype) * h.to(x.dtype)).to(x.dtype)


def quantize_like_speculators(planes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``planes [L, k+1, H]`` (any float dtype) -> ``(q [L, k+1, H] float8_e4m3fn, scales [L, 1, 1] float32)`` by
    hs-connectors' rule (``hs_connectors.fp8_utils.quantize_tensor_to_fp8``, what ``FP8HiddenStatesConnector``
    writes): per token ``scale = max(amax / 448, 1e-12)`` over all planes, ``q = e4m3fn(x_f32 / scale)``. The tests
    compare it bit for bit with hs-connectors' function."""
    x = planes.float()
    scale = (x.abs().amax(dim=(1, 2), keepdim=True) / torch.finfo(torch.float8_e4m3fn).max).clamp(min=_MIN_SCALE)
    return (x / scale).to(torch.float8_e4m3fn), scale


@dataclass
class SpeculatorsImport:
    """What :func:`import_speculators` did."""

    manifest: str
    imported: int = 0
    tokens: int = 0
    hidden_size: int | None = None
    num_aux_layers: int | None = None
    dtype: str | None = None
    fp8_files: bool = False
    post_norm: bool = False
    aux_layer_ids: list[int] | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def list_speculators_files(root: str | os.PathLike[str]) -> list[tuple[int, str]]:
    """``[(idx, path)]`` of every ``hs_{idx}.safetensors`` directly in ``root``, by ``idx``.

    Raises:
        InvalidArgumentError: ``root`` is not a directory.
    """
    root = os.fspath(root)
    if not os.path.isdir(root):
        raise InvalidArgumentError(f"{root}: not a directory of speculators hs_{{i}}.safetensors files")
    found = [(int(m.group(1)), os.path.join(root, n)) for n in os.listdir(root) if (m := _NAME.match(n))]
    return sorted(found)


def _load(path: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(token_ids [L] int64, hidden_states [L, k+1, H], scales [L, 1, 1] float32 or None)`` of one file, checked
    (FP8 files: ``hidden_states`` float8_e4m3fn with its :data:`SCALES`).

    Raises:
        SpeculatorsFileError: unreadable, missing a tensor, or shapes / dtypes / values that are not speculators'.
    """
    from safetensors.torch import load_file

    try:
        data = load_file(path)
    except Exception as e:  # safetensors raises SafetensorError, OSError, ...
        raise SpeculatorsFileError(path, f"unreadable ({type(e).__name__}: {e})") from e
    missing = {"token_ids", "hidden_states"} - data.keys()
    if missing:
        raise SpeculatorsFileError(path, f"missing {sorted(missing)} (has {sorted(data)})")
    ids, hs, scales = data["token_ids"], data["hidden_states"], data.get(SCALES)
    if ids.dim() != 1 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise SpeculatorsFileError(path, f"token_ids must be an integer [L] tensor, got {ids.dtype} {list(ids.shape)}")
    n = ids.shape[0]
    if hs.dim() != 3 or hs.shape[0] != n or hs.shape[1] < 2:
        raise SpeculatorsFileError(
            path, f"hidden_states shape {list(hs.shape)} is not [L={n}, k+1 >= 2, H] (token_ids has L)"
        )
    if hs.dtype == torch.float8_e4m3fn:
        if scales is None or scales.dtype != torch.float32 or tuple(scales.shape) != (n, 1, 1):
            got = "absent" if scales is None else f"{scales.dtype} {list(scales.shape)}"
            raise SpeculatorsFileError(
                path, f"FP8 hidden_states need {SCALES} float32 [{n}, 1, 1] (hs_connectors.fp8_utils); it is {got}"
            )
        if n and not bool((torch.isfinite(scales) & (scales > 0)).all()):
            bad = int((~(torch.isfinite(scales) & (scales > 0))).flatten().nonzero()[0, 0])
            raise SpeculatorsFileError(path, f"{SCALES} is not finite and > 0 (first at token {bad})")
        values = hs.float()
    elif hs.dtype in _FLOAT:
        if scales is not None:
            raise SpeculatorsFileError(path, f"{SCALES} given for {hs.dtype} hidden_states (only FP8 files have it)")
        values = hs
    else:
        raise SpeculatorsFileError(
            path, f"hidden_states dtype {hs.dtype} is not float16/bfloat16/float32/float8_e4m3fn"
        )
    if n and not bool(torch.isfinite(values).all()):
        bad = int((~torch.isfinite(values)).flatten(1).any(1).nonzero()[0, 0])
        raise SpeculatorsFileError(path, f"hidden_states has NaN/Inf values (first at token {bad})")
    return ids.to(torch.int64), hs, scales


def _recorded_ids(aux_layer_ids: list[int] | None, num_layers: int | None, k: int, first: str) -> list[int] | None:
    """The aux layer ids an import records: ``aux_layer_ids`` as given, else speculators' default for a
    ``num_layers``-layer target; checked against the ``k`` aux planes of the files.

    Raises:
        InvalidArgumentError: ids that are not one per aux plane, or not layers of the target.
    """
    from ..store.eagle3 import validate_aux_layer_ids

    if aux_layer_ids is None:
        if num_layers is None:
            return None
        aux_layer_ids = sglang_default_ids(num_layers)  # speculators resolve_target_layer_ids: the same list
        what = f"speculators' default [2, N//2, N-3] for N = {num_layers}"
    else:
        what = f"aux_layer_ids {list(aux_layer_ids)}"
    ids = validate_aux_layer_ids(list(aux_layer_ids), num_layers, final_boundary=True)
    if len(ids) != k:
        raise InvalidArgumentError(
            f"{what} name {len(ids)} layers, but the files hold {k} aux planes before the final one ({first}): "
            "pass the target_layer_ids the states were generated with (--aux-layer-ids)"
        )
    return ids


def import_speculators(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    loss_masks: Callable[[int, torch.Tensor], torch.Tensor] | None = None,
    all_ones_loss_mask: bool = False,
    target_norm: TargetNorm | None = None,
    aux_layer_ids: list[int] | None = None,
    num_layers: int | None = None,
    metadata: Mapping[str, Any] | None = None,
    precision: str | None = None,
    shard_bytes: int = defaults.SHARD_BYTES,
    threads: int = defaults.THREADS,
    progress: Callable[[int, int], None] | None = None,
) -> SpeculatorsImport:
    """Imports speculators' ``hs_{idx}.safetensors`` files (bf16/fp16/fp32, or hs-connectors' FP8) into eagle-io
    shards (sample id = ``idx``).

    Stored per sample: ``input_ids [L]`` int64 (= ``token_ids``), ``loss_mask [L]`` uint8,
    ``aux_hidden_states [L, k*H]`` (planes ``0..k-1`` concatenated), :data:`PRE_NORM` ``[L, H]`` (the last plane)
    and, with ``target_norm``, ``hidden_states [L, H]`` = ``target_norm(pre-norm plane)`` (what
    ``eagle-io train-draft`` and ``export-specforge`` read). Plain files keep their dtype, bit-exact. FP8 files are
    stored as FP8 with their own bytes and per-token scale (both state tensors get the file's scale), so a re-export
    gives the same file bytes; their dtype is recorded as bfloat16 (``FP8Transfer``'s default) and
    ``hidden_states`` is computed from the pre-norm plane as eagle-io reads it back, quantised by eagle-io's rule.

    Args:
        src: speculators' hidden-states directory (``D/hidden_states``).
        out: new eagle-io dataset directory.
        loss_masks: ``loss_masks(idx, token_ids) -> [L]`` 0/1 mask of sample ``idx`` (from the preprocessed
            dataset; check its ``input_ids`` against ``token_ids``).
        all_ones_loss_mask: store a mask of ones instead (recorded in the metadata as ``loss_mask_source``).
        target_norm: the target's final RMSNorm (:meth:`TargetNorm.from_checkpoint`).
        aux_layer_ids: the ``k`` layers of the aux planes (speculators' ``target_layer_ids``, same convention);
            default with ``num_layers``: ``[2, N//2, N-3]``. Recorded (``train-draft`` needs them).
        num_layers: the target's decoder layers ``N`` (recorded; checks the ids).
        metadata: merged over the inferred ``hidden_size``, ``num_aux_layers``, ``dtype``, ``source_format``.
        precision: None (the files' storage), ``"bf16"`` (FP8 files dequantised: lossy once more) or ``"fp8"``
            (plain files quantised by eagle-io's rule: lossy, export no longer bit-exact).

    Raises:
        InvalidArgumentError: neither or both of ``loss_masks`` / ``all_ones_loss_mask``; no file in ``src``;
            a mask of the wrong length or not 0/1 (naming the file); a norm weight not ``[H]``; aux layer ids that
            do not fit the files or the target.
        SpeculatorsFileError: a bad file (named), or one whose layout differs from the first file's.
    """
    from ..capturing.ring import RingSink
    from ..store import fp8
    from ..store.eagle3 import AUX_LAYER_CONVENTION
    from ..store.schema import TensorSpec, eagle3_schema, precision_name
    from ..store.writer import ShardWriter

    if (loss_masks is None) == (not all_ones_loss_mask):
        raise InvalidArgumentError(
            "speculators files hold no loss mask: pass the preprocessed dataset's masks (loss_masks / --preprocessed)"
            " or all_ones_loss_mask=True (--all-ones-loss-mask), not both"
        )
    files = list_speculators_files(src)
    if not files:
        raise InvalidArgumentError(f"{os.fspath(src)}: no hs_{{i}}.safetensors file")
    first = _load(files[0][1])
    hs0 = first[1]
    n_planes, hidden, dtype = hs0.shape[1], hs0.shape[2], hs0.dtype
    k = n_planes - 1
    is_fp8 = dtype == torch.float8_e4m3fn
    state_dtype = torch.bfloat16 if is_fp8 else dtype
    if target_norm is not None and tuple(target_norm.weight.shape) != (hidden,):
        raise InvalidArgumentError(
            f"the target norm weight has shape {list(target_norm.weight.shape)}, the files' hidden size is {hidden}"
        )
    ids = _recorded_ids(aux_layer_ids, num_layers, k, files[0][1])
    prec = precision_name("fp8" if precision is None and is_fp8 else precision)
    stored = is_fp8 and prec is not None  # FP8 files kept as they are
    name = _FLOAT[state_dtype]
    specs = [s for s in eagle3_schema(hidden, k, name, prec) if s.name != "hidden_states"]
    specs.append(TensorSpec(PRE_NORM, name, hidden, prec))
    if target_norm is not None:
        specs.append(TensorSpec("hidden_states", name, hidden, prec))
    meta: dict[str, Any] = {
        "source_format": "vllm-speculators hs_{i}.safetensors" + (" (hs-connectors FP8)" if is_fp8 else ""),
        "hidden_size": hidden,
        "num_aux_layers": k,
        "dtype": name,
        "loss_mask_source": "all ones" if all_ones_loss_mask else "preprocessed dataset",
    }
    if num_layers is not None:
        meta["num_layers"] = num_layers
    if ids is not None:
        meta["aux_layer_ids"] = ids
        meta["aux_layer_convention"] = AUX_LAYER_CONVENTION
    if target_norm is not None:
        meta["hidden_states_post_norm"] = True
    meta.update(metadata or {})
    summary = SpeculatorsImport(
        manifest="",
        hidden_size=hidden,
        num_aux_layers=k,
        dtype=name,
        fp8_files=is_fp8,
        post_norm=target_norm is not None,
        aux_layer_ids=ids,
    )
    footprint = layout.Footprint(out)
    writer = ShardWriter(out, specs, meta, shard_bytes=shard_bytes, threads=threads)
    # The ring holds whole samples: room for the largest file twice (its FP8 rows plus the post-norm tensor's).
    ring = max(defaults.RING_BYTES, 2 * max(os.path.getsize(p) for _, p in files))
    sink = RingSink(writer, ring_bytes=ring) if stored else None
    try:
        for done, (idx, path) in enumerate(files, 1):
            tok, hs, scales = first if done == 1 else _load(path)
            if hs.shape[1:] != hs0.shape[1:] or hs.dtype != dtype:
                raise SpeculatorsFileError(
                    path,
                    f"hidden_states {list(hs.shape[1:])} {hs.dtype} per token differs from the first file's "
                    f"{list(hs0.shape[1:])} {dtype} ({files[0][1]})",
                )
            n = tok.shape[0]
            if all_ones_loss_mask:
                mask = torch.ones(n, dtype=torch.uint8)
            else:
                mask = torch.as_tensor(loss_masks(idx, tok))  # type: ignore[misc]
                if mask.shape != (n,) or mask.dtype.is_floating_point or not bool(((mask == 0) | (mask == 1)).all()):
                    raise InvalidArgumentError(
                        f"{path}: its loss mask ({mask.dtype} {list(mask.shape)}) is not 0/1 of length {n}"
                    )
                mask = mask.to(torch.uint8)
            sample = {"input_ids": tok.contiguous(), "loss_mask": mask.contiguous()}
            if is_fp8:
                s = scales.reshape(n, 1)
                planes = {"aux_hidden_states": hs[:, :-1].reshape(n, k * hidden), PRE_NORM: hs[:, -1]}
                pre = fp8.dequantize(planes[PRE_NORM], s, None, state_dtype)
                if stored:
                    for key, q in planes.items():
                        sample[key], sample[key + "_scales"] = q.contiguous(), s.contiguous()
                    if target_norm is not None:
                        q, hs_scales, _ = fp8.quantize(target_norm(pre), None)
                        sample["hidden_states"], sample["hidden_states_scales"] = q, hs_scales
                else:
                    sample["aux_hidden_states"] = fp8.dequantize(planes["aux_hidden_states"], s, None, state_dtype)
                    sample[PRE_NORM] = pre
                    if target_norm is not None:
                        sample["hidden_states"] = target_norm(pre).contiguous()
            else:
                pre = hs[:, -1].contiguous()
                sample["aux_hidden_states"] = hs[:, :-1].reshape(n, k * hidden).contiguous()
                sample[PRE_NORM] = pre
                if target_norm is not None:
                    sample["hidden_states"] = target_norm(pre).contiguous()
            if sink is not None:
                sink.put_stored(idx, sample, key=os.path.basename(path))
            else:
                writer.write(idx, sample, key=os.path.basename(path))
            summary.imported += 1
            summary.tokens += n
            if progress:
                progress(done, len(files))
    except BaseException:  # an import is not resumed: the part written is no result, and would refuse the retry
        (sink or writer).close(complete=False)
        footprint.take_back_dataset()
        raise
    (sink or writer).close()
    summary.manifest = writer.manifest_path
    return summary


def _planes_source(ds: Any) -> tuple[int, int, bool]:
    """``(k_aux, hidden, separate)`` of a dataset speculators' layout can be written from: ``separate`` when the
    final pre-norm plane is the :data:`PRE_NORM` tensor, else it is the last ``H`` columns of ``aux_hidden_states``
    (a capture whose last aux id is ``N``).

    Raises:
        IncompatibleDatasetError: the dataset holds no pre-norm final state, naming the capture option that would.
    """
    from ..store.eagle3 import require_tensors

    require_tensors(ds, ("input_ids", "loss_mask", "aux_hidden_states"), "export-speculators")
    specs = {s.name: s for s in ds.schema}
    meta = ds.metadata
    aux = specs["aux_hidden_states"].width or 0
    if PRE_NORM in specs:
        hidden = specs[PRE_NORM].width or 0
        separate = True
    else:
        ids, n = meta.get("aux_layer_ids"), meta.get("num_layers")
        if not (meta.get("final_state_is_prenorm") and ids and isinstance(n, int) and ids[-1] == n):
            want = ",".join(map(str, [*sglang_default_ids(n), n])) if isinstance(n, int) else "2,N//2,N-3,N"
            raise IncompatibleDatasetError(
                f"{ds.manifest_path}: no final pre-norm state (aux_layer_ids {ids}, no {PRE_NORM!r} tensor); "
                "speculators stores its aux layers then the last layer's pre-norm output, and post-norm "
                f"hidden_states cannot be un-normalised exactly: capture with `eagle-io generate --aux-layer-ids "
                f"{want}` (N = the final pre-norm boundary; the HF capture records it), or import speculators' own "
                "files with `eagle-io import-speculators`"
            )
        hidden = meta.get("hidden_size") or 0
        separate = False
    if not hidden or not aux or aux % hidden or (not separate and aux // hidden < 2):
        raise IncompatibleDatasetError(
            f"{ds.manifest_path}: aux_hidden_states width {aux} is not 2 or more planes of the hidden size {hidden}"
        )
    return aux // hidden - (0 if separate else 1), hidden, separate


def _stored_planes(item: Mapping[str, torch.Tensor], n: int, hidden: int, separate: bool):
    """``(q [L, k+1, H] float8_e4m3fn, scales [L, 1, 1])`` from an item read with ``dequantize=False`` when its
    FP8 states carry one scale per token over all planes (hs-connectors' layout, so no second rounding), else None.
    Zero scales (all-zero tokens; eagle-io stores 0) become hs-connectors' 1e-12 (the same values read back)."""
    keys = ["aux_hidden_states", PRE_NORM] if separate else ["aux_hidden_states"]
    if any(item[k].dtype != torch.float8_e4m3fn or item[k + "_scales"].shape != (n, 1) for k in keys):
        return None
    scales = item["aux_hidden_states_scales"]
    if separate and not torch.equal(scales, item[PRE_NORM + "_scales"]):
        return None
    q = item["aux_hidden_states"].reshape(n, -1, hidden)
    if separate:
        q = torch.cat([q, item[PRE_NORM].reshape(n, 1, hidden)], 1)
    return q.contiguous(), scales.clamp(min=_MIN_SCALE).reshape(n, 1, 1).contiguous()


def export_speculators(
    dataset: Any,
    out: str | os.PathLike[str],
    *,
    precision: str = "bf16",
    draft_vocab_size: int | None = None,
    overwrite: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Writes an eagle-io dataset as speculators' training directory ``out`` (``speculators train --data-path
    out``; the module docstring has the layout): the preprocessed dataset (row ``r`` = dataset position ``r``,
    ``loss_mask`` as int64), ``out/hidden_states/hs_{r}.safetensors`` (each written atomically, through
    ``safetensors.torch.save``), ``out/token_freq.pt`` and, with ``draft_vocab_size``, ``out/d2t-{V}.npy`` and
    ``out/t2d-{V}.npy`` (:func:`eagle_io.interop.vocab.mapping_from_counts`, speculators' ranking), plus
    ``out/eagle_io_export.json`` (the sample id of each row, the layer ids, speculators' ``--target-layer-ids``).

    The states: the ``k`` aux planes then the final pre-norm plane, from the :data:`PRE_NORM` tensor or, for a
    capture whose last aux id is ``N``, from the last aux block. ``precision="bf16"``: the dataset's dtype (FP8
    states dequantised). ``precision="fp8"``: hs-connectors' FP8 file; FP8 states stored with one scale per token
    over all planes are written as stored, others quantised from the dataset's dtype by
    :func:`quantize_like_speculators`.

    Returns:
        ``{"files", "bytes", "tokens", "out", "precision", "target_layer_ids", "draft_vocab_size"}``.

    Raises:
        IncompatibleDatasetError: no final pre-norm state (the message names the capture option that records it);
            ``draft_vocab_size`` without a recorded ``vocab_size``.
        InvalidArgumentError: ``out`` is not empty and ``overwrite`` is False; a bad ``precision``; a
            ``draft_vocab_size`` outside ``[1, vocab_size]`` (checked before any file is written). An export into a
            new or empty ``out`` that fails later removes what it wrote there.
        MissingDataPackageError: the ``datasets`` package (speculators' preprocessed dataset) is not installed.
    """
    import json as _json

    import numpy as np
    from safetensors.torch import save

    from ..errors import MissingDataPackageError
    from ..store.reader import Dataset
    from .vocab import check_sizes, count_loss_masked_tokens, mapping_from_counts

    if precision not in ("bf16", "fp8"):
        raise InvalidArgumentError(f"precision must be 'bf16' or 'fp8' (hs-connectors' FP8 files), not {precision!r}")
    ds = dataset if isinstance(dataset, Dataset) else Dataset(dataset)
    k, hidden, separate = _planes_source(ds)
    vocab = ds.metadata.get("vocab_size")
    if draft_vocab_size is not None and not isinstance(vocab, int):
        raise IncompatibleDatasetError(
            f"{ds.manifest_path}: no vocab_size in the metadata, which the t2d mapping is sized by"
        )
    if draft_vocab_size is not None:
        check_sizes([ds], draft_vocab_size)  # before the first file (was after the last)
    try:
        import datasets
    except ImportError as e:
        raise MissingDataPackageError("datasets", "speculators' preprocessed dataset is written with it") from e
    out = os.fspath(out)
    if os.path.isdir(out) and os.listdir(out) and not overwrite:
        raise InvalidArgumentError(f"{out} is not empty (pass overwrite=True / --overwrite to replace its files)")
    footprint = layout.Footprint(out)  # new or empty unless overwrite: what a failure takes back
    try:
        hs_dir = os.path.join(out, "hidden_states")
        os.makedirs(hs_dir, exist_ok=True)
        for old in list_speculators_files(hs_dir):
            os.unlink(old[1])
        raw = Dataset(ds.manifest_path, dequantize=False) if precision == "fp8" else None
        rows: dict[str, list] = {"input_ids": [], "loss_mask": [], "seq_len": []}
        sample_ids, total, tokens = [], 0, 0
        for pos in range(len(ds)):
            item = raw[pos] if raw is not None else ds[pos]
            n = item["input_ids"].shape[0]
            tensors = {"token_ids": item["input_ids"].to(torch.int64)}
            quantized = _stored_planes(item, n, hidden, separate) if raw is not None else None
            if raw is not None and quantized is None:
                item = {**ds[pos], "input_ids": item["input_ids"], "loss_mask": item["loss_mask"]}
            if quantized is None:
                planes = item["aux_hidden_states"].reshape(n, -1, hidden)
                if separate:
                    planes = torch.cat([planes, item[PRE_NORM][:, None]], 1)
                quantized = quantize_like_speculators(planes) if precision == "fp8" else None
                if quantized is None:
                    tensors["hidden_states"] = planes.contiguous()
            if quantized is not None:
                tensors["hidden_states"], tensors[SCALES] = quantized
            data = save(tensors)
            with layout.atomic_file(speculators_path(hs_dir, pos)) as f:
                f.write(data)
            rows["input_ids"].append(item["input_ids"].tolist())
            rows["loss_mask"].append(item["loss_mask"].to(torch.int64).tolist())
            rows["seq_len"].append(n)
            sample_ids.append(ds.entry(pos).sample_id)
            total += len(data)
            tokens += n
            if progress:
                progress(pos + 1, len(ds))
        features = datasets.Features(
            {
                "input_ids": datasets.Sequence(datasets.Value("int64")),
                "loss_mask": datasets.Sequence(datasets.Value("int64")),
                "seq_len": datasets.Value("int64"),
            }
        )
        table = datasets.Dataset.from_dict(rows, features=features)
        table.set_format(type="torch")
        table.save_to_disk(out)
        counts, _ = count_loss_masked_tokens(ds, int(vocab) if isinstance(vocab, int) else _max_id(rows) + 1)
        freq = {int(t): int(counts[t]) for t in torch.nonzero(counts).flatten()}
        with layout.atomic_file(os.path.join(out, "token_freq.pt")) as f:
            torch.save(freq, f)
        if draft_vocab_size is not None:
            mapping = mapping_from_counts(counts, draft_vocab_size)
            for name, t in ((f"d2t-{draft_vocab_size}.npy", mapping.d2t), (f"t2d-{draft_vocab_size}.npy", mapping.t2d)):
                with layout.atomic_file(os.path.join(out, name)) as f:
                    np.save(f, t.numpy())
        ids = ds.metadata.get("aux_layer_ids")
        target_ids = list(ids[:k]) if ids and len(ids) >= k else None
        summary = {
            "files": len(ds),
            "bytes": total,
            "tokens": tokens,
            "out": out,
            "precision": precision,
            "target_layer_ids": target_ids,
            "draft_vocab_size": draft_vocab_size,
        }
        with layout.atomic_file(os.path.join(out, "eagle_io_export.json")) as f:
            f.write(_json.dumps({**summary, "source": ds.manifest_path, "sample_ids": sample_ids}, indent=1).encode())
    except BaseException:  # a part of an export is no result, and would refuse the retry ("is not empty")
        if not footprint.before:
            footprint.take_back_all()
        raise
    return summary


def _max_id(rows: Mapping[str, list]) -> int:
    """The largest token id of the rows (the count vector's size when the metadata has no vocab_size)."""
    return max((max(r) for r in rows["input_ids"] if r), default=0)


def speculators_path(root: str | os.PathLike[str], idx: int) -> str:
    """``root/hs_{idx}.safetensors``."""
    return os.path.join(os.fspath(root), f"hs_{idx}.safetensors")
