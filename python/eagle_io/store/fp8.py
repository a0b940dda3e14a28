"""FP8 storage helpers (docs/FORMAT.md, "FP8 storage"): the stored row geometry of a tensor, and quantise /
dequantise in torch with exactly the Rust core's rules, for the GPU side (quantise before the device-to-host copy,
dequantise after a ``dequantize=False`` read)."""

from __future__ import annotations

import torch

from .schema import TensorSpec

#: Largest finite float8_e4m3fn magnitude.
E4M3_MAX = 448.0


def scales_per_row(spec: TensorSpec) -> int:
    """Scales per token of an FP8 tensor: 1, or ceil(width / scale_block)."""
    width = spec.width or 1
    block = min(spec.scale_block or width, width)
    return -(-width // block)


def stored_row_bytes(spec: TensorSpec) -> int:
    """Bytes per token as stored: 4 per f32 scale, then 1 per channel."""
    return 4 * scales_per_row(spec) + (spec.width or 1)


def _blocks(x: torch.Tensor, block: int | None) -> tuple[torch.Tensor, int]:
    """``x [L, W]`` as ``[L, S, block]`` (the last block zero-padded) and W."""
    n, w = x.shape
    b = min(block or w, w)
    s = -(-w // b)
    if s * b != w:
        x = torch.nn.functional.pad(x, (0, s * b - w))
    return x.reshape(n, s, b), w


def quantize(x: torch.Tensor, block: int | None = None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Quantises ``x [L, W]`` (any float dtype, any device) as the Rust core does: per block of ``block`` channels
    (None: the whole row) ``scale = amax / 448`` in float32, ``q = e4m3fn(x / scale)`` (round to nearest even,
    saturated at +-448), an all-zero block gets scale 0 and bytes 0.

    Returns ``(q [L, W] torch.float8_e4m3fn, scales [L, S] float32, clamped)``, ``clamped`` = values saturated.
    The caller checks NaN/Inf first (the capture's nonfinite policy); they are not representable.
    """
    q, scales, clamped = _quantize(x, block)
    return q, scales, int(clamped)


def _quantize(x: torch.Tensor, block: int | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`quantize` with the clamp count left on ``x``'s device (a 0-d int64 tensor: no host sync)."""
    # A float32 copy of its own, divided and clamped in place: one [L, W] float32 buffer (GPU memory) besides abs's.
    xb, w = _blocks(x.to(torch.float32, copy=True), block)
    scale = xb.abs().amax(-1, keepdim=True) / E4M3_MAX
    zero = scale == 0
    # A zero block stores bytes 0 (its -0.0 values too, as the Rust core writes them).
    y = xb.div_(torch.where(zero, 1.0, scale)).masked_fill_(zero, 0.0)
    # Above 464 (the midpoint to the next, non-finite, code) rounding would leave the range; 464 itself rounds to
    # 448 (ties to even), as in the Rust core.
    clamped = ((y > 464.0) | (y < -464.0)).sum()
    q = y.clamp_(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.flatten(1)[:, :w], scale.squeeze(-1), clamped


def quantize_rows(x: torch.Tensor, block: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantises ``x [L, W]`` (any float dtype, any device, no host sync) into its stored rows, the layout the
    writer takes pre-quantised (``_native.CaptureSink.commit(..., fp8_clamped=)``, docs/FORMAT.md 3.1): per token
    ``S`` float32 scales (little-endian) then ``W`` e4m3fn bytes, bit for bit what the Rust core's quantiser makes.

    Returns ``(rows [L, 4 S + W] uint8 on x's device, clamped)``, ``clamped`` a 0-d int64 tensor on x's device
    (values saturated at +-448). NaN/Inf make their block's scale NaN/Inf, which the writer refuses: the caller
    applies the nonfinite policy first.
    """
    q, scales, clamped = _quantize(x, block)
    scale_bytes = scales.reshape(-1).view(torch.uint8).reshape(scales.shape[0], 4 * scales.shape[1])
    rows = torch.cat([scale_bytes, q.contiguous().view(torch.uint8)], dim=1)
    return rows, clamped


def dequantize(
    q: torch.Tensor, scales: torch.Tensor, block: int | None = None, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """``q [L, W]`` float8_e4m3fn and ``scales [L, S]`` float32 (``block`` channels per scale, None: one per row)
    -> ``[L, W]`` ``dtype``, as the Rust reader does: ``e4m3fn(q) * scale`` in float32, rounded once into ``dtype``."""
    qb, w = _blocks(q.float(), block)
    return (qb * scales.float().unsqueeze(-1)).flatten(1)[:, :w].to(dtype)
