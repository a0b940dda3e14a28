"""TEST SUPPORT, NOT EAGLE-IO CODE: a test-only ``sgl_kernel`` package that lets a real SGLang (0.5.23) speculative
engine run on a CPU without AMX, where no CPU build of sgl-kernel exists on PyPI (the PyPI ``sglang-kernel`` wheel is
CUDA-only). Put its parent directory on ``PYTHONPATH`` with ``SGLANG_USE_CPU_ENGINE=1`` (tests/helpers/sglang_cpu.py).

It implements, in plain torch and from their semantics, the 11 sgl-kernel CPU ops that SGLang's EAGLE / EAGLE3
path calls when the split attention backends are ``intel_amx`` (the project's sglang_cpu_spec.md lists
them with their call sites): the two attention ops, registered with ``torch.library`` as
``torch.ops.sgl_kernel.extend_attention_cpu`` / ``decode_attention_cpu`` (:mod:`.attention`), the KV-cache row copy
(:mod:`.kv_cache`), and the speculative bookkeeping: cache locations, the draft-decode table, the verify tree,
greedy tree verification, bonus tokens (:mod:`.speculative`). Each is unit-tested against an independent reference
(tests/test_sgl_kernel_torch.py: SGLang's own Triton twins run under ``TRITON_INTERPRET=1``, or plain attention).

Every other attribute RAISES ``AttributeError`` on access, naming itself (direct access or ``getattr``), and a
``from sgl_kernel import NAME`` of it fails with ``ImportError: cannot import name 'NAME' from 'sgl_kernel'
(.../tests/support/sgl_kernel_torch/...)``. The replaced stand-in (tests/fixtures/serving/stand_ins) handed out
functions that raised only when called, because SGLang's CPU modules import kernel names at import time that a
torch_native engine never calls; those names (cache_locs.py, eagle.py, spec_tree.py, cache_move.py) are all
implemented here, and on this path (EAGLE3 / EAGLE, chain and tree, and the plain engine) SGLang 0.5.23 asks this
module for no other name, so a newer SGLang that imports or calls something new fails loudly at that point instead
of running something else. These are slow reference code: tiny models only.
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
    "NotImplementedInTestKernel",
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


class NotImplementedInTestKernel(AttributeError):
    """An ``sgl_kernel`` name this test-only package does not implement."""


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise NotImplementedInTestKernel(
        f"sgl_kernel.{name}: not implemented by eagle-io's test-only sgl_kernel (tests/support/sgl_kernel_torch), "
        f"which implements only {', '.join(IMPLEMENTED)}; the installed SGLang asks for an op this path never "
        "needed before: port it (from its semantics) and test it in tests/test_sgl_kernel_torch.py"
    )
