"""vLLM speculators interop: import and export of its offline ``hs_{i}.safetensors`` hidden-state files.

Conventions, read from speculators' code (``vllm-project/speculators`` at ``c05b95b3``):

* **On-disk record** (``scripts/data_generation_offline.py``; ``hs_connectors/.../transfer.py``:
  ``FileTransfer``): one safetensors file per sample at ``DIR/hs_{idx}.safetensors`` (``idx`` = the row of the
  preprocessed dataset), written by vLLM's hidden-states connector, holding ``token_ids [L]`` int64 and
  ``hidden_states [L, k+1, H]`` in the target dtype: the ``k`` aux layers, then the last layer's output *before*
  the final norm (``train/data.py`` splits it as ``hidden_states[:, :-1].flatten(1)`` = aux and
  ``hidden_states[:, -1]`` = ``verifier_last_hidden_states``, which its trainer passes through ``verifier_norm``).
* **Loss mask**: not in the file; it lives in the preprocessed dataset (``datasets.load_from_disk``: columns
  ``input_ids``, ``loss_mask``), whose ``input_ids`` must equal ``token_ids``.
* **FP8**: no FP8 storage exists there at that snapshot (no ``hidden_states_scales``); FP8 eagle-io datasets are
  exported dequantised.

eagle-io stores the pre-norm plane under its own name, :data:`PRE_NORM`, so export gives back the same tensors
(and, through ``safetensors.torch.save_file``, the same file bytes); ``hidden_states`` (post-norm, what eagle-io's
EAGLE-3 trainer reads) is computed at import with the target's final RMSNorm when one is given.
"""

from __future__ import annotations

import json
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

__all__ = ["PRE_NORM", "SpeculatorsImport", "TargetNorm", "export_speculators", "import_speculators"]

#: eagle-io's tensor name for the last layer's pre-norm output (speculators' last ``hidden_states`` plane).
PRE_NORM = "last_hidden_states_pre_norm"
_NAME = re.compile(r"^hs_(0|[1-9][0-9]*)\.safetensors$")
_FLOAT = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}


@dataclass(frozen=True)
class TargetNorm:
    """The target's final RMSNorm (HF ``LlamaRMSNorm`` rule): ``weight [H]`` and ``eps``."""

    weight: torch.Tensor
    eps: float

    @classmethod
    def from_checkpoint(cls, directory: str | os.PathLike[str]) -> TargetNorm:
        """Reads ``model.norm.weight`` from the checkpoint's ``*.safetensors`` and ``rms_norm_eps`` from its
        ``config.json``.

        Raises:
            InvalidArgumentError: no ``config.json`` with ``rms_norm_eps``, or no ``model.norm.weight`` tensor.
        """
        from safetensors import safe_open

        d = Path(directory)
        try:
            eps = float(json.loads((d / "config.json").read_text())["rms_norm_eps"])
        except (OSError, KeyError, ValueError, TypeError) as e:
            raise InvalidArgumentError(f"{d}: no config.json with rms_norm_eps ({type(e).__name__}: {e})") from e
        for f in sorted(d.glob("*.safetensors")):
            with safe_open(str(f), framework="pt") as st:
                if "model.norm.weight" in st.keys():  # noqa: SIM118 (safe_open has no __contains__)
                    return cls(st.get_tensor("model.norm.weight"), eps)
        raise InvalidArgumentError(f"{d}: no model.norm.weight tensor in its *.safetensors")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x [L, H]`` -> ``weight * (x / sqrt(mean(x^2) + eps))`` computed in float32, cast back to x's dtype
        before the weight (HF Llama's order), result in x's dtype."""
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.to(x.dtype) * h.to(x.dtype)).to(x.dtype)


@dataclass
class SpeculatorsImport:
    """What :func:`import_speculators` did."""

    manifest: str
    imported: int = 0
    tokens: int = 0
    hidden_size: int | None = None
    num_aux_layers: int | None = None
    dtype: str | None = None
    post_norm: bool = False

    def as_dict(self) -> dict[str, Any]:
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


def _load(path: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(token_ids [L] int64, hidden_states [L, k+1, H])`` of one file, checked.

    Raises:
        SpeculatorsFileError: unreadable, missing a tensor, or shapes / dtypes that are not speculators'.
    """
    from safetensors.torch import load_file

    try:
        data = load_file(path)
    except Exception as e:  # safetensors raises SafetensorError, OSError, ...
        raise SpeculatorsFileError(path, f"unreadable ({type(e).__name__}: {e})") from e
    missing = {"token_ids", "hidden_states"} - data.keys()
    if missing:
        raise SpeculatorsFileError(path, f"missing {sorted(missing)} (has {sorted(data)})")
    ids, hs = data["token_ids"], data["hidden_states"]
    if ids.dim() != 1 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise SpeculatorsFileError(path, f"token_ids must be an integer [L] tensor, got {ids.dtype} {list(ids.shape)}")
    if hs.dim() != 3 or hs.shape[0] != ids.shape[0] or hs.shape[1] < 2:
        raise SpeculatorsFileError(
            path, f"hidden_states shape {list(hs.shape)} is not [L={ids.shape[0]}, k+1 >= 2, H] (token_ids has L)"
        )
    if hs.dtype not in _FLOAT:
        raise SpeculatorsFileError(path, f"hidden_states dtype {hs.dtype} is not float16/bfloat16/float32")
    if ids.shape[0] and not bool(torch.isfinite(hs).all()):
        bad = int((~torch.isfinite(hs)).flatten(1).any(1).nonzero()[0, 0])
        raise SpeculatorsFileError(path, f"hidden_states has NaN/Inf values (first at token {bad})")
    return ids.to(torch.int64), hs


def import_speculators(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    loss_masks: Callable[[int, torch.Tensor], torch.Tensor] | None = None,
    all_ones_loss_mask: bool = False,
    target_norm: TargetNorm | None = None,
    metadata: Mapping[str, Any] | None = None,
    precision: str | None = None,
    shard_bytes: int = defaults.SHARD_BYTES,
    threads: int = defaults.THREADS,
    progress: Callable[[int, int], None] | None = None,
) -> SpeculatorsImport:
    """Imports speculators' ``hs_{idx}.safetensors`` files into eagle-io shards (sample id = ``idx``).

    Stored per sample: ``input_ids [L]`` int64 (= ``token_ids``), ``loss_mask [L]`` uint8,
    ``aux_hidden_states [L, k*H]`` (planes ``0..k-1`` concatenated), :data:`PRE_NORM` ``[L, H]`` (the last plane,
    bit-exact) and, with ``target_norm``, ``hidden_states [L, H]`` = ``target_norm(pre-norm plane)`` (what
    ``eagle-io train-draft`` and ``export-specforge`` read). States keep the files' dtype, or FP8 with
    ``precision="fp8"`` (then export is no longer bit-exact).

    Args:
        src: speculators' hidden-states directory (``--hidden-states-path``).
        out: new eagle-io dataset directory.
        loss_masks: ``loss_masks(idx, token_ids) -> [L]`` 0/1 mask of sample ``idx`` (from the preprocessed
            dataset; check its ``input_ids`` against ``token_ids``).
        all_ones_loss_mask: store a mask of ones instead (recorded in the metadata as ``loss_mask_source``).
        target_norm: the target's final RMSNorm (:meth:`TargetNorm.from_checkpoint`).
        metadata: merged over the inferred ``hidden_size``, ``num_aux_layers``, ``dtype``, ``source_format``.

    Raises:
        InvalidArgumentError: neither or both of ``loss_masks`` / ``all_ones_loss_mask``; no file in ``src``;
            a mask of the wrong length or not 0/1 (naming the file); a norm weight not ``[H]``.
        SpeculatorsFileError: a bad file (named), or one whose layout differs from the first file's.
    """
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
    ids0, hs0 = _load(files[0][1])
    n_planes, hidden, dtype = hs0.shape[1], hs0.shape[2], hs0.dtype
    k = n_planes - 1
    if target_norm is not None and tuple(target_norm.weight.shape) != (hidden,):
        raise InvalidArgumentError(
            f"the target norm weight has shape {list(target_norm.weight.shape)}, the files' hidden size is {hidden}"
        )
    prec = precision_name(precision)
    specs = [s for s in eagle3_schema(hidden, k, _FLOAT[dtype], prec) if s.name != "hidden_states"]
    specs.append(TensorSpec(PRE_NORM, _FLOAT[dtype], hidden, prec))
    if target_norm is not None:
        specs.append(TensorSpec("hidden_states", _FLOAT[dtype], hidden, prec))
    meta: dict[str, Any] = {
        "source_format": "vllm-speculators hs_{i}.safetensors",
        "hidden_size": hidden,
        "num_aux_layers": k,
        "dtype": _FLOAT[dtype],
        "loss_mask_source": "all ones" if all_ones_loss_mask else "preprocessed dataset",
    }
    if target_norm is not None:
        meta["hidden_states_post_norm"] = True
    meta.update(metadata or {})
    summary = SpeculatorsImport(
        manifest="", hidden_size=hidden, num_aux_layers=k, dtype=_FLOAT[dtype], post_norm=target_norm is not None
    )
    with ShardWriter(out, specs, meta, shard_bytes=shard_bytes, threads=threads) as writer:
        for done, (idx, path) in enumerate(files, 1):
            ids, hs = (ids0, hs0) if done == 1 else _load(path)
            if hs.shape[1:] != hs0.shape[1:] or hs.dtype != dtype:
                raise SpeculatorsFileError(
                    path,
                    f"hidden_states {list(hs.shape[1:])} {hs.dtype} per token differs from the first file's "
                    f"{list(hs0.shape[1:])} {dtype} ({files[0][1]})",
                )
            n = ids.shape[0]
            if all_ones_loss_mask:
                mask = torch.ones(n, dtype=torch.uint8)
            else:
                mask = torch.as_tensor(loss_masks(idx, ids))  # type: ignore[misc]
                if mask.shape != (n,) or mask.dtype.is_floating_point or not bool(((mask == 0) | (mask == 1)).all()):
                    raise InvalidArgumentError(
                        f"{path}: its loss mask ({mask.dtype} {list(mask.shape)}) is not 0/1 of length {n}"
                    )
                mask = mask.to(torch.uint8)
            pre = hs[:, -1].contiguous()
            sample = {
                "input_ids": ids.contiguous(),
                "loss_mask": mask.contiguous(),
                "aux_hidden_states": hs[:, :-1].reshape(n, k * hidden).contiguous(),
                PRE_NORM: pre,
            }
            if target_norm is not None:
                sample["hidden_states"] = target_norm(pre).contiguous()
            writer.write(idx, sample, key=os.path.basename(path))
            summary.imported += 1
            summary.tokens += n
            if progress:
                progress(done, len(files))
    summary.manifest = writer.manifest_path
    return summary


def speculators_path(root: str | os.PathLike[str], idx: int) -> str:
    """``root/hs_{idx}.safetensors``."""
    return os.path.join(os.fspath(root), f"hs_{idx}.safetensors")


def export_speculators(
    dataset: Any,
    out: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Writes an eagle-io dataset as speculators' ``hs_{sample_id}.safetensors`` files (each atomically):
    ``token_ids [L]`` int64 and ``hidden_states [L, k+1, H]`` = the ``k`` aux blocks then the :data:`PRE_NORM`
    plane, in the dataset's dtype (FP8 tensors dequantised), via ``safetensors.torch.save``. The loss masks are
    not written (speculators reads them from its preprocessed dataset).

    Returns:
        ``{"files": n, "bytes": total file bytes, "tokens": n_tokens, "out": out}``.

    Raises:
        IncompatibleDatasetError: the dataset has no :data:`PRE_NORM` tensor (e.g. it holds only the post-norm
            ``hidden_states``, which cannot be turned back into the pre-norm plane speculators stores), or its
            aux width is not a multiple of the pre-norm width.
        InvalidArgumentError: an output file exists and ``overwrite`` is False.
    """
    from safetensors.torch import save

    from ..store.eagle3 import require_tensors
    from ..store.reader import Dataset

    ds = dataset if isinstance(dataset, Dataset) else Dataset(dataset)
    specs = {s.name: s for s in ds.schema}
    if PRE_NORM not in specs:
        raise IncompatibleDatasetError(
            f"{ds.manifest_path}: no {PRE_NORM!r} tensor; speculators stores the last layer's pre-norm output, and "
            "post-norm hidden_states cannot be un-normalised exactly (datasets from import-speculators have it)"
        )
    require_tensors(ds, ("input_ids", "aux_hidden_states"), "export-speculators")
    hidden, aux = specs[PRE_NORM].width, specs["aux_hidden_states"].width
    if not hidden or not aux or aux % hidden:
        raise IncompatibleDatasetError(
            f"{ds.manifest_path}: aux_hidden_states width {aux} is not a multiple of {PRE_NORM} width {hidden}"
        )
    out = os.fspath(out)
    os.makedirs(out, exist_ok=True)
    total = tokens = 0
    for pos in range(len(ds)):
        sid = ds.entry(pos).sample_id
        path = speculators_path(out, sid)
        if not overwrite and os.path.exists(path):
            raise InvalidArgumentError(f"{path} exists (pass overwrite=True / --overwrite to replace it)")
        item = ds[pos]
        n = item["input_ids"].shape[0]
        planes = torch.cat([item["aux_hidden_states"].reshape(n, aux // hidden, hidden), item[PRE_NORM][:, None]], 1)
        data = save({"hidden_states": planes.contiguous(), "token_ids": item["input_ids"].to(torch.int64)})
        with layout.atomic_file(path) as f:
            f.write(data)
        total += len(data)
        tokens += n
        if progress:
            progress(pos + 1, len(ds))
    return {"files": len(ds), "bytes": total, "tokens": tokens, "out": out}
