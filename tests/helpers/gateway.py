"""SGLang's gateway (SMG, PyPI ``smg``) in front of running workers, as a fleet operator launches it: the one place
tests and benches start one (``smg launch``), stopped with :func:`eagle_io.sglang.servers.stop_server`."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def smg_binary() -> str | None:
    """The ``smg`` command of this Python's environment, or None when SMG is not installed."""
    here = Path(sys.executable).with_name("smg")
    return str(here) if here.exists() else shutil.which("smg")


def launch_gateway(
    worker_urls: Sequence[str],
    log_path: str | os.PathLike[str],
    *,
    api_key: str | None = None,
    control_key: str | None = None,
    control_plane: bool = True,
    timeout_s: float = 120.0,
) -> tuple[str, subprocess.Popen]:
    """``smg launch --worker-urls ...`` on free ports of 127.0.0.1 (its own Prometheus port: two gateways on one
    machine need two), with ``--enable-rl`` when ``control_plane``, ``--api-key`` (the workers' key too) and a
    control-plane key of the admin role; waits until its control plane lists every worker ready (workers register in
    the background, after the gateway's ``/health`` answers), or, without a control plane, until ``/health`` answers.

    Returns:
        ``(url, process)``.
    """
    port = _free_port()
    cmd = [smg_binary() or "smg", "launch", "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *worker_urls,
           "--prometheus-port", str(_free_port())]  # fmt: skip
    if control_plane:
        cmd.append("--enable-rl")
    if api_key:
        cmd += ["--api-key", api_key]
    if control_key:
        cmd += ["--control-plane-api-keys", f"ops:ops:admin:{control_key}"]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if _ready(url, len(worker_urls), control_key if control_plane else None, control_plane):
            return url, proc
        time.sleep(0.5)
    proc.kill()
    tail = Path(log_path).read_text()[-2000:]
    raise RuntimeError(f"{' '.join(cmd)}: not ready in {timeout_s:.0f} s; its log ends: {tail}")


def _ready(url: str, workers: int, control_key: str | None, control_plane: bool) -> bool:
    path = "/v1/rl/workers" if control_plane else "/health"
    headers = {"Authorization": f"Bearer {control_key}"} if control_key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url + path, headers=headers), timeout=5) as r:
            if not control_plane:
                return r.status == 200
            listed = json.loads(r.read())["workers"]
    except (OSError, urllib.error.URLError, ValueError, KeyError):
        return False
    return sum(w.get("health") == "ready" for w in listed) == workers


def _control(gateway: str, method: str, path: str, control_key: str | None, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    headers = {
        "Content-Type": "application/json",
        **({"Authorization": f"Bearer {control_key}"} if control_key else {}),
    }
    req = urllib.request.Request(gateway + path, data=data, headers=headers, method=method)
    with urllib.request.urlopen(req, timeout=30) as r:
        raw = r.read()
    return json.loads(raw) if raw else {}


def add_worker(gateway: str, worker_url: str, control_key: str | None, api_key: str | None = None,
               timeout_s: float = 180.0) -> str:  # fmt: skip
    """Adds a running worker to the gateway as an operator does (SMG's ``POST /workers {"url", "api_key"}``: a worker
    added at run time does not get the gateway's ``--api-key``, its own is given; answered ``accepted`` and
    registered in the background); returns its id once the control plane lists it ready."""
    body = {"url": worker_url, **({"api_key": api_key} if api_key else {})}
    wid = _control(gateway, "POST", "/workers", control_key, body)["worker_id"]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        listed = _control(gateway, "GET", "/v1/rl/workers", control_key)["workers"]
        if any(w["id"] == wid and w.get("health") == "ready" for w in listed):
            return wid
        time.sleep(0.5)
    raise RuntimeError(f"{gateway}: worker {worker_url} ({wid}) not listed ready within {timeout_s:.0f} s")


def remove_worker(gateway: str, worker_url: str, control_key: str | None, timeout_s: float = 60.0) -> None:
    """Removes the worker at ``worker_url`` from the gateway (SMG's ``DELETE /workers/{id}``); returns once the
    control plane no longer lists it."""
    listed = _control(gateway, "GET", "/v1/rl/workers", control_key)["workers"]
    for w in listed:
        if w["url"] == worker_url:
            _control(gateway, "DELETE", f"/workers/{w['id']}", control_key)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(w["url"] != worker_url for w in _control(gateway, "GET", "/v1/rl/workers", control_key)["workers"]):
            return
        time.sleep(0.5)
    raise RuntimeError(f"{gateway}: worker {worker_url} still listed {timeout_s:.0f} s after its removal")
