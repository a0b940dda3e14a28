"""TEST SUPPORT, NOT EAGLE-IO CODE: a test-only ``sgl_kernel`` package that lets a real SGLang (0.5.23) speculative
engine run on a CPU without AMX, where no CPU build of sgl-kernel exists on PyPI (the PyPI ``sglang-kernel`` wheel is
CUDA-only). Put its parent directory on ``PYTHONPATH`` with ``SGLANG_USE_CPU_ENGINE=1`` (tests/helpers/sglang_cpu.py).

It implements, in plain torch and from their semantics, the 11 sgl-kernel CPU ops that SGLang's EAGLE / EAGLE3
path calls when the split attention backends are ``intel_amx`` (/work/shared/reference/sglang_cpu_spec.md lists
them with their call sites): the two attention ops, registered with ``torch.library`` as
``torch.ops.sgl_kernel.extend_attention_cpu`` / ``decode_attention_cpu`` (:mod:`.attention`), the KV-cache row copy
(:mod:`.kv_cache`), and the speculative bookkeeping: cache locations, the draft-decode table, the verify tree,
greedy tree verification, bonus tokens (:mod:`.speculative`). Each is unit-tested against an independent reference
(tests/test_sgl_kernel_torch.py: SGLang's own Triton twins run under ``TRITON_INTERPRET=1``, or plain attention).

Every other name this module is asked for is a function that RAISES naming itself when called (SGLang's CPU modules
import names at import time that this path never calls), so a newer SGLang that calls something new fails loudly
instead of running something else. They are slow reference code: tiny models only.
"""

from .attention import decode_attention_cpu, extend_attention_cpu
from .kv_cache import copy_all_layer_kv_cache_cpu
from .speculative import (
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    build_draft_decode_metadata_cpu,
    build_tree_kernel_efficient_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    verify_tree_greedy_cpu,
)

__version__ = "0.0.0+eagle-io-test-support"

IMPLEMENTED = (
    "copy_all_layer_kv_cache_cpu",
    "extend_attention_cpu",
    "assign_req_to_token_pool_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "build_draft_decode_metadata_cpu",
    "decode_attention_cpu",
    "build_tree_kernel_efficient_cpu",
    "assign_extend_cache_locs_cpu",
    "verify_tree_greedy_cpu",
    "fill_bonus_tokens_cpu",
    "fill_accept_out_cache_loc_cpu",
)

__all__ = [
    "IMPLEMENTED",
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_draft_decode_metadata_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "decode_attention_cpu",
    "extend_attention_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "verify_tree_greedy_cpu",
]


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)

    def _not_implemented(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} was called: eagle-io's test-only sgl_kernel implements only {', '.join(IMPLEMENTED)}"
        )

    _not_implemented.__name__ = name
    return _not_implemented
