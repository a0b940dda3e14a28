"""The one place tests get a real SGLang engine running on this CPU: the environment of the process that starts it
(its scheduler processes inherit it) and the engine arguments of the speculative path
(sglang_cpu_spec.md in the project's shared reference notes has the recipe and why each setting)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# The test-only sgl_kernel (tests/support/sgl_kernel_torch/sgl_kernel): torch versions of the CPU ops SGLang calls.
SGL_KERNEL_DIR = Path(__file__).resolve().parent.parent / "support" / "sgl_kernel_torch"

# sglang.Engine / launch_server arguments of a CPU speculative engine (add the speculative_* ones,
# eagle_io.spec.served.engine_args). The split attention fields stay intel_amx on a CPU without AMX (SGLang rewrites
# only attention_backend to torch_native, which has no multi-step draft backend); float32 so that speculative and
# plain decoding agree token for token; small pools for a 2-core, 24 GiB machine; info logs carry eagle-io's
# plugin lines; token ids in and out (``skip_tokenizer_init``).
SPEC_ENGINE_ARGS = {
    "device": "cpu",
    "dtype": "float32",
    "prefill_attention_backend": "intel_amx",
    "decode_attention_backend": "intel_amx",
    "disable_cuda_graph": True,
    "skip_tokenizer_init": True,
    "mem_fraction_static": 0.3,
    "max_total_tokens": 4096,
    "max_running_requests": 8,
    "log_level": "info",
}


def cpu_engine_env(**extra: str) -> dict[str, str]:
    """The environment of a process running a CPU SGLang engine: the test-only ``sgl_kernel`` on ``PYTHONPATH``,
    ``SGLANG_USE_CPU_ENGINE=1``, no inherited ``EAGLE_IO_*`` / ``SGLANG_PLUGINS`` switches, then ``extra``."""
    path = [str(SGL_KERNEL_DIR)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE_IO_", "SGLANG_PLUGINS"))}
    env.update(PYTHONPATH=os.pathsep.join(path + [p for p in sys.path if p]), SGLANG_USE_CPU_ENGINE="1", **extra)
    return env
