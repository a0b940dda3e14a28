"""Turning torch tensors, numpy arrays and buffers into ``(dtype, shape, buffer)`` for the
native core, without copying, and allocating output tensors for the reader."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..errors import ArgumentTypeError, InvalidArgumentError
from .schema import TensorSpec

_MEMORYVIEW_DTYPES = {
    "?": "bool",
    "B": "uint8",
    "b": "int8",
    "h": "int16",
    "i": "int32",
    "q": "int64",
    "l": "int64",
    "e": "float16",
    "f": "float32",
}


def as_native(name: str, x: Any) -> tuple[str, list[int], Any]:
    """``(dtype name, shape, buffer)`` of a CPU tensor, numpy array or buffer.

    Raises:
        ValueError: a tensor on a non-CPU device, or not contiguous (a copy would be silent).
        TypeError: an object of another type.
    """
    if isinstance(x, torch.Tensor):
        if x.device.type != "cpu":
            raise InvalidArgumentError(f"tensor {name!r} is on {x.device}; copy it to the CPU first")
        if not x.is_contiguous():
            raise InvalidArgumentError(f"tensor {name!r} is not contiguous; call .contiguous() first")
        x = x.detach()
        buf = x.reshape(-1).view(torch.uint8).numpy() if x.numel() else np.empty(0, np.uint8)
        return str(x.dtype).removeprefix("torch."), list(x.shape), buf
    if isinstance(x, np.ndarray):
        if not x.flags.c_contiguous:
            raise InvalidArgumentError(f"array {name!r} is not C-contiguous; use np.ascontiguousarray first")
        return x.dtype.name, list(x.shape), x.reshape(-1).view(np.uint8)
    if isinstance(x, (bytes, bytearray, memoryview)):
        mv = memoryview(x)
        if mv.format not in _MEMORYVIEW_DTYPES:
            raise InvalidArgumentError(f"buffer {name!r} has format {mv.format!r}, which maps to no schema dtype")
        return _MEMORYVIEW_DTYPES[mv.format], list(mv.shape or ()), mv
    raise ArgumentTypeError(f"tensor {name!r}: expected a torch.Tensor, numpy array or buffer, got {type(x).__name__}")


def empty(spec: TensorSpec, n_tokens: int, pin_memory: bool = False) -> torch.Tensor:
    """An uninitialised CPU tensor for ``spec`` with ``n_tokens`` rows."""
    shape = (n_tokens,) if spec.width is None else (n_tokens, spec.width)
    return torch.empty(shape, dtype=getattr(torch, spec.dtype), pin_memory=pin_memory)


def writable_bytes(t: torch.Tensor) -> np.ndarray:
    """A writable uint8 numpy view of a contiguous CPU tensor's bytes."""
    return t.reshape(-1).view(torch.uint8).numpy() if t.numel() else np.empty(0, np.uint8)
