"""The two attention ops of SGLang's ``intel_amx`` backend (``srt/layers/attention/intel_amx_backend.py``, bound at
lines 58-59 as ``torch.ops.sgl_kernel.decode_attention_cpu`` / ``extend_attention_cpu``), registered with
``torch.library`` under the ``sgl_kernel`` namespace. Dense GQA attention with ``logit_cap`` over the paged KV
cache at page size 1, computed in float32; anything else this path never passes (sliding windows, sinks,
cross-attention, non-causal extends, FP8 caches, KV scales) raises naming the op and the argument."""

from __future__ import annotations

import math

import torch


def _refuse(op: str, **given) -> None:
    for name, bad in given.items():
        if bad:
            raise NotImplementedError(f"sgl_kernel.{op}: {name} is not supported by eagle-io's test-only op")


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, cap: float, visible) -> torch.Tensor:
    """``q [n, Hq, D]`` over ``k, v [m, Hkv, D]`` (GQA: query head ``h`` reads KV head ``h // (Hq / Hkv)``);
    ``visible [n, m]`` bool or None (all). Returns ``[n, Hq, Dv]`` float32."""
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    s = torch.einsum("nhd,mhd->hnm", q.float(), k) * scale
    if cap > 0:
        s = cap * torch.tanh(s / cap)
    if visible is not None:
        s = s.masked_fill(~visible, -math.inf)
    return torch.einsum("hnm,mhd->nhd", torch.softmax(s, dim=-1), v)


@torch.library.custom_op("sgl_kernel::extend_attention_cpu", mutates_args=("o_extend",), device_types="cpu")
def extend_attention_cpu(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor | None,
    v_extend: torch.Tensor | None,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    key_scale: float,
    value_scale: float,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_len_extend: int | None,
    sm_scale: float,
    logit_cap: float,
    is_cross_attention: bool,
    sliding_window_size: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
    tree_mask: torch.Tensor | None,
    is_causal: bool,
) -> None:
    """Per request ``i``: its ``extend_seq_lens[i]`` queries (rows ``extend_start_loc[i]`` on) attend to the cached
    prefix ``req_to_token[rpi, :seq_len - extend_len]`` and to the extend's own keys (``k_extend``), causally, or,
    when ``tree_mask`` is given (target verify of a tree, topk > 1), as its QLEN_ONLY block ``[extend_len,
    extend_len]`` at ``i * extend_len**2`` says (row: query, column: key; the prefix always visible). Writes
    ``o_extend``. (The backend has already stored the extend's K/V in the cache: ``set_kv_buffer`` before the call.)"""
    op = "extend_attention_cpu"
    _refuse(
        op,
        is_cross_attention=is_cross_attention,
        sliding_window=sliding_window_size > 0,
        sinks=sinks is not None,
        non_causal=not is_causal,
        kv_scales=key_scale != 1.0 or value_scale != 1.0,
        fp8_cache=k_buffer.dtype == torch.float8_e4m3fn,
        missing_extend_kv=k_extend is None or v_extend is None,
    )
    offset = 0
    rows = zip(
        req_pool_indices.tolist(), seq_lens.tolist(), extend_seq_lens.tolist(), extend_start_loc.tolist(), strict=True
    )
    for rpi, seq_len, n, start in rows:
        prefix = seq_len - n
        slots = req_to_token[rpi, :prefix].long()
        k_new = k_extend[start : start + n].reshape(n, *k_buffer.shape[1:])
        v_new = v_extend[start : start + n].reshape(n, *v_buffer.shape[1:])
        k = torch.cat([k_buffer[slots], k_new.to(k_buffer.dtype)])
        v = torch.cat([v_buffer[slots], v_new.to(v_buffer.dtype)])
        if tree_mask is None:
            own = torch.ones(n, n, dtype=torch.bool).tril()
        else:
            own = tree_mask.reshape(-1)[offset : offset + n * n].view(n, n).bool()
            offset += n * n
        visible = torch.cat([torch.ones(n, prefix, dtype=torch.bool), own], dim=1)
        out = _attend(q_extend[start : start + n], k, v, sm_scale, logit_cap, visible)
        o_extend[start : start + n] = out.to(o_extend.dtype)


@torch.library.custom_op(
    "sgl_kernel::decode_attention_cpu",
    mutates_args=("k_buffer", "v_buffer", "output", "attn_logits"),
    device_types="cpu",
)
def decode_attention_cpu(
    query: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    key_scale: float,
    value_scale: float,
    output: torch.Tensor,
    key: torch.Tensor | None,
    value: torch.Tensor | None,
    loc: torch.Tensor | None,
    attn_logits: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    is_cross_attention: bool,
    sliding_window_size: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
) -> None:
    """Stores ``key`` / ``value`` at cache rows ``loc`` when given ("decode writes KV in-kernel"), then query ``i``
    attends over ``req_to_token[rpi[i], :seq_lens[i]]``. Writes ``output``; ``attn_logits`` (the split-K scratch of
    the real kernel) is left as it is."""
    op = "decode_attention_cpu"
    _refuse(
        op,
        is_cross_attention=is_cross_attention,
        sliding_window=sliding_window_size > 0,
        sinks=sinks is not None,
        kv_scales=key_scale != 1.0 or value_scale != 1.0,
        fp8_cache=k_buffer.dtype == torch.float8_e4m3fn,
    )
    if key is not None and value is not None and loc is not None:
        rows = loc.long()
        k_buffer[rows] = key.view(len(rows), *k_buffer.shape[1:]).to(k_buffer.dtype)
        v_buffer[rows] = value.view(len(rows), *v_buffer.shape[1:]).to(v_buffer.dtype)
    for i, (rpi, seq_len) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=True)):
        slots = req_to_token[rpi, :seq_len].long()
        out = _attend(query[i : i + 1], k_buffer[slots], v_buffer[slots], sm_scale, logit_cap, None)
        output[i : i + 1] = out.to(output.dtype)
