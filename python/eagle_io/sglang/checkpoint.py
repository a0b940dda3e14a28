"""Read what serving checks need from checkpoint directories: ``config.json`` and safetensors *headers*.

No weight is ever loaded: a safetensors file starts with an 8-byte little-endian header length ``N``
followed by ``N`` bytes of JSON (``{name: {"dtype", "shape", "data_offsets"}, "__metadata__": {...}}``,
the format defined by the ``safetensors`` project, ``docs/`` "Format"); only those ``8 + N`` bytes are read, plus
the bytes of the vocab maps (``d2t``, ``t2d``: a few MB at most) whose values the serving check needs
(:func:`read_tensor_values`, which also reads a target's head tensors for :mod:`eagle_io.capturing.weights`).
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CheckpointError

__all__ = [
    "MAX_HEADER_BYTES",
    "MAX_VALUE_BYTES",
    "CheckpointError",
    "CheckpointInfo",
    "DraftInfo",
    "TensorHeader",
    "checkpoint_dir",
    "read_checkpoint",
    "read_draft",
    "read_safetensors_header",
    "read_tensor_values",
]

MAX_HEADER_BYTES = 100 << 20
"""Largest safetensors JSON header accepted (the safetensors library's own limit is 100 MB)."""


@dataclass(frozen=True)
class TensorHeader:
    """One tensor's entry in a safetensors header: ``dtype`` as safetensors spells it (``"BF16"``, ``"I64"``,
    ``"BOOL"``...), ``shape``, the file's name, and ``start``/``end``: absolute byte offsets of its data in that file
    (``8 + header length + data_offsets``)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str
    start: int = 0
    end: int = 0


def read_safetensors_header(path: str | os.PathLike[str]) -> dict[str, TensorHeader]:
    """Tensor name -> :class:`TensorHeader` from one ``.safetensors`` file, reading only its header.

    Raises:
        CheckpointError: file shorter than 8 bytes, header length beyond the file or over
            :data:`MAX_HEADER_BYTES`, header not a JSON object, or an entry without ``dtype``/``shape``.
    """
    p = Path(path)
    try:
        with open(p, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(
                    f"{p}: not a safetensors file ({len(head)} bytes, need an 8-byte header length)", p
                )
            (n,) = struct.unpack("<Q", head)
            size = os.fstat(f.fileno()).st_size
            if n > MAX_HEADER_BYTES or 8 + n > size:
                raise CheckpointError(
                    f"{p}: safetensors header length {n} is invalid for a {size}-byte file "
                    f"(limit {MAX_HEADER_BYTES}); the file is truncated or not safetensors",
                    p,
                )
            raw = f.read(n)
    except OSError as e:
        raise CheckpointError(f"{p}: cannot read: {e}", p) from e
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{p}: safetensors header is not JSON: {e}", p) from e
    if not isinstance(header, dict):
        raise CheckpointError(f"{p}: safetensors header is a {type(header).__name__}, expected an object", p)
    out: dict[str, TensorHeader] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict) or "dtype" not in entry or not isinstance(entry.get("shape"), list):
            raise CheckpointError(f"{p}: safetensors header entry {name!r} has no dtype/shape", p)
        offs = entry.get("data_offsets")
        a, b = (int(offs[0]), int(offs[1])) if isinstance(offs, list) and len(offs) == 2 else (0, 0)
        shape = tuple(int(d) for d in entry["shape"])
        out[name] = TensorHeader(name, str(entry["dtype"]), shape, p.name, 8 + n + a, 8 + n + b)
    return out


_VALUE_DTYPES = {"I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
                 "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn",
                 "F8_E5M2": "float8_e5m2"}  # fmt: skip
MAX_VALUE_BYTES = 64 << 20
"""Largest tensor :func:`read_tensor_values` reads by default (vocab maps are a few MB; the serving checks never read a
weight)."""


def read_tensor_values(
    directory: str | os.PathLike[str], header: TensorHeader, *, max_bytes: int | None = MAX_VALUE_BYTES
) -> Any:
    """The values of one tensor, reading only its bytes (positioned reads into one buffer of its size: no memory map,
    so a shard hundreds of GB large costs what the tensor costs).

    Args:
        max_bytes: the largest tensor read (default :data:`MAX_VALUE_BYTES`, for the vocab maps ``d2t`` / ``t2d``);
            None: any size (a target's embedding or ``lm_head``).

    Returns:
        An N-D CPU ``torch.Tensor`` of ``header.shape`` in the stored dtype (``I64`` -> ``torch.int64``,
        ``BOOL`` -> ``torch.bool``, ``F32`` -> ``torch.float32``, ``F8_E4M3`` -> ``torch.float8_e4m3fn``...).

    Raises:
        CheckpointError: the tensor is larger than ``max_bytes``, its dtype is not one of
            ``I64 I32 I16 I8 U8 BOOL F64 F32 F16 BF16 F8_E4M3 F8_E5M2``, its byte range does not match its shape, or
            the file cannot be read.
    """
    import torch

    path = Path(directory) / header.file
    size = header.end - header.start
    dtype = _VALUE_DTYPES.get(header.dtype)
    if dtype is None:
        raise CheckpointError(f"{path}: tensor {header.name!r} has dtype {header.dtype}, which is not read", path)
    tdtype = getattr(torch, dtype)
    count = 1
    for d in header.shape:
        count *= d
    if (max_bytes is not None and size > max_bytes) or size != count * torch.empty((), dtype=tdtype).element_size():
        raise CheckpointError(
            f"{path}: tensor {header.name!r} ({header.dtype} {list(header.shape)}) spans {size} bytes: not read "
            f"(too large, or its byte range does not match its shape)",
            path,
        )
    buf = bytearray(size)
    try:
        with open(path, "rb", buffering=0) as f:
            f.seek(header.start)
            got, view = 0, memoryview(buf)
            while got < size and (n := f.readinto(view[got:])):
                got += n
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read: {e}", path) from e
    if got != size:
        raise CheckpointError(f"{path}: tensor {header.name!r} is truncated ({got} of {size} bytes)", path)
    if size == 0:
        return torch.empty(header.shape, dtype=tdtype)
    return torch.frombuffer(buf, dtype=tdtype).reshape(header.shape)


def _load_json(path: Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError as e:
        raise CheckpointError(f"{path}: not found", path) from e
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: cannot read JSON: {e}", path) from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, found {type(data).__name__}", path)
    return data


def checkpoint_dir(path: str | os.PathLike[str], revision: str | None = None) -> Path:
    """A checkpoint directory from a directory, a ``config.json`` path, or a Hub id already in the local HF cache,
    at ``revision`` (SGLang's ``--revision`` / ``--speculative-draft-model-revision``; None: ``main``).

    Raises:
        CheckpointError: none of those (naming ``path`` and ``revision``).
    """
    p = Path(path)
    if p.is_dir():
        return p
    if p.is_file() and p.name == "config.json":
        return p.parent
    spec = str(path)
    if spec.count("/") == 1 and not spec.startswith((".", "/")):
        try:  # offline: only what is already cached; never downloads
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(spec, "config.json", revision=revision)
            if isinstance(cached, str):
                return Path(cached).parent
        except ImportError:
            pass
    at = f" at revision {revision}" if revision else ""
    raise CheckpointError(
        f"{spec}{at}: not a checkpoint directory (need a local directory with config.json, or a Hub id in the local "
        f"cache{at})",
        spec,
    )


def _int_or_none(v: Any) -> int | None:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


@dataclass
class CheckpointInfo:
    """What serving checks need from a model directory.

    ``text_config`` is ``config["text_config"]`` for wrapper models (VLMs such as Kimi-K2.5's
    ``KimiK25ForConditionalGeneration``, whose language model carries the sizes), else ``config`` itself;
    ``hidden_size``, ``num_layers``, ``vocab_size`` and ``max_position_embeddings`` come from it, falling back to
    the top level.
    """

    path: Path
    config: dict[str, Any]
    text_config: dict[str, Any]
    architectures: list[str]
    hidden_size: int | None
    num_layers: int | None
    vocab_size: int | None
    max_position_embeddings: int | None

    @property
    def architecture(self) -> str:
        return self.architectures[0] if self.architectures else "?"

    def get(self, key: str) -> Any:
        """``key`` from the text config, else from the top level."""
        return self.text_config.get(key, self.config.get(key))


def read_checkpoint(path: str | os.PathLike[str], *, revision: str | None = None) -> CheckpointInfo:
    """Reads ``config.json`` of a model directory (see :class:`CheckpointInfo`); a Hub id is read from the local
    cache at ``revision`` (None: ``main``), the snapshot SGLang loads for it.

    Raises:
        CheckpointError: no such directory or ``config.json``, unreadable JSON, or a ``hidden_size`` /
            ``num_hidden_layers`` that is present but not a positive integer.
    """
    d = checkpoint_dir(path, revision)
    cfg = _load_json(d / "config.json")
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    archs = cfg.get("architectures") or []

    def pick(key: str) -> int | None:
        v = _int_or_none(text.get(key))
        return v if v is not None else _int_or_none(cfg.get(key))

    for key in ("hidden_size", "num_hidden_layers"):  # the checks divide by them and compare ids against them
        raw = text.get(key, cfg.get(key))
        if raw is not None and (pick(key) is None or pick(key) < 1):
            raise CheckpointError(f"{d / 'config.json'}: {key} must be a positive integer, found {raw!r}", d)

    return CheckpointInfo(
        path=d,
        config=cfg,
        text_config=text,
        architectures=[str(a) for a in archs] if isinstance(archs, list) else [str(archs)],
        hidden_size=pick("hidden_size"),
        num_layers=pick("num_hidden_layers"),
        vocab_size=pick("vocab_size"),
        max_position_embeddings=pick("max_position_embeddings"),
    )


@dataclass
class DraftInfo(CheckpointInfo):
    """A draft checkpoint: its config plus the tensor shapes of its weight files (headers only).

    Attributes:
        tensors: every tensor's header, over all ``*.safetensors`` files of the directory.
        weight_files: the safetensors files read; ``other_weight_files``: ``.bin``/``.pt`` files (not read).
        fc: the ``fc.weight`` header (``[H_draft, k * H_target]`` for EAGLE-3; ``[H, 2H]`` for EAGLE-1/2).
        d2t / t2d / lm_head: the vocab-map and head headers, if present.
        eagle_config: ``config["eagle_config"]`` (a dict) or None.
        eagle_layer_ids: ``eagle_config["eagle_aux_hidden_state_layer_ids"]``: the only place SGLang reads them
            (``spec_aux_hidden_state.py``, ``_resolve_eagle_aux_hidden_state``).
        top_level_layer_ids: a top-level ``eagle_aux_hidden_state_layer_ids`` key, which SGLang ignores.
        draft_vocab_size / target_hidden_size / num_aux_hidden_states: the config keys, None when absent.
        eagle_io_record: ``config["eagle_io"]``, what an eagle-io export records about its training (the
            eagle-io ``aux_layer_ids`` and the ``target`` it was trained for), or None.
    """

    tensors: dict[str, TensorHeader] = field(default_factory=dict)
    weight_files: list[str] = field(default_factory=list)
    other_weight_files: list[str] = field(default_factory=list)
    fc: TensorHeader | None = None
    d2t: TensorHeader | None = None
    t2d: TensorHeader | None = None
    lm_head: TensorHeader | None = None
    eagle_config: dict[str, Any] | None = None
    eagle_layer_ids: list[int] | None = None
    top_level_layer_ids: list[int] | None = None
    draft_vocab_size: int | None = None
    target_hidden_size: int | None = None
    num_aux_hidden_states: int | None = None
    eagle_io_record: dict[str, Any] | None = None

    @property
    def fc_in_width(self) -> int | None:
        """Input width of ``fc`` (``fc.weight`` is ``[out, in]``)."""
        return self.fc.shape[1] if self.fc is not None and len(self.fc.shape) == 2 else None

    @property
    def has_midlayer(self) -> bool:
        """EAGLE-3's single decoder layer is named ``midlayer`` in the EAGLE-3/SpecForge checkpoint layout."""
        return any(n.startswith(("midlayer.", "model.midlayer.")) for n in self.tensors)


def _find(tensors: dict[str, TensorHeader], leaf: str) -> TensorHeader | None:
    """``leaf`` at top level or under ``model.``, else the unique ``*.leaf`` outside MLP/MTP blocks."""
    for name in (leaf, f"model.{leaf}"):
        if name in tensors:
            return tensors[name]
    hits = [
        t for n, t in tensors.items() if n.endswith("." + leaf) and not any(s in n for s in ("mlp", "mtp", "experts"))
    ]
    return hits[0] if len(hits) == 1 else None


def _ids(v: Any) -> list[int] | None:
    if isinstance(v, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in v):
        return [int(i) for i in v]
    return None


def read_draft(path: str | os.PathLike[str], *, revision: str | None = None) -> DraftInfo:
    """Reads a draft directory: ``config.json`` and the header of every ``*.safetensors`` file in it (a Hub id: its
    cached snapshot at ``revision``, as :func:`read_checkpoint`).

    Raises:
        CheckpointError: as :func:`read_checkpoint`, for a malformed safetensors header, or an ``eagle_config`` that
            is not an object or whose ``eagle_aux_hidden_state_layer_ids`` is not a list of integers.
    """
    base = read_checkpoint(path, revision=revision)
    files = sorted(base.path.glob("*.safetensors"))
    tensors: dict[str, TensorHeader] = {}
    for f in files:
        tensors.update(read_safetensors_header(f))
    other = sorted(p.name for p in base.path.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
    cfg = base.config
    eagle_config = cfg.get("eagle_config") if isinstance(cfg.get("eagle_config"), dict) else None
    where = base.path / "config.json"
    if cfg.get("eagle_config") is not None and eagle_config is None:  # SGLang calls .get on it
        raise CheckpointError(f"{where}: eagle_config must be a JSON object, found {cfg['eagle_config']!r}", base.path)
    raw_ids = (eagle_config or {}).get("eagle_aux_hidden_state_layer_ids")
    if raw_ids is not None and _ids(raw_ids) is None:  # was read as "no ids" (SGLang's default): SGLang uses them
        raise CheckpointError(
            f"{where}: eagle_config.eagle_aux_hidden_state_layer_ids must be a list of integers, found {raw_ids!r}",
            base.path,
        )
    return DraftInfo(
        **vars(base),
        tensors=tensors,
        weight_files=[f.name for f in files],
        other_weight_files=other,
        fc=_find(tensors, "fc.weight"),
        d2t=_find(tensors, "d2t"),
        t2d=_find(tensors, "t2d"),
        lm_head=_find(tensors, "lm_head.weight"),
        eagle_config=eagle_config,
        eagle_layer_ids=_ids((eagle_config or {}).get("eagle_aux_hidden_state_layer_ids")),
        top_level_layer_ids=_ids(cfg.get("eagle_aux_hidden_state_layer_ids")),
        draft_vocab_size=_int_or_none(cfg.get("draft_vocab_size")),
        target_hidden_size=_int_or_none(cfg.get("target_hidden_size")),
        num_aux_hidden_states=_int_or_none(cfg.get("num_aux_hidden_states")),
        eagle_io_record=cfg.get("eagle_io") if isinstance(cfg.get("eagle_io"), dict) else None,
    )
