"""The KV-cache row copy SGLang's memory pool runs (``kernels/ops/kvcache/cache_move.py``
``copy_all_layer_kv_cache_func``; its Triton twin ``copy_all_layer_kv_cache_tiled``)."""

from __future__ import annotations

import ctypes

import torch


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """For every buffer ``b`` (``data_ptrs[b]``: the address of a K or V buffer of one layer, ``strides[b]``: its row
    size in bytes), row ``tgt_loc[i]`` takes the bytes of row ``src_loc[i]``; all source rows are read before any
    target row is written (safe when they overlap, as the Triton twin's one load then one store)."""
    src, tgt = src_loc.tolist(), tgt_loc.tolist()
    if len(src) != len(tgt):
        raise ValueError(f"copy_all_layer_kv_cache_cpu: {len(src)} source rows, {len(tgt)} target rows")
    for base, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        rows = ctypes.create_string_buffer(stride * len(src))
        start = ctypes.addressof(rows)
        for i, s in enumerate(src):
            ctypes.memmove(start + i * stride, base + s * stride, stride)
        for i, t in enumerate(tgt):
            ctypes.memmove(base + t * stride, start + i * stride, stride)
