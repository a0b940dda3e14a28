"""Launching SGLang for a capture: a server in capture-only mode (:func:`launch_capture_server`, what ``eagle-io
generate --backend sglang`` does before capturing through it over HTTP, as from any server), with the aux layers the
capture asks for (:func:`capture_layer_args`). The launcher itself is :func:`eagle_io.sglang.servers.launch_server`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import InvalidArgumentError
from ...sglang.servers import launch_server, server_flags
from ..options import CaptureOptions
from .protocol import ENV_CAPTURE_ROOT


def capture_layer_args(
    model_path: str | os.PathLike[str], options: CaptureOptions, engine_args: Mapping[str, Any]
) -> dict[str, Any]:
    """The engine argument that makes SGLang capture ``options.aux_layer_ids`` (eagle-io ids), or ``{}``.

    SGLang's capture-only mode hands ``return_aux_hidden_state_layer_ids`` to the target's
    ``set_eagle3_layers_to_capture`` as explicit ids (``spec_aux_hidden_state.py``,
    ``_resolve_capture_only_aux_hidden_state``), so they are written in that setter's convention
    (:func:`eagle_io.sglang.setters.explicit_ids_for` for the architecture in ``model_path/config.json``). Id ``N``
    (the final pre-norm boundary) is accepted only for targets whose forward captures it
    (:data:`eagle_io.sglang.setters.FINAL_BOUNDARY_SETTERS`; e.g. gpt-oss ``[.., N]`` is written ``[.., N - 1]``,
    which its setter shifts back to ``N`` and which passes SGLang's ``id < num_layers`` check).

    Raises:
        InvalidArgumentError: ids outside the target's capturable range, duplicated or unsorted, ids the setter
            cannot express, an unreadable ``config.json``, or a ``return_aux_hidden_state_layer_ids`` engine argument
            that disagrees.
    """
    ids = options.aux_layer_ids
    if ids is None:
        return {}
    from ...sglang.checkpoint import read_checkpoint
    from ...sglang.setters import explicit_ids_for, setter_rule

    target = read_checkpoint(model_path)
    arch, n = target.architecture, target.num_layers
    if n is None:
        raise InvalidArgumentError(f"{target.path}/config.json has no num_hidden_layers: cannot place aux layer ids")
    explicit = explicit_ids_for(arch, n, list(ids))  # validates the ids against this target (the one check)
    wanted = [int(i) for i in ids]
    if explicit is None:
        raise InvalidArgumentError(f"SGLang's {arch} setter cannot capture eagle-io ids {wanted} ({setter_rule(arch)})")
    given = engine_args.get("return_aux_hidden_state_layer_ids")
    if given is not None and [int(i) for i in given] != explicit:
        raise InvalidArgumentError(
            f"return_aux_hidden_state_layer_ids={list(given)} contradicts aux_layer_ids {wanted}, which SGLang's "
            f"{arch} setter captures from {explicit}"
        )
    return {"return_aux_hidden_state_layer_ids": explicit}


SERVER_CAPTURE_FLAGS = ("--enable-return-aux-hidden-states", "--speculative-algorithm", "EAGLE3")
"""SGLang 0.5.23's own flags for aux capture without a draft (``arg_groups/validation_hook.py``,
``handle_aux_hidden_state_capture``: the algorithm only names the convention and is reset to None); every other
setting stays SGLang's default unless given."""


def launch_capture_server(
    model_path: str | os.PathLike[str],
    options: CaptureOptions,
    log_path: str | os.PathLike[str],
    *,
    capture_roots: Sequence[str | os.PathLike[str]] = (),
    timeout_s: float = 900.0,
    env: Mapping[str, str] | None = None,
    **engine_args: Any,
) -> tuple[str, Any]:
    """Starts a server (:func:`launch_server`) over the HF checkpoint ``model_path`` in capture-only mode
    (:data:`SERVER_CAPTURE_FLAGS`, plus ``--return-aux-hidden-state-layer-ids`` for ``options.aux_layer_ids``:
    :func:`capture_layer_args`), SGLang's defaults otherwise (chunked prefill and the radix cache on). The capture
    itself is started over HTTP (:class:`~eagle_io.capturing.sglang.client.ServerCapture`), as for a server users
    launch; ``capture_roots`` are where it lets a client have it write (``EAGLE_IO_CAPTURE_ROOT``:
    :mod:`eagle_io.capturing.sglang.operator`), in ``env`` (default: this process' environment).

    Returns:
        ``(url, process)``; stop the server with :func:`eagle_io.sglang.servers.stop_server`.

    Raises:
        InvalidArgumentError: what :func:`capture_layer_args` refuses; engine arguments that contradict the capture.
        SGLangError: what :func:`launch_server` raises.
    """
    clash = {k for k in engine_args if k in ("enable_return_aux_hidden_states", "speculative_algorithm")}
    if clash or engine_args.get("speculative_draft_model_path"):
        raise InvalidArgumentError(f"engine arguments {sorted(clash)} are eagle-io's capture-only launch's own")
    engine_args = {**engine_args, **capture_layer_args(model_path, options, engine_args)}
    flags = ["--model-path", os.fspath(model_path), *SERVER_CAPTURE_FLAGS, *server_flags(engine_args)]
    if capture_roots:
        roots = ",".join(r if str(r).startswith("s3://") else os.path.abspath(r) for r in map(os.fspath, capture_roots))
        env = {**(os.environ if env is None else env), ENV_CAPTURE_ROOT: roots}
    return launch_server(flags, log_path, timeout_s=timeout_s, env=env)
