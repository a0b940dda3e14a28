"""Launching an ``sglang.Engine`` in capture-only mode with eagle-io's capture started by environment, so that it
runs in every scheduler process whatever ``tp_size`` / ``dp_size`` (what ``eagle-io generate --backend sglang`` does).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from ...errors import InvalidArgumentError
from .protocol import ENV_CAPTURE_DIR, ENV_CAPTURE_OPTIONS

#: The engine arguments of SGLang 0.5.23's capture-only mode as eagle-io's capture needs it: aux states captured
#: without a draft, every prompt in one forward, no cached prefixes, token ids in (no tokenizer in the engine).
CAPTURE_ENGINE_ARGS: dict[str, Any] = {
    "enable_return_aux_hidden_states": True,
    "speculative_algorithm": "EAGLE3",
    "chunked_prefill_size": -1,
    "disable_radix_cache": True,
    "skip_tokenizer_init": True,
}


def launch_capture_engine(
    model_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    options: Mapping[str, Any],
    **engine_args: Any,
) -> Any:
    """Starts an ``sglang.Engine`` over the HF checkpoint ``model_path`` whose schedulers capture into ``out_dir``.

    Args:
        options: the capture options (:func:`eagle_io.capturing.sglang.client.capture_options`), handed to every
            scheduler through ``EAGLE_IO_CAPTURE_OPTIONS``.
        engine_args: further ``sglang.Engine`` arguments (``tp_size``, ``dp_size``, ``device``,
            ``attention_backend``, ``mem_fraction_static``...); they may not contradict
            :data:`CAPTURE_ENGINE_ARGS`.

    Returns:
        The engine; attach with ``SGLangCaptureSession(engine, out_dir, started=True)``.

    Raises:
        InvalidArgumentError: an engine argument that contradicts capture-only mode.
    """
    import sglang

    clash = {k: v for k, v in engine_args.items() if k in CAPTURE_ENGINE_ARGS and v != CAPTURE_ENGINE_ARGS[k]}
    if clash:
        raise InvalidArgumentError(f"engine arguments {clash} contradict eagle-io's capture-only mode")
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)  # a stop file left here by an interrupted stop is ignored (its token)
    saved = {k: os.environ.get(k) for k in (ENV_CAPTURE_DIR, ENV_CAPTURE_OPTIONS)}
    os.environ[ENV_CAPTURE_DIR], os.environ[ENV_CAPTURE_OPTIONS] = out_dir, json.dumps(dict(options))
    try:  # the scheduler processes are spawned here and keep this environment
        return sglang.Engine(model_path=os.fspath(model_path), **{**CAPTURE_ENGINE_ARGS, **engine_args})
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
