"""Safetensors files whose large tensors are holes: real headers with real shapes, no disk for the zeros.

`eagle-io check-serving` reads headers (and the small vocab maps), so a test can give a Kimi-K2.5-sized draft its
real shapes (fc [7168, 21504], lm_head [32000, 7168]) without writing gigabytes: tensors given as
``(dtype, shape)`` are left as a sparse hole (reads as zeros, also through the ``safetensors`` library); tensors
given as ``torch.Tensor`` are written byte for byte. The layout is the safetensors format (8-byte little-endian
header length, JSON header with ``dtype`` / ``shape`` / ``data_offsets``, data in header order).
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import torch

DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.int64: "I64",
          torch.int32: "I32", torch.bool: "BOOL", torch.uint8: "U8"}  # fmt: skip
SIZES = {"BF16": 2, "F16": 2, "F32": 4, "I64": 8, "I32": 4, "BOOL": 1, "U8": 1}


def write_safetensors(path: str | Path, tensors: dict[str, torch.Tensor | tuple[str, tuple[int, ...]]]) -> Path:
    """Writes ``tensors`` (name -> tensor, or name -> ``(safetensors dtype, shape)`` for a zero-filled hole)."""
    header: dict[str, dict] = {}
    blobs: list[tuple[int, bytes]] = []
    off = 0
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor):
            dtype, shape = DTYPES[t.dtype], tuple(t.shape)
            raw = t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""
            blobs.append((off, raw))
        else:
            dtype, shape = t
        n = math.prod(shape) * SIZES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    path = Path(path)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        base = 8 + len(head)
        for at, raw in blobs:
            f.seek(base + at)
            f.write(raw)
        f.truncate(base + off)
    return path
