"""Talking to SGLang servers: one JSON-over-HTTP call (:func:`http_json`) and one launcher (:func:`launch_server`,
:func:`stop_server`, with :func:`server_flags` for its flags), shared by the capture client, the served accept
length (``eagle_io.spec``), the tests and the benches.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import SGLangError

__all__ = [
    "ENV_ADMIN_API_KEY",
    "ENV_API_KEY",
    "ServerKeys",
    "http_json",
    "launch_server",
    "server_flags",
    "server_url",
    "stop_server",
]

ENV_API_KEY = "EAGLE_IO_API_KEY"
ENV_ADMIN_API_KEY = "EAGLE_IO_ADMIN_API_KEY"


@dataclass(frozen=True)
class ServerKeys:
    """The keys a client sends an SGLang server, as SGLang 0.5.23 checks them (``srt/utils/auth.py``): ``api_key``
    (``--api-key``) on every route, and on the routes it marks ``ADMIN_OPTIONAL`` (``/set_internal_state``, the
    weight updates) the ``admin_api_key`` (``--admin-api-key``) when there is one, else the api key; each as
    ``Authorization: Bearer KEY``. Never printed (``repr`` shows which are set)."""

    api_key: str | None = None
    admin_api_key: str | None = None

    @classmethod
    def resolve(cls, api_key: str | None = None, admin_api_key: str | None = None) -> ServerKeys:
        """The keys given, else those of ``EAGLE_IO_API_KEY`` / ``EAGLE_IO_ADMIN_API_KEY``."""
        return cls(api_key or os.environ.get(ENV_API_KEY) or None,
                   admin_api_key or os.environ.get(ENV_ADMIN_API_KEY) or None)  # fmt: skip

    def bearer(self, control: bool) -> str | None:
        """The key for a control (admin) route, or for any other route."""
        return (self.admin_api_key or self.api_key) if control else self.api_key

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={'set' if getattr(self, k) else None}" for k in ("api_key", "admin_api_key"))
        return f"ServerKeys({shown})"


def server_url(url: str) -> str:
    """A server's base URL as eagle-io sends requests to it: ``http://`` or ``https://`` (a bare ``host:port`` is read
    as ``http://host:port``), no trailing slash. Checked before anything is sent.

    Raises:
        InvalidArgumentError: another scheme, or text that is no ``host:port`` (naming how to write it).
    """
    import re

    from ..errors import InvalidArgumentError

    u = str(url).strip().rstrip("/")
    if "://" not in u:
        if re.fullmatch(r"(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.\-]+):\d{1,5}", u):
            return f"http://{u}"
        raise InvalidArgumentError(f"server URL {url!r}: write it as http://HOST:PORT (an SGLang server's address)")
    scheme = u.split("://", 1)[0].lower()
    if scheme not in ("http", "https"):
        raise InvalidArgumentError(
            f"server URL {url!r}: SGLang servers answer over http:// or https://, not {scheme}://; write http://HOST:PORT"
        )
    return u


def http_json(
    url: str,
    body: Mapping[str, Any] | None = None,
    timeout_s: float = 30.0,
    *,
    keys: ServerKeys | None = None,
    control: bool = False,
) -> Any:
    """GET (``body`` None) or POST JSON to ``url`` with ``keys`` (``control``: an admin route); the decoded JSON
    answer (None for an empty body).

    Raises:
        SGLangError: an HTTP error status (``status`` set; the body's first 500 characters in the message; a 401 or
            403 names the key option to pass), no connection (``status`` None), or an answer that is not JSON, naming
            the URL.
    """
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    bearer = keys.bearer(control) if keys is not None else None
    if bearer:
        headers["Authorization"] = f"Bearer {bearer}"
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            raw = r.read()
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            option, env = ("--admin-api-key", ENV_ADMIN_API_KEY) if control else ("--api-key", ENV_API_KEY)
            said = "refused the key sent" if bearer else "needs a key"
            raise SGLangError(f"{url}: HTTP {e.code}: the server {said}: pass {option} (or set {env})",
                              status=e.code) from e  # fmt: skip
        detail = e.read()[:500].decode(errors="replace")
        raise SGLangError(f"{url}: HTTP {e.code}: {detail}", status=e.code) from e
    except TimeoutError as e:
        raise SGLangError(f"{url}: no answer within {timeout_s:.0f} s (the timeout; something listens there but does "
                          "not answer as an SGLang server, or it is busy)", status=None) from e  # fmt: skip
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        if isinstance(reason, TimeoutError):
            raise SGLangError(f"{url}: no answer within {timeout_s:.0f} s (the timeout)", status=None) from e
        raise SGLangError(f"{url}: no answer ({reason})", status=None) from e
    try:
        return json.loads(raw or b"null")
    except ValueError as e:
        raise SGLangError(f"{url}: the answer is not JSON ({raw[:200]!r})", status=None) from e


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
            log's last lines quoted; or every one of 3 free ports was taken by another process before the server bound
            it (each attempt's server stopped, a new port tried).
    """
    for _ in range(_PORT_ATTEMPTS):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "sglang.launch_server", *flags, "--host", "127.0.0.1", "--port", str(port)]
        start = os.path.getsize(log_path) if os.path.exists(log_path) else 0
        log = open(log_path, "ab")  # noqa: SIM115 (held by the server process for its life)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        log.close()
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + timeout_s
        while True:
            if _lost_its_port(log_path, start):  # another process took the free port first: SGLang lingers on
                stop_server(proc)
                break
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
                why = (
                    f"exited with {proc.returncode}"
                    if proc.returncode is not None
                    else f"no answer in {timeout_s:.0f} s"
                )
                raise SGLangError(f"sglang.launch_server ({' '.join(cmd)}) {why}; its log {log_path} ends:\n{tail}")
            time.sleep(1.0)
    raise SGLangError(f"sglang.launch_server: {_PORT_ATTEMPTS} free ports of 127.0.0.1 were taken before it bound them")


_PORT_ATTEMPTS = 3


def _lost_its_port(log_path: str | os.PathLike[str], start: int) -> bool:
    """Whether the server's log (from byte ``start``) says uvicorn could not bind its port."""
    with open(log_path, "rb") as f:
        f.seek(start)
        return b"error while attempting to bind on address" in f.read()


def stop_server(proc: Any, timeout_s: float = 60.0) -> None:
    """Ends a server :func:`launch_server` started: SIGTERM to its process group, SIGKILL after
    ``timeout_s``."""
    import signal

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
