"""An exported EAGLE-3 draft's weights as SGLang 0.5.23 takes them in place (``POST /update_weights_from_tensor``) and
reports them back (``/weights_checker``): which tensors are sent, how they travel, and the checksums to expect.

* Sent: every tensor of the draft's ``*.safetensors`` files except the shared embedding (``embed_tokens``: an EAGLE-3
  draft shares the target's, ``EAGLEWorker`` hands it the target's own at start; sending one would overwrite what the
  target embeds with) and the vocabulary map (``d2t`` / ``t2d``: ``LlamaForCausalLMEagle3.load_weights`` turns
  ``d2t`` into ``hot_token_id``, which the worker copies once at start, so a new map would never be used).
* Names: as exported (``fc.weight``, ``midlayer.*``, ``norm.weight``, ``lm_head.weight``);
  ``LlamaForCausalLMEagle3.load_weights`` (``srt/models/llama_eagle3.py``) renames ``midlayer`` to ``layers.0``,
  stacks ``q/k/v_proj`` into ``qkv_proj`` and ``gate/up_proj`` into ``gate_up_proj``, and prefixes ``model.``
  (:func:`served_checksums` follows the same rules).
* Transport: one host only. ``MultiprocessingSerializer`` (``srt/utils/common.py``) pickles tensors as shared-memory
  handles the scheduler opens; a client using torch's default ``file_descriptor`` strategy sends handles the
  scheduler cannot open, and the CPU server died of it. :func:`serialized_tensors` pickles under the
  ``file_system`` strategy (:func:`file_system_sharing`), restored after.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch

from ..errors import CheckpointError

__all__ = [
    "NOT_SENT",
    "file_system_sharing",
    "nonfinite_problems",
    "read_draft_tensors",
    "sent_tensors",
    "serialized_tensors",
    "served_checksums",
]

NOT_SENT = {
    "embed_tokens": "the shared embedding (the target's own in the served draft)",
    "d2t": "the vocabulary map (copied by SGLang's worker at start)",
    "t2d": "the vocabulary map (copied by SGLang's worker at start)",
}
"""Leaf names of the tensors never sent, and why."""


def read_draft_tensors(draft_dir: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Every tensor of ``draft_dir/*.safetensors``, as stored (CPU; shapes and dtypes of the file).

    Raises:
        CheckpointError: no ``*.safetensors`` file, or one that cannot be read whole (a truncated file: safetensors'
            own reason), naming the file.
    """
    from safetensors.torch import load_file

    d = Path(draft_dir)
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{d}: no *.safetensors file: not an exported draft (`eagle-io train-draft --out`)", d)
    out: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            out.update(load_file(f))
        except Exception as e:  # safetensors' own errors (SafetensorError, OSError) on a short or damaged file
            why = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise CheckpointError(f"{f}: cannot read its tensors ({why}): a truncated or damaged file", f) from e
    return out


def _leaf(name: str) -> str:
    return name.rsplit(".", 2)[-2] if name.endswith(".weight") else name.rsplit(".", 1)[-1]


def sent_tensors(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tensors`` less the ones never sent (:data:`NOT_SENT`)."""
    return {n: t for n, t in tensors.items() if _leaf(n) not in NOT_SENT}


def nonfinite_problems(tensors: Mapping[str, torch.Tensor]) -> list[str]:
    """One line per floating tensor holding NaN or Inf values (their count)."""
    out = []
    for name, t in tensors.items():
        if t.is_floating_point():
            bad = int((~torch.isfinite(t)).sum())
            if bad:
                out.append(f"{name}: {bad} NaN/Inf value(s) of {t.numel()}")
    return out


_STACKED = ((".q_proj", ".qkv_proj"), (".k_proj", ".qkv_proj"), (".v_proj", ".qkv_proj"),
            (".gate_proj", ".gate_up_proj"), (".up_proj", ".gate_up_proj"))  # fmt: skip


def _served_name(name: str) -> str:
    """The parameter ``LlamaForCausalLMEagle3.load_weights`` loads ``name`` into (stacked shards share one)."""
    name = name.replace("midlayer", "layers.0")
    for shard, stacked in _STACKED:
        if shard in name:
            name = name.replace(shard, stacked)
            break
    return name if name.startswith(("model.", "lm_head.")) else f"model.{name}"


def served_checksums(tensors: Mapping[str, torch.Tensor], dtype: torch.dtype) -> dict[str, str]:
    """The ``/weights_checker`` checksum (``action: checksum``) each sent tensor gives once loaded into a CPU server
    of ``dtype``: ``{served parameter name: 16 hex digits}``, the first 8 bytes of the SHA-256 of the parameter's
    bytes (``srt/utils/weight_checker.py`` ``_hash_tensor`` -> ``mm_utils.tensor_hash``, its CPU path; a GPU server
    hashes with a Triton kernel instead). Stacked parameters hash their shards' bytes in load order (q, k, v; gate,
    up), as ``QKVParallelLinear`` / ``MergedColumnParallelLinear`` lay them out at TP 1."""
    parts: dict[str, list[torch.Tensor]] = {}
    order = {".q_proj": 0, ".k_proj": 1, ".v_proj": 2, ".gate_proj": 0, ".up_proj": 1}
    for name in sorted(sent_tensors(tensors), key=lambda n: next((v for k, v in order.items() if k in n), 0)):
        parts.setdefault(_served_name(name), []).append(tensors[name])
    out = {}
    for served, shards in parts.items():
        h = hashlib.sha256()
        for t in shards:
            h.update(memoryview(t.to(dtype).contiguous().reshape(-1).view(torch.uint8).numpy()))
        out[served] = h.digest()[:8].hex()
    return out


@contextmanager
def file_system_sharing() -> Iterator[None]:
    """torch's CPU tensor sharing strategy set to ``file_system`` inside the block (named shared-memory files the
    scheduler process opens by name), the previous one restored after."""
    import torch.multiprocessing as mp

    before = mp.get_sharing_strategy()
    mp.set_sharing_strategy("file_system")
    try:
        yield
    finally:
        mp.set_sharing_strategy(before)


def serialized_tensors(named: Sequence[tuple[str, torch.Tensor]]) -> str:
    """``named`` pickled as SGLang's ``MultiprocessingSerializer.serialize(named, output_str=True)`` does (torch's
    ``ForkingPickler``, base64 text): one entry of ``serialized_named_tensors`` (one per TP rank). The tensors (CPU,
    contiguous: as :func:`read_draft_tensors` loads them) move to shared memory (``file_system`` strategy): keep them
    alive until the server answered.
    """
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401 (registers torch's reductions with ForkingPickler)

    buf = io.BytesIO()
    with file_system_sharing():
        ForkingPickler(buf).dump(list(named))
    return base64.b64encode(buf.getvalue()).decode("ascii")
