"""Launching SGLang: a server on a free local port (:func:`launch_server`, :func:`stop_server`); in capture-only mode
a server (:func:`launch_capture_server`, what ``eagle-io generate --backend sglang`` does before capturing through it
over HTTP, as from any server), or an in-process ``sglang.Engine`` with
eagle-io's capture started by environment in every scheduler process whatever ``tp_size`` / ``dp_size``
(:func:`launch_capture_engine`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import InvalidArgumentError
from ...store.upload import local_dir
from ..options import CaptureOptions
from .client import refuse_writer_ranks
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


def launch_capture_engine(
    model_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    options: CaptureOptions,
    **engine_args: Any,
) -> Any:
    """Starts an ``sglang.Engine`` over the HF checkpoint ``model_path`` whose schedulers capture into ``out_dir``
    (a directory, or an object-storage prefix ``s3://bucket/run`` staged in ``options["writer_options"]["staging"]``,
    each shard uploaded as it commits: docs/STORAGE.md).

    Args:
        options: the capture's :class:`~eagle_io.capturing.options.CaptureOptions`, handed to every scheduler
            through ``EAGLE_IO_CAPTURE_OPTIONS`` (JSON); writer ranks are refused (the data-parallel layout sets them).
        engine_args: further ``sglang.Engine`` arguments (``tp_size``, ``dp_size``, ``device``,
            ``attention_backend``, ``mem_fraction_static``...); they may not contradict
            :data:`CAPTURE_ENGINE_ARGS`. ``options["aux_layer_ids"]`` become ``return_aux_hidden_state_layer_ids``
            (:func:`capture_layer_args`), checked against the target before anything is launched.

    Returns:
        The engine; attach with ``SGLangCaptureSession(engine, out_dir, started=True)`` (plus ``staging=`` for an
        object-storage ``out_dir``).

    Raises:
        InvalidArgumentError: an engine argument that contradicts capture-only mode, aux layer ids the target
            cannot capture (:func:`capture_layer_args`), or writer ranks set by hand.
    """
    refuse_writer_ranks(options)
    clash = {k: v for k, v in engine_args.items() if k in CAPTURE_ENGINE_ARGS and v != CAPTURE_ENGINE_ARGS[k]}
    if clash:
        raise InvalidArgumentError(f"engine arguments {clash} contradict eagle-io's capture-only mode")
    engine_args = {**engine_args, **capture_layer_args(model_path, options, engine_args)}
    import sglang

    out_dir = os.fspath(out_dir)
    # The stop and answer files' directory (the staging of an s3:// out_dir); a stop file left there by an
    # interrupted stop is ignored (its token).
    os.makedirs(local_dir(out_dir, options.writer_options.get("staging")), exist_ok=True)
    saved = {k: os.environ.get(k) for k in (ENV_CAPTURE_DIR, ENV_CAPTURE_OPTIONS)}
    os.environ[ENV_CAPTURE_DIR], os.environ[ENV_CAPTURE_OPTIONS] = out_dir, json.dumps(options.to_json())
    try:  # the scheduler processes are spawned here and keep this environment
        return sglang.Engine(model_path=os.fspath(model_path), **{**CAPTURE_ENGINE_ARGS, **engine_args})
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


SERVER_CAPTURE_FLAGS = ("--enable-return-aux-hidden-states", "--speculative-algorithm", "EAGLE3")
"""SGLang 0.5.23's own flags for aux capture without a draft (``arg_groups/validation_hook.py``,
``handle_aux_hidden_state_capture``: the algorithm only names the convention and is reset to None); every other
setting stays SGLang's default unless given."""


def server_flags(engine_args: Mapping[str, Any]) -> list[str]:
    """``python -m sglang.launch_server`` flags of ``sglang.Engine`` keyword arguments: ``--key-with-dashes VALUE``,
    a True boolean as the bare flag, False left out, a list or dict as JSON."""
    out: list[str] = []
    for k, v in engine_args.items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            out.append(flag)
        elif v is False or v is None:
            continue
        elif isinstance(v, (list, tuple)):
            out += [flag, *(str(x) for x in v)]
        else:
            out += [flag, json.dumps(v) if isinstance(v, dict) else str(v)]
    return out


def launch_capture_server(
    model_path: str | os.PathLike[str],
    options: CaptureOptions,
    log_path: str | os.PathLike[str],
    *,
    timeout_s: float = 900.0,
    env: Mapping[str, str] | None = None,
    **engine_args: Any,
) -> tuple[str, Any]:
    """Starts a server (:func:`launch_server`) over the HF checkpoint ``model_path`` in capture-only mode
    (:data:`SERVER_CAPTURE_FLAGS`, plus ``--return-aux-hidden-state-layer-ids`` for ``options.aux_layer_ids``:
    :func:`capture_layer_args`), SGLang's defaults otherwise (chunked prefill and the radix cache on). The capture
    itself is started over HTTP (:class:`~eagle_io.capturing.sglang.server.ServerCapture`), as for a server users
    launch.

    Returns:
        ``(url, process)``; stop the server with :func:`stop_server`.

    Raises:
        InvalidArgumentError: what :func:`capture_layer_args` refuses; engine arguments that contradict the capture.
        SGLangError: what :func:`launch_server` raises.
    """
    clash = {k for k in engine_args if k in ("enable_return_aux_hidden_states", "speculative_algorithm")}
    if clash or engine_args.get("speculative_draft_model_path"):
        raise InvalidArgumentError(f"engine arguments {sorted(clash)} are eagle-io's capture-only launch's own")
    engine_args = {**engine_args, **capture_layer_args(model_path, options, engine_args)}
    flags = ["--model-path", os.fspath(model_path), *SERVER_CAPTURE_FLAGS, *server_flags(engine_args)]
    return launch_server(flags, log_path, timeout_s=timeout_s, env=env)


def launch_server(
    flags: Sequence[str],
    log_path: str | os.PathLike[str],
    *,
    timeout_s: float = 900.0,
    env: Mapping[str, str] | None = None,
) -> tuple[str, Any]:
    """Starts ``python -m sglang.launch_server`` with ``flags`` (:func:`server_flags` makes them from engine
    arguments) on a free port of 127.0.0.1, in a process group of its own (a terminal's Ctrl-C does not reach it: the
    client stops its capture first), its output appended to ``log_path``, in ``env`` (default: this process'
    environment); waits until ``GET /health`` answers 200, which SGLang gives once its start-up warm-up request has
    been served (``ServerStatus.Up``, ``_execute_server_warmup`` in ``sglang.srt.entrypoints.http_server``).

    Returns:
        ``(url, process)``; stop the server with :func:`stop_server`.

    Raises:
        SGLangError: the server exited (its exit status), or did not answer within ``timeout_s``; the command and the
            log's last lines quoted.
    """
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    from ...errors import SGLangError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "sglang.launch_server", *flags, "--host", "127.0.0.1", "--port", str(port)]
    log = open(log_path, "ab")  # noqa: SIM115 (held by the server process for its life)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    log.close()
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                if r.status == 200:
                    return url, proc
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_server(proc)
            with open(log_path, "rb") as f:
                tail = f.read()[-3000:].decode(errors="replace")
            why = f"exited with {proc.returncode}" if proc.returncode is not None else f"no answer in {timeout_s:.0f} s"
            raise SGLangError(f"sglang.launch_server ({' '.join(cmd)}) {why}; its log {log_path} ends:\n{tail}")
        time.sleep(1.0)


def stop_server(proc: Any, timeout_s: float = 60.0) -> None:
    """Ends a server :func:`launch_server` started: SIGTERM to its process group, SIGKILL after
    ``timeout_s``."""
    import signal
    import subprocess

    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass
