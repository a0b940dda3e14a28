"""SpecForge compatibility: its offline EAGLE-3 sample dict, and import/export of its ``.ckpt`` files.

Conventions, read from SpecForge's code (``sgl-project/SpecForge``, v0.2.0 on PyPI and ``main``):

* **On-disk record** (``scripts/prepare_hidden_states.py``: ``HiddenStatesGenerator._save_tensor_sync``,
  ``_get_file_path``; the key names from ``OfflineCaptureLayout`` in
  ``specforge/algorithms/common/providers.py``): one ``torch.save`` dict per sample, optionally written through
  ``gzip.open(..., compresslevel=6)``, at ``DIR/rows_{g}-{g+2000}/data_{idx}.ckpt[.gz]`` with
  ``g = idx // 2000 * 2000``. Keys: ``input_ids [L]`` int64, ``loss_mask [L]`` int64 (0/1),
  ``aux_hidden_state [1, L, k*H]`` and ``hidden_state [1, L, H]`` (the final *post-norm* state) in the
  target dtype. No index, checksum or metadata; NaN samples are skipped at write time with a print.
* **Loading** (``specforge/runtime/data_plane/feature_store.py``: ``load_feature_file``;
  ``specforge/data/preprocessing.py``: ``OfflineEagle3Dataset._open_file``): ``torch.load(path, mmap=True)``
  or gzip fully inflated then ``torch.load``; files listed by ``os.walk`` and sorted as strings.
* **Per-sample dict the trainer consumes** (``specforge/algorithms/eagle3/data.py``:
  ``normalize_offline_sample``; identical output to ``OfflineEagle3Dataset.process_data``):
  ``input_ids [1, L']`` int64, ``loss_mask [1, L']`` (stored dtype, int64) with ``loss_mask[0, -1] = 0``,
  ``attention_mask [1, L']`` int64 ones, ``hidden_state [1, L', k*H]`` (= the stored *aux* states),
  ``target [1, L', H]`` (= the stored final state), ``L' = min(L, max_len)``. The names swap on purpose:
  SpecForge trains on ``hidden_state`` = aux states and builds the teacher from ``target`` = final state.

eagle-io's EAGLE-3 schema holds the same tensors as ``input_ids [L]`` int64, ``loss_mask [L]`` uint8,
``aux_hidden_states [L, k*H]``, ``hidden_states [L, H]``; the conversions here are bit-exact both ways.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import defaults
from ..errors import InvalidArgumentError, SpecForgeFileError
from ..store import layout

__all__ = [
    "FILE_GROUP_SIZE",
    "SPECFORGE_KEYS",
    "ImportSummary",
    "SpecForgeDataset",
    "SpecForgeFileError",
    "export_specforge",
    "from_specforge_record",
    "import_specforge",
    "list_specforge_files",
    "load_specforge_file",
    "normalize_offline_sample",
    "specforge_path",
    "to_specforge_record",
]

#: Keys of one SpecForge offline EAGLE-3 file, in the order ``OfflineCaptureLayout.output_names`` gives.
SPECFORGE_KEYS = ("input_ids", "loss_mask", "aux_hidden_state", "hidden_state")
#: Files per ``rows_{g}-{g+N}`` directory (``HiddenStatesGenerator(file_group_size=2000)``).
FILE_GROUP_SIZE = 2000
#: SpecForge's gzip level (``HiddenStatesGenerator(compression_level=6)``).
GZIP_LEVEL = 6

_NAME = re.compile(r"^data_(0|[1-9][0-9]*)\.ckpt(\.gz)?$")
_FLOAT_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}


# --- the sample dict SpecForge's trainer consumes ------------------------------------------------------


def to_specforge_record(item: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """One eagle-io sample -> the dict SpecForge's ``prepare_hidden_states.py`` saves for it.

    Args:
        item: ``input_ids [L]`` int64, ``loss_mask [L]`` (any integer/bool dtype, 0/1),
            ``aux_hidden_states [L, k*H]``, ``hidden_states [L, H]`` (e.g. ``eagle_io.Dataset()[pos]``).

    Returns:
        ``input_ids [L]`` int64, ``loss_mask [L]`` int64, ``aux_hidden_state [1, L, k*H]`` and
        ``hidden_state [1, L, H]`` in the stored dtype (views of ``item``'s tensors where possible; no
        value is rounded).
    """
    return {
        "input_ids": item["input_ids"].to(torch.int64),
        "loss_mask": item["loss_mask"].to(torch.int64),
        "aux_hidden_state": item["aux_hidden_states"].unsqueeze(0),
        "hidden_state": item["hidden_states"].unsqueeze(0),
    }


def normalize_offline_sample(raw: Mapping[str, torch.Tensor], max_len: int = 2048) -> dict[str, torch.Tensor]:
    """SpecForge's per-sample training dict from one raw record (its ``normalize_offline_sample``).

    Behaviour matches ``specforge/algorithms/eagle3/data.py::normalize_offline_sample`` (and
    ``specforge/data/preprocessing.py::OfflineEagle3Dataset.process_data``), checked against the real
    function in ``tests/test_specforge.py`` when SpecForge is installed.

    Args:
        raw: a record as :func:`to_specforge_record` / :func:`load_specforge_file` return it.
        max_len: truncation length (SpecForge's ``--max-length``, default 2048).

    Returns:
        ``{"attention_mask": [1, L'] int64 ones, "loss_mask": [1, L'] (raw dtype, last entry 0),
        "target": [1, L', H], "hidden_state": [1, L', k*H], "input_ids": [1, L'] int64}`` with
        ``L' = min(L, max_len)``. ``loss_mask`` is a copy; the others are views of ``raw``.
    """
    aux = raw["aux_hidden_state"]
    final = raw["hidden_state"]
    aux = (aux[0] if aux.dim() == 3 else aux)[:max_len]
    final = (final[0] if final.dim() == 3 else final)[:max_len]
    mask = raw["loss_mask"][:max_len].clone()
    if mask.numel():
        mask[-1] = 0
    mask = mask.unsqueeze(0)
    return {
        "attention_mask": torch.ones(mask.shape, dtype=torch.long),
        "loss_mask": mask,
        "target": final.unsqueeze(0),
        "hidden_state": aux.unsqueeze(0),
        "input_ids": raw["input_ids"][:max_len].unsqueeze(0),
    }


class SpecForgeDataset(torch.utils.data.Dataset):
    """An eagle-io dataset served as SpecForge's offline EAGLE-3 dataset.

    ``ds[i]`` is exactly what SpecForge's ``OfflineEagle3Dataset.__getitem__`` (or its ``FeatureDataLoader``
    with ``normalize_offline_sample``) yields for the same sample stored as a ``.ckpt`` file: see
    :func:`normalize_offline_sample`. Batch with SpecForge's ``DataCollatorWithPadding`` unchanged.

    Args:
        dataset: an :class:`eagle_io.Dataset`, or a path to open one.
        max_len: SpecForge's ``max_len`` (default 2048).
        transform: optional callable applied to each dict (SpecForge's ``transform``).
    """

    def __init__(
        self,
        dataset: Any,
        max_len: int = 2048,
        transform: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None,
    ) -> None:
        from ..store.reader import Dataset

        self.dataset = dataset if isinstance(dataset, Dataset) else Dataset(dataset)
        self.max_len = max_len
        self.transform = transform

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        out = normalize_offline_sample(to_specforge_record(self.dataset[index]), self.max_len)
        return self.transform(out) if self.transform else out


# --- files --------------------------------------------------------------------------------------------


def specforge_path(
    root: str | os.PathLike[str], idx: int, *, gzip: bool = False, group_size: int = FILE_GROUP_SIZE
) -> str:
    """``root/rows_{g}-{g+group_size}/data_{idx}.ckpt[.gz]``, ``g = idx // group_size * group_size``
    (``prepare_hidden_states.py``: ``HiddenStatesGenerator._get_file_path``)."""
    g = idx // group_size * group_size
    return os.path.join(os.fspath(root), f"rows_{g}-{g + group_size}", f"data_{idx}.ckpt{'.gz' if gzip else ''}")


def list_specforge_files(root: str | os.PathLike[str]) -> tuple[list[tuple[int, str]], list[tuple[str, str]]]:
    """Finds SpecForge feature files under ``root`` (recursively, like its ``list_local_files``).

    Returns:
        ``(files, unnamed)``: ``files`` is ``[(idx, path)]`` sorted by ``idx`` for every
        ``data_{idx}.ckpt[.gz]``; ``unnamed`` is ``[(path, reason)]`` for ``.ckpt[.gz]`` files whose name
        carries no index (SpecForge would load them; eagle-io cannot give them a sample id).

    Raises:
        SpecForgeFileError: two files with the same index (e.g. ``data_5.ckpt`` and ``data_5.ckpt.gz``),
            naming both.
        InvalidArgumentError: ``root`` is not a directory.
    """
    root = os.fspath(root)
    if not os.path.isdir(root):
        raise InvalidArgumentError(f"{root}: not a directory of SpecForge .ckpt files")
    seen: dict[int, str] = {}
    unnamed: list[tuple[str, str]] = []
    for dirpath, dirnames, names in os.walk(root):
        dirnames.sort()
        for name in sorted(names):
            if not name.endswith((".ckpt", ".ckpt.gz")):
                continue
            path = os.path.join(dirpath, name)
            m = _NAME.match(name)
            if m is None:
                unnamed.append((path, "file name is not data_{idx}.ckpt[.gz]"))
                continue
            idx = int(m.group(1))
            if idx in seen:
                raise SpecForgeFileError(path, f"sample index {idx} also stored in {seen[idx]}")
            seen[idx] = path
    return sorted(seen.items()), unnamed


def load_specforge_file(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Loads one SpecForge file (``.ckpt`` memory-mapped, ``.ckpt.gz`` inflated, gzip CRC checked) with
    ``torch.load(weights_only=True)``: a file that needs arbitrary unpickling is refused.

    Raises:
        SpecForgeFileError: unreadable, truncated, not a dict of tensors, or a bad gzip stream.
    """
    path = os.fspath(path)
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                data = f.read()
            obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        else:
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # torch.load raises many types (RuntimeError, UnpicklingError, EOFError...)
        raise SpecForgeFileError(path, f"unreadable ({type(e).__name__}: {e})") from e
    if not isinstance(obj, dict):
        raise SpecForgeFileError(path, f"holds a {type(obj).__name__}, expected a dict of tensors")
    return obj


@dataclass
class _Layout:
    width_aux: int
    width_final: int
    dtype: torch.dtype


def _check_record(path: str, raw: Mapping[str, Any], layout: _Layout | None) -> tuple[dict[str, torch.Tensor], _Layout]:
    """Validates one raw record; returns the eagle-io sample and the layout it implies."""
    missing = [k for k in SPECFORGE_KEYS if k not in raw]
    if missing:
        raise SpecForgeFileError(path, f"missing keys {missing} (has {sorted(raw)})")
    for k in SPECFORGE_KEYS:
        if not isinstance(raw[k], torch.Tensor):
            raise SpecForgeFileError(path, f"{k} is a {type(raw[k]).__name__}, not a tensor")
    ids, mask, aux, fin = (raw[k] for k in SPECFORGE_KEYS)
    if ids.dim() != 1 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise SpecForgeFileError(path, f"input_ids must be an integer [L] tensor, got {ids.dtype} {list(ids.shape)}")
    n = ids.shape[0]
    if mask.dim() != 1 or mask.shape[0] != n:
        raise SpecForgeFileError(path, f"loss_mask shape {list(mask.shape)} does not match input_ids [{n}]")
    if mask.dtype.is_floating_point or (n and not bool(((mask == 0) | (mask == 1)).all())):
        raise SpecForgeFileError(path, f"loss_mask must hold integers 0/1 (dtype {mask.dtype})")
    states = {}
    for name, t in (("aux_hidden_state", aux), ("hidden_state", fin)):
        if t.dim() == 3 and t.shape[0] == 1:
            t = t[0]
        if t.dim() != 2 or t.shape[0] != n:
            raise SpecForgeFileError(
                path, f"{name} shape {list(raw[name].shape)} does not match [1, {n}, width] (input_ids has {n} tokens)"
            )
        if t.dtype not in _FLOAT_DTYPES:
            raise SpecForgeFileError(path, f"{name} dtype {t.dtype} is not float16/bfloat16/float32")
        states[name] = t
    aux, fin = states["aux_hidden_state"], states["hidden_state"]
    if aux.dtype != fin.dtype:
        raise SpecForgeFileError(path, f"aux_hidden_state is {aux.dtype} but hidden_state is {fin.dtype}")
    if fin.shape[1] == 0 or aux.shape[1] == 0 or aux.shape[1] % fin.shape[1]:  # width 0 first: no modulo by 0
        raise SpecForgeFileError(
            path, f"aux_hidden_state width {aux.shape[1]} is not a multiple of hidden_state width {fin.shape[1]}"
        )
    here = _Layout(aux.shape[1], fin.shape[1], aux.dtype)
    if layout is not None and here != layout:
        raise SpecForgeFileError(
            path,
            f"layout aux width {here.width_aux}, hidden width {here.width_final}, {here.dtype} differs from the "
            f"dataset's aux width {layout.width_aux}, hidden width {layout.width_final}, {layout.dtype}",
        )
    for name, t in (("aux_hidden_state", aux), ("hidden_state", fin)):
        if n and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).any(dim=1).nonzero()[0, 0])
            raise SpecForgeFileError(path, f"{name} has NaN/Inf values (first at token {bad})")
    sample = {
        "input_ids": ids.to(torch.int64).contiguous(),
        "loss_mask": mask.to(torch.uint8).contiguous(),
        "aux_hidden_states": aux.contiguous(),
        "hidden_states": fin.contiguous(),
    }
    return sample, here


def from_specforge_record(path: str, raw: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Validates a SpecForge record and converts it to an eagle-io sample (bit-exact states).

    Raises:
        SpecForgeFileError: missing keys, non-tensors, lengths that disagree, non-0/1 loss mask,
            non-float or mismatched state dtypes, an aux width not a multiple of the hidden width,
            NaN/Inf states. The message names ``path``.
    """
    return _check_record(path, raw, None)[0]


@dataclass
class ImportSummary:
    """What :func:`import_specforge` did. ``skipped`` lists ``(path, reason)`` for every file not imported."""

    manifest: str
    imported: int = 0
    tokens: int = 0
    gzip_files: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    hidden_size: int | None = None
    num_aux_layers: int | None = None
    dtype: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "manifest": self.manifest,
            "imported": self.imported,
            "tokens": self.tokens,
            "gzip_files": self.gzip_files,
            "skipped": len(self.skipped),
            "skipped_files": [{"path": p, "reason": r} for p, r in self.skipped],
            "hidden_size": self.hidden_size,
            "num_aux_layers": self.num_aux_layers,
            "dtype": self.dtype,
        }


def import_specforge(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    metadata: Mapping[str, Any] | None = None,
    skip_bad: bool = False,
    shard_bytes: int = defaults.SHARD_BYTES,
    threads: int = defaults.THREADS,
    zstd_level: int = defaults.ZSTD_LEVEL,
    progress: Callable[[int, int], None] | None = None,
) -> ImportSummary:
    """Imports a SpecForge offline EAGLE-3 directory (``.ckpt`` / ``.ckpt.gz``) into eagle-io shards.

    Every file is loaded with ``weights_only=True`` and verified (:func:`from_specforge_record`), and all
    files must share one layout (aux width, hidden width, dtype; the first file fixes it). Sample ids are
    the ``idx`` of ``data_{idx}.ckpt``; samples are written in ascending ``idx``; each sample's key is its
    file path relative to ``src``. States are stored bit-exact; ``loss_mask`` becomes uint8.

    Args:
        src: SpecForge output directory (``--output-path`` of ``prepare_hidden_states.py``).
        out: new eagle-io dataset directory.
        metadata: facts SpecForge files do not carry (``target_model``, ``num_layers``, ``vocab_size``,
            ``aux_layer_ids`` in eagle-io's convention, ``tokenizer``...); merged over the inferred
            ``hidden_size``, ``num_aux_layers``, ``dtype``, ``hidden_states_post_norm`` and ``source_format``.
        skip_bad: count and list unreadable/inconsistent files (and files named without an index) in
            ``ImportSummary.skipped`` instead of raising.
        shard_bytes, threads, zstd_level: :class:`eagle_io.ShardWriter` options (defaults: :mod:`eagle_io.defaults`).
        progress: called as ``progress(done, total)`` after each file.

    Returns:
        :class:`ImportSummary`.

    Raises:
        SpecForgeFileError: (without ``skip_bad``) the first bad file, by path; duplicate indexes always.
        InvalidArgumentError: ``src`` holds no importable file; ``metadata["aux_layer_ids"]`` that are not one id per
            stored ``H``-wide aux block, or not layers of a ``metadata["num_layers"]``-layer target (nothing is
            written then).
    """
    from ..store.eagle3 import AUX_LAYER_CONVENTION
    from ..store.layout import Footprint
    from ..store.schema import eagle3_schema
    from ..store.writer import ShardWriter

    src = os.fspath(src)
    files, unnamed = list_specforge_files(src)
    if unnamed and not skip_bad:
        raise SpecForgeFileError(unnamed[0][0], unnamed[0][1])
    skipped: list[tuple[str, str]] = list(unnamed)
    # The first readable, consistent file fixes the layout (and so the schema).
    layout: _Layout | None = None
    first: tuple[int, str, dict[str, torch.Tensor]] | None = None
    pos = 0
    while layout is None and pos < len(files):
        idx, path = files[pos]
        pos += 1
        try:
            sample, layout = _check_record(path, load_specforge_file(path), None)
            first = (idx, path, sample)
        except SpecForgeFileError as e:
            if not skip_bad:
                raise
            skipped.append((path, e.reason))
    if first is None or layout is None:
        raise InvalidArgumentError(
            f"{src}: no importable SpecForge file (found {len(files)} data_*.ckpt[.gz], {len(skipped)} skipped)"
        )
    hidden, k = layout.width_final, layout.width_aux // layout.width_final
    _check_recorded_ids(metadata or {}, layout.width_aux, hidden, files[pos - 1][1])
    dtype = _FLOAT_DTYPES[layout.dtype]
    meta: dict[str, Any] = {
        "source_format": "specforge-offline-eagle3 (rows_*/data_{idx}.ckpt[.gz])",
        "hidden_size": hidden,
        "num_aux_layers": k,
        "dtype": dtype,
        "hidden_states_post_norm": True,
    }
    meta.update(metadata or {})
    if meta.get("aux_layer_ids") is not None:
        meta.setdefault("aux_layer_convention", AUX_LAYER_CONVENTION)
    summary = ImportSummary(manifest="", hidden_size=hidden, num_aux_layers=k, dtype=dtype, skipped=skipped)

    def records() -> Iterator[tuple[int, str, dict[str, torch.Tensor]]]:
        yield first
        for idx, path in files[pos:]:
            try:
                yield idx, path, _check_record(path, load_specforge_file(path), layout)[0]
            except SpecForgeFileError as e:
                if not skip_bad:
                    raise
                skipped.append((path, e.reason))

    footprint = Footprint(out)
    writer = ShardWriter(
        out, eagle3_schema(hidden, k, dtype), meta, shard_bytes=shard_bytes, threads=threads, zstd_level=zstd_level
    )
    try:
        with writer:
            for done, (idx, path, sample) in enumerate(records(), 1):
                writer.write(idx, sample, key=os.path.relpath(path, src))
                summary.imported += 1
                summary.tokens += int(sample["input_ids"].shape[0])
                summary.gzip_files += path.endswith(".gz")
                if progress:
                    progress(done + len(skipped), len(files) + len(unnamed))
    except BaseException:  # an import is not resumed: the part written is no result, and would refuse the retry
        footprint.take_back_dataset()
        raise
    summary.manifest = writer.manifest_path
    return summary


def _check_recorded_ids(metadata: Mapping[str, Any], aux_width: int, hidden: int, first: str) -> None:
    """The ``aux_layer_ids`` a SpecForge import records must describe the stored states: one id per ``hidden``-wide
    block of ``aux_hidden_state`` (``k = aux_width / hidden``), each a layer of the target when ``num_layers`` is
    recorded (:func:`eagle_io.store.eagle3.validate_aux_layer_ids`, id ``N`` allowed: the final boundary).

    Raises:
        InvalidArgumentError: naming the stored width, the ids and the file that fixed the layout.
    """
    from ..store.eagle3 import validate_aux_layer_ids

    ids = metadata.get("aux_layer_ids")
    if ids is None:
        return
    n = metadata.get("num_layers")
    validate_aux_layer_ids(list(ids), n if isinstance(n, int) else None, final_boundary=True)
    if len(ids) * hidden != aux_width:
        raise InvalidArgumentError(
            f"aux_layer_ids {list(ids)} name {len(ids)} layers, but the SpecForge files store aux_hidden_state "
            f"{aux_width} wide = {aux_width // hidden} x hidden {hidden} ({first}): record the "
            f"{aux_width // hidden} layers the states came from"
        )


def _save(record: Mapping[str, torch.Tensor], path: str, use_gzip: bool, level: int) -> int:
    """Writes one record atomically (:func:`eagle_io.store.layout.atomic_file`); returns its size in bytes."""
    with layout.atomic_file(path) as f:
        if use_gzip:
            # mtime=0: the same sample always gives the same bytes.
            with gzip.GzipFile(filename="", mode="wb", fileobj=f, compresslevel=level, mtime=0) as gz:
                torch.save(dict(record), gz)
        else:
            torch.save(dict(record), f)
    return os.path.getsize(path)


def export_specforge(
    dataset: Any,
    out: str | os.PathLike[str],
    *,
    gzip: bool = False,
    compresslevel: int = GZIP_LEVEL,
    group_size: int = FILE_GROUP_SIZE,
    overwrite: bool = False,
    draft_vocab_size: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Writes an eagle-io dataset in SpecForge's offline layout, for its trainer unchanged.

    Sample ``s`` (id ``s.sample_id``) goes to ``out/rows_{g}-{g+group_size}/data_{s.sample_id}.ckpt[.gz]``
    (:func:`specforge_path`) as :func:`to_specforge_record` gives it, each file written atomically. Train
    with SpecForge's ``--train-hidden-states-path out``. Note SpecForge orders files by path *string*
    (``data_10`` before ``data_2``), not by id.

    Args:
        dataset: an :class:`eagle_io.Dataset` or a path to one.
        out: output directory (created).
        gzip: write ``.ckpt.gz`` (gzip level ``compresslevel``, SpecForge's ``--compress``).
        overwrite: replace existing files; otherwise an existing ``data_{idx}.ckpt[.gz]`` (either suffix)
            is an error naming it.
        draft_vocab_size: also write ``out/vocab_mapping/vocab_mapping.pt``, eagle-io's mapping of that size
            (:func:`eagle_io.interop.vocab.build_vocab_mapping`, what ``eagle-io vocab-map`` writes: ``d2t``, ``t2d``
            and its key), for SpecForge's ``model.vocab_mapping_path`` (its ``load_vocab_mapping`` reads it), so it
            trains with the mapping eagle-io's tools use instead of deriving its own. SpecForge lists only
            ``.ckpt[.gz]`` files as features, so the file beside them is not read as a sample.

    Returns:
        ``{"files": n, "bytes": total file bytes, "tokens": n_tokens, "out": out}``, plus ``"vocab_mapping"``
        (its path) with ``draft_vocab_size``.

    Raises:
        InvalidArgumentError: an output file exists and ``overwrite`` is False; a ``draft_vocab_size`` outside
            ``[1, vocab_size]`` or a dataset without a recorded ``vocab_size``. Both are checked before any file is
            written; an export that fails later (a record that does not read) removes the files and directories it
            created (a file it replaced under ``overwrite`` stays replaced).
        IncompatibleDatasetError: the dataset's schema lacks an EAGLE-3 tensor or contradicts its metadata.
    """
    from ..store.eagle3 import check_eagle3_dataset
    from ..store.reader import Dataset
    from .vocab import build_vocab_mapping, check_sizes

    ds = dataset if isinstance(dataset, Dataset) else Dataset(dataset)
    check_eagle3_dataset(ds, "export-specforge")
    # Everything that can refuse the export is checked before its first file (the vocab sizes were checked after the
    # last, an existing file of a later sample when its turn came: both left a part behind).
    if draft_vocab_size is not None:
        check_sizes([ds], draft_vocab_size)
    out = os.fspath(out)
    ids = [ds.entry(pos).sample_id for pos in range(len(ds))]
    paths = [specforge_path(out, sid, gzip=gzip, group_size=group_size) for sid in ids]
    others = [specforge_path(out, sid, gzip=not gzip, group_size=group_size) for sid in ids]
    held = [p for p in (*paths, *others) if os.path.exists(p)]
    if held and not overwrite:
        more = f" (and {len(held) - 1} more of this export's files)" if len(held) > 1 else ""
        raise InvalidArgumentError(f"{held[0]} exists{more} (pass overwrite=True / --overwrite to replace it)")
    made: list[str] = []  # the files and directories this export created, taken back if it fails
    d = Path(os.path.abspath(out))
    while not d.exists() and d != d.parent:
        made.append(str(d))
        d = d.parent
    total_bytes = tokens = 0
    n = len(ds)
    try:
        os.makedirs(out, exist_ok=True)
        for pos, (path, other) in enumerate(zip(paths, others, strict=True)):
            if os.path.exists(other):  # overwrite: the other suffix of the same sample goes
                os.unlink(other)
            if not os.path.isdir(os.path.dirname(path)):
                os.makedirs(os.path.dirname(path))
                made.append(os.path.dirname(path))
            if not os.path.exists(path):
                made.append(path)
            item = ds[pos]
            total_bytes += _save(to_specforge_record(item), path, gzip, compresslevel)
            tokens += int(item["input_ids"].shape[0])
            if progress:
                progress(pos + 1, n)
        res: dict[str, Any] = {"files": n, "bytes": total_bytes, "tokens": tokens, "out": out}
        if draft_vocab_size is not None:
            path = os.path.join(out, "vocab_mapping", "vocab_mapping.pt")
            made += [] if os.path.isdir(os.path.dirname(path)) else [os.path.dirname(path)]
            build_vocab_mapping(ds.manifest_path, draft_vocab_size).save(path)
            res["vocab_mapping"] = path
    except BaseException:  # a part of an export is no result, and its files would refuse the retry
        for p in sorted(made, key=len, reverse=True):  # files before their directories
            with contextlib.suppress(OSError):
                if os.path.isdir(p):
                    os.rmdir(p)  # only when empty
                else:
                    os.unlink(p)
        raise
    return res
