"""EAGLE-3 hidden-state capture: layer-id conventions and the Hugging Face reference capture path.

``layers`` is pure Python; the torch-dependent names (``HFCapture``, ``CapturedBatch``, ``find_decoder``) are
imported lazily so that reading the layer-id conventions does not import torch.
"""

from __future__ import annotations

from typing import Any

from .layers import (
    AUX_LAYER_CONVENTION,
    default_aux_layer_ids,
    from_sglang_deepseek_explicit,
    from_sglang_llama_explicit,
    from_specforge,
    to_sglang_llama_explicit,
    validate_aux_layer_ids,
)

_LAZY_HF = ("CapturedBatch", "HFCapture", "find_decoder")

__all__ = [
    "AUX_LAYER_CONVENTION",
    "CapturedBatch",
    "HFCapture",
    "default_aux_layer_ids",
    "find_decoder",
    "from_sglang_deepseek_explicit",
    "from_sglang_llama_explicit",
    "from_specforge",
    "to_sglang_llama_explicit",
    "validate_aux_layer_ids",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY_HF:
        from . import hf

        return getattr(hf, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
