"""A target checkpoint read without loading its model: the head tensors the draft commands need, the identity a
dataset records, and the memory a whole-model load would take.

* :func:`read_head`: the input embedding and ``lm_head`` (``[vocab, H]``) from the checkpoint's safetensors shards,
  found through ``model.safetensors.index.json`` (or in the one ``*.safetensors`` file), each read alone (its byte
  range, no memory map of the shard) in its stored dtype; FP8 tensors with their scales are dequantised to bfloat16
  a block of rows at a time. Nothing else is read, so a 1T-parameter checkpoint costs what its head costs
  (Kimi-K2.5: 2 x 163840 x 7168 bf16, 4.7 GB).
* :func:`read_final_norm`: the final norm's weight, the same way (the speculators import normalises with it).
* :func:`target_files`: the identity of the target's files, computed in seconds whatever the checkpoint's size
  (docs/FORMAT.md 2.1): every file of 64 MiB or less hashed whole (config, tokenizer, the safetensors index), each
  larger one by its size, its safetensors header and 32 blocks of 64 KiB spread over it (``sampled_sha256``); the
  full sha256 of every file on request (``full_sha256=True``, or ``EAGLE_IO_TARGET_SHA256=1`` for any command).
  Cached per checkpoint under ``$EAGLE_IO_CACHE/target-identity``.
* :func:`whole_model_need` / :func:`require_fits`: the bytes a whole-model load needs (every tensor's elements at
  the load dtype, from the shards' headers, or a GGUF's tensor table) against what the device has, refused with the
  figures.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError, InvalidArgumentError, TargetNotFoundError
from ..host import available_memory, cache_dir, human_bytes
from ..sglang.checkpoint import TensorHeader, read_checkpoint, read_safetensors_header, read_tensor_values
from ..store import layout

__all__ = [
    "FULL_HASH_BYTES",
    "FULL_SHA256_ENV",
    "IDENTITY_SUFFIXES",
    "MemoryNeed",
    "checkpoint_tensors",
    "file_sha256",
    "read_final_norm",
    "read_head",
    "require_fits",
    "target_files",
    "whole_model_need",
]

#: Files whose content identifies a target (weights, config, tokenizer), at the top of its directory.
IDENTITY_SUFFIXES = (".safetensors", ".bin", ".json", ".model", ".txt", ".gguf")
#: Files up to this size are hashed whole in the identity; larger ones are sampled (full sha256 on request).
FULL_HASH_BYTES = 64 << 20
#: Set to ``1``: every command's target identity holds the full sha256 of every file (hashed once, then cached).
FULL_SHA256_ENV = "EAGLE_IO_TARGET_SHA256"
_SAMPLES, _SAMPLE_BYTES = 32, 64 << 10
_SAMPLED_KIND = "eagle-io sampled v1"
INDEX = "model.safetensors.index.json"
_FLOAT8 = {"F8_E4M3", "F8_E5M2"}
_FLOATS = {"F32", "F16", "BF16", *_FLOAT8}
_ROWS_PER_BLOCK = 1024  # FP8 dequantisation: rows converted at a time (a float32 temporary of 1024 x H)


def file_sha256(path: str | os.PathLike[str], chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file's bytes (~0.1 s for the 98 MB SmolLM2 GGUF when in the page cache; about 1 s per GB
    from a fast disk)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _sampled_sha256(path: Path, size: int) -> str:
    """sha256 over the file's size, its safetensors header (when it is a ``.safetensors`` file) and
    ``_SAMPLES`` blocks of ``_SAMPLE_BYTES`` at evenly spaced offsets from its first byte to its last block."""
    h = hashlib.sha256(f"{_SAMPLED_KIND} {size}\n".encode())
    with open(path, "rb") as f:
        if path.suffix == ".safetensors":
            raw = f.read(8)
            n = int.from_bytes(raw, "little") if len(raw) == 8 else 0
            if 8 + n <= size:
                h.update(raw + f.read(n))
        last = max(size - _SAMPLE_BYTES, 0)
        for i in range(_SAMPLES):
            f.seek(last * i // (_SAMPLES - 1))
            h.update(f.read(_SAMPLE_BYTES))
    return h.hexdigest()


def _identity_paths(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(IDENTITY_SUFFIXES))


def _cache_file(path: Path) -> Path:
    return Path(cache_dir()) / "target-identity" / (hashlib.sha256(str(path).encode()).hexdigest()[:16] + ".json")


def target_files(path: str | os.PathLike[str], *, full_sha256: bool | None = None) -> list[dict[str, Any]]:
    """The identity of a target's files (docs/FORMAT.md 2.1), one entry per file: a ``.gguf`` file alone, or the
    files of an HF directory whose names end in ``.safetensors .bin .json .model .txt .gguf`` (weights, config,
    tokenizer, the safetensors index), sorted by name.

    Each entry: ``name``, ``size`` (bytes); ``sha256`` (hex) of a file of :data:`FULL_HASH_BYTES` or less, and of
    every file with ``full_sha256`` (None: when ``$EAGLE_IO_TARGET_SHA256`` is set to anything but ``0``, the way
    to ask for it through any command), else None; ``sampled_sha256`` of a larger file: sha256 over its size, its
    safetensors header and 32 blocks of 64 KiB spread over it (about 2 MB read per file, so a trillion-parameter
    checkpoint's identity takes seconds). What was computed is cached in
    ``$EAGLE_IO_CACHE/target-identity/`` (default ``~/.cache/eagle-io``), keyed by the checkpoint's absolute path
    and reused for a file of the same size and modification time; a cache that cannot be written is skipped.

    Raises:
        TargetNotFoundError: ``path`` does not exist.
    """
    root = Path(path).expanduser().resolve()
    if not root.exists():
        raise TargetNotFoundError(f"target model path {root} does not exist (no hub downloads)")
    if full_sha256 is None:
        full_sha256 = os.environ.get(FULL_SHA256_ENV, "") not in ("", "0")
    cache_path = _cache_file(root)
    try:
        cached = json.loads(cache_path.read_text())
        cached = cached.get("files", {}) if isinstance(cached, dict) and cached.get("path") == str(root) else {}
    except (OSError, ValueError):
        cached = {}
    out, changed = [], False
    for p in _identity_paths(root):
        st = p.stat()
        old = cached.get(p.name)
        entry = old if isinstance(old, dict) and old.get("stamp") == [st.st_size, st.st_mtime_ns] else {}
        entry = dict(entry, stamp=[st.st_size, st.st_mtime_ns])
        if st.st_size > FULL_HASH_BYTES and not entry.get("sampled_sha256"):
            entry["sampled_sha256"] = _sampled_sha256(p, st.st_size)
        if (st.st_size <= FULL_HASH_BYTES or full_sha256) and not entry.get("sha256"):
            entry["sha256"] = file_sha256(p)
        changed |= entry != old
        cached[p.name] = entry
        rec = {"name": p.name, "size": st.st_size}
        rec["sha256"] = entry["sha256"] if st.st_size <= FULL_HASH_BYTES or full_sha256 else None
        if st.st_size > FULL_HASH_BYTES:
            rec["sampled_sha256"] = entry["sampled_sha256"]
        out.append(rec)
    if changed:
        try:
            cache_path.parent.mkdir(parents=True, exist_ok=True)
            layout.write_atomic(cache_path, json.dumps({"path": str(root), "files": cached}).encode())
        except OSError:
            pass  # a read-only home: the identity is the same, computed again next time
    return out


# --- the checkpoint's tensors ---------------------------------------------------------------------------------


def checkpoint_tensors(root: str | os.PathLike[str]) -> dict[str, TensorHeader]:
    """Every tensor's header in an HF directory's safetensors weights, by name: the shards
    ``model.safetensors.index.json`` maps (only their headers read), else every top-level ``*.safetensors`` file.

    Raises:
        CheckpointError: no safetensors weights, an unreadable index or header, a shard the index names that is
            missing, or a tensor the index places in a shard whose header lacks it.
    """
    root = Path(root)
    index = root / INDEX
    if index.is_file():
        try:
            raw = json.loads(index.read_text())
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{index}: cannot read: {e}", index) from e
        weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: not a safetensors index (no weight_map object)", index)
        shards = sorted(set(map(str, weight_map.values())))
        missing = [s for s in shards if not (root / s).is_file()]
        if missing:
            raise CheckpointError(f"{index} names shards that are not in {root}: {missing[:4]}", index)
    else:
        shards = sorted(p.name for p in root.glob("*.safetensors"))
        weight_map = None
        if not shards:
            raise CheckpointError(f"{root}: no safetensors weights (no {INDEX}, no *.safetensors file)", root)
    tensors: dict[str, TensorHeader] = {}
    for shard in shards:
        tensors.update(read_safetensors_header(root / shard))
    if weight_map is not None:
        lost = [n for n, s in weight_map.items() if n not in tensors or tensors[n].file != Path(str(s)).name]
        if lost:
            raise CheckpointError(f"{index}: tensors not in the shard it names: {lost[:4]}", index)
    return tensors


_SKIP = (".layers.", "mtp", "vision", "visual", "mm_projector", "multi_modal", "audio")


def _head_tensor(tensors: dict[str, TensorHeader], leaf: str) -> TensorHeader | None:
    """The tensor named ``leaf`` (``embed_tokens.weight``, ``lm_head.weight``) of the language model: the one
    ``*.leaf`` outside decoder layers, MTP and vision towers with the shortest name (``model.embed_tokens.weight``,
    ``language_model.model.embed_tokens.weight``).

    Raises:
        CheckpointError: two such tensors equally near the top.
    """
    hits = [t for n, t in tensors.items() if (n == leaf or n.endswith("." + leaf)) and not any(s in n for s in _SKIP)]
    if not hits:
        return None
    depth = min(t.name.count(".") for t in hits)
    top = [t for t in hits if t.name.count(".") == depth]
    if len(top) > 1:
        raise CheckpointError(f"several {leaf} tensors: {sorted(t.name for t in top)}: cannot tell the target's", leaf)
    return top[0]


def _scale_of(tensors: dict[str, TensorHeader], t: TensorHeader) -> TensorHeader | None:
    base = t.name.removesuffix(".weight")
    for suffix in ("weight_scale_inv", "weight_scale", "scale"):
        if f"{base}.{suffix}" in tensors:
            return tensors[f"{base}.{suffix}"]
    return None


def _read_tensor(
    root: Path, tensors: dict[str, TensorHeader], t: TensorHeader, block: tuple[int, int] | None
) -> torch.Tensor:
    """One tensor in its stored dtype, or an FP8 one dequantised to bfloat16 with its scale (a ``weight_scale_inv``
    of ``[ceil(rows / b0), ceil(cols / b1)]`` blocks, ``block = (b0, b1)`` the config's
    ``quantization_config.weight_block_size``, else as many as the scale has; or a per-tensor / per-row
    ``weight_scale``), ``_ROWS_PER_BLOCK`` rows at a time (the float32 temporaries stay that size). Only its bytes
    are read (:func:`eagle_io.sglang.checkpoint.read_tensor_values`: no memory map of the shard, which the kernel
    refuses for a shard larger than the memory when mapped privately, as torch maps safetensors files)."""
    if t.dtype not in _FLOATS:
        raise CheckpointError(
            f"{root / t.file}: {t.name} is stored as {t.dtype} (packed or integer-quantised): eagle-io reads head "
            "tensors in BF16, F16, F32, or FP8 with their scales",
            root / t.file,
        )
    values = read_tensor_values(root, t, max_bytes=None)
    if t.dtype not in _FLOAT8:
        return values
    s = _scale_of(tensors, t)
    if s is None:
        raise CheckpointError(f"{root / t.file}: {t.name} is {t.dtype} with no scale tensor beside it", root / t.file)
    scale = read_tensor_values(root, s, max_bytes=None).float()
    rows, cols = t.shape
    scale = scale.reshape(-1, 1) if scale.dim() < 2 else scale  # per tensor ([] or [1]) or per row ([rows])
    (s0, s1), (b0, b1) = scale.shape, block or (0, 0)  # rows and columns per scale: the config's, else inferred
    b0 = rows if s0 == 1 else b0 if b0 and -(-rows // b0) == s0 else -(-rows // s0)
    b1 = cols if s1 == 1 else b1 if b1 and -(-cols // b1) == s1 else -(-cols // s1)
    if -(-rows // b0) != s0 or -(-cols // b1) != s1:
        raise CheckpointError(
            f"{root / s.file}: {s.name} {list(scale.shape)} does not scale {t.name} {list(t.shape)} in blocks of "
            f"{b0} x {b1}",
            root / s.file,
        )
    out = torch.empty(rows, cols, dtype=torch.bfloat16)
    for r in range(0, rows, _ROWS_PER_BLOCK):
        part = values[r : r + _ROWS_PER_BLOCK].float()
        sc = scale[torch.arange(r, r + part.shape[0]) // b0].repeat_interleave(b1, 1)[:, :cols]
        out[r : r + part.shape[0]] = (part * sc).to(torch.bfloat16)
    return out


def read_head(root: str | os.PathLike[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(embed, lm_head)`` of an HF checkpoint directory, each ``[vocab, H]`` in its stored dtype (bfloat16 for
    FP8 tensors, dequantised with their scales); with tied embeddings (no ``lm_head.weight``) ``lm_head`` is the
    same tensor as ``embed``. Only those tensors' bytes are read (plus the shards' headers), so the memory used is
    their size.

    Raises:
        CheckpointError: no ``config.json``, no safetensors weights, no input embedding, a tensor that is not 2-D
            ``[vocab, H]``, one stored in a dtype not read (integer packs), or an unreadable file.
    """
    root = Path(root)
    tensors = checkpoint_tensors(root)
    quant = read_checkpoint(root).get("quantization_config")
    size = quant.get("weight_block_size") if isinstance(quant, dict) else None
    block = (int(size[0]), int(size[1])) if isinstance(size, list) and len(size) == 2 else None
    emb = _head_tensor(tensors, "embed_tokens.weight") or _head_tensor(tensors, "wte.weight")
    if emb is None:
        raise CheckpointError(f"{root}: no embed_tokens.weight among the checkpoint's {len(tensors)} tensors", root)
    head = _head_tensor(tensors, "lm_head.weight")
    for t in (emb, head):
        if t is not None and len(t.shape) != 2:
            raise CheckpointError(f"{root / t.file}: {t.name} has shape {list(t.shape)}, expected [vocab, H]", root)
    embed = _read_tensor(root, tensors, emb, block)
    return embed, (embed if head is None else _read_tensor(root, tensors, head, block))


def read_final_norm(root: str | os.PathLike[str]) -> torch.Tensor:
    """The language model's final norm weight (``model.norm.weight``, ``[H]``) of an HF checkpoint directory, in its
    stored dtype, reading only its bytes (and the shards' headers).

    Raises:
        CheckpointError: no safetensors weights, no such tensor or one that is not 1-D, or an unreadable file.
    """
    root = Path(root)
    tensors = checkpoint_tensors(root)
    t = _head_tensor(tensors, "norm.weight")
    if t is None or len(t.shape) != 1:
        found = "none" if t is None else f"{t.name} {list(t.shape)}"
        raise CheckpointError(f"{root}: no 1-D final norm weight (model.norm.weight) in its safetensors: {found}", root)
    return _read_tensor(root, tensors, t, None)


# --- whole-model memory ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryNeed:
    """What loading a whole target takes where it is placed.

    Attributes:
        params: the checkpoint's elements (every tensor's, from the headers).
        need: bytes of those elements at ``dtype`` (weights only: activations and caches come on top).
        available: bytes available on ``device`` now (host: the kernel's MemAvailable; a CUDA device: its free
            memory), None when not known.
        dtype: the load dtype (``"float32"``, or ``"stored dtypes"``); device: ``"cpu"`` or ``"cuda:0"``.
    """

    params: int
    need: int
    available: int | None
    dtype: str
    device: str

    @property
    def fits(self) -> bool:
        return self.available is None or self.need <= self.available

    def describe(self) -> str:
        """``"68.4 B parameters as bfloat16: 137 GB of weights on cpu, 22.1 GB available"``."""
        have = "available unknown" if self.available is None else f"{human_bytes(self.available)} available"
        return (
            f"{self.params / 1e9:,.2f} B parameters as {self.dtype}: {human_bytes(self.need)} of weights on "
            f"{self.device}, {have}"
        )


def _gguf_elements(path: Path) -> int:
    st = path.stat()
    return _gguf_elements_of(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _gguf_elements_of(path: str, size: int, mtime_ns: int) -> int:
    """Elements of a GGUF file's tensors (its tensor table; the data is memory-mapped, not read), once per process
    for a file of that size and modification time: the reader parses every metadata array (~1.8 s for SmolLM2's)."""
    from gguf import GGUFReader  # transformers' own GGUF reader

    try:
        return sum(int(t.n_elements) for t in GGUFReader(path).tensors)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: cannot read its GGUF tensor table: {e}", path) from e


def _device_memory(device: str) -> int | None:
    if device.startswith("cuda"):
        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    return available_memory()


def whole_model_need(
    model: str | os.PathLike[str], dtype: torch.dtype | str | None, device: str | torch.device = "cpu"
) -> MemoryNeed:
    """The bytes a whole-model load of ``model`` (an HF directory with safetensors, or a ``.gguf`` file) needs as
    ``dtype`` on ``device``, from the shards' headers or the GGUF's tensor table (no weight read). ``dtype`` None:
    as stored (what SGLang loads: each tensor's own bytes; a GGUF's elements in bfloat16, the checkpoint eagle-io
    converts it to).

    Raises:
        CheckpointError: headers that cannot be read (:func:`checkpoint_tensors`).
    """
    path = Path(model)
    dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if path.is_file():
        params = _gguf_elements(path)
        dt = dt or torch.bfloat16
        stored = params * 2
    else:
        params = stored = 0
        for t in checkpoint_tensors(path).values():
            n = 1
            for d in t.shape:
                n *= d
            params += n
            stored += t.end - t.start
    need = stored if dt is None else params * torch.empty((), dtype=dt).element_size()
    dev = str(torch.device(device))
    name = "stored dtypes" if dt is None else str(dt).removeprefix("torch.")
    return MemoryNeed(params, need, _device_memory(dev), name, dev)


def require_fits(need: MemoryNeed, what: str) -> None:
    """Refuses a whole-model load that cannot fit, with the figures and the ways that run the target elsewhere.

    Args:
        what: who loads it where (``"--backend hf loads the whole target in this process"``), for the message.

    Raises:
        InvalidArgumentError: ``need.need`` exceeds ``need.available``.
    """
    if need.fits:
        return
    raise InvalidArgumentError(
        f"{what}: {need.describe()}: it cannot fit. Run the target in "
        "SGLang (eagle-io generate --backend sglang --tp-size N over this machine's GPUs, or --server URL of "
        "running servers); the draft commands train-draft and offline eval-draft (--prompts 0) read only its head"
    )
