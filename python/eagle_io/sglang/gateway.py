"""Reaching SGLang workers directly or through SGLang's gateway (SMG, PyPI ``smg``; read from 1.13.0), as one
:class:`Route` per worker: :func:`routes` finds them from the URL a user gives.

A URL is an SGLang server when it answers ``GET /server_info``. SMG answers 404 there (it serves no worker's
``/server_info`` at its root); launched with ``--enable-rl`` its control plane lists the workers
(``GET /v1/rl/workers``) and forwards an engine route to one of them verbatim
(``POST /v1/rl/workers/{id}/engine/{path}``, answered as ``{"status", "latency_ms", "body"}``). Users' traffic (and
eagle-io's sample requests) goes to the gateway's own ``/generate`` and ``/v1/chat/completions``, which its routing
policy sends on to a worker. Keys (:class:`~eagle_io.sglang.servers.ServerKeys`): ``api_key`` is the gateway's
inference key (``smg --api-key``, which SMG itself sends to the workers), ``admin_api_key`` a control-plane key of the
admin role (``--control-plane-api-keys ID:NAME:admin:KEY``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from .. import defaults
from ..errors import InvalidArgumentError, SGLangError
from .servers import ServerKeys, http_json, server_url

__all__ = ["Route", "routes"]

logger = logging.getLogger("eagle_io.capture")

WORKERS_PATH = "/v1/rl/workers"
"""SMG's control-plane route listing its workers (``--enable-rl``)."""


@dataclass(frozen=True)
class Route:
    """How a client reaches one SGLang worker.

    Attributes:
        url: the URL the user gave (the server's, or the gateway's): what secrets are kept under.
        generate_url: where sample and served requests go (``{server}/generate`` or ``{gateway}/generate``).
        engine: where the worker's own routes are reached (the server, or
            ``{gateway}/v1/rl/workers/{id}/engine``).
        name: what messages call it: the server's URL, or ``"{gateway} worker {id} ({worker url})"``.
        worker_id: the gateway's id of the worker; None for a server reached directly.
    """

    url: str
    generate_url: str
    engine: str
    name: str
    worker_id: str | None = None

    @classmethod
    def direct(cls, url: str) -> Route:
        """The route to the SGLang server at ``url`` (:func:`~eagle_io.sglang.servers.server_url`), not probed."""
        url = server_url(url)
        return cls(url, f"{url}/generate", url, url)

    @property
    def via_gateway(self) -> bool:
        return self.worker_id is not None

    def call(self, path: str, body: Mapping[str, Any] | None = None, *, keys: ServerKeys | None, control: bool = False,
             timeout_s: float = defaults.SERVER_REQUEST_TIMEOUT_S) -> Any:  # fmt: skip
        """GET (``body`` None) or POST the worker's route ``path`` (e.g. ``"server_info"``); its JSON answer. Through
        a gateway it goes to its control plane, which forwards the method and body verbatim (with the control-plane
        key: ``control`` is implied; SMG sends the worker its own ``--api-key``), and the worker's own answer is
        unwrapped.

        Raises:
            SGLangError: the worker's (or the gateway's) HTTP error, naming :attr:`name` and the route.
        """
        if not self.via_gateway:
            return http_json(f"{self.engine}/{path}", body, timeout_s=timeout_s, keys=keys, control=control)
        answer = http_json(f"{self.engine}/{path}", body, timeout_s=timeout_s, keys=keys, control=True)
        status = answer.get("status") if isinstance(answer, dict) else None
        if not isinstance(status, int):
            raise SGLangError(f"{self.name}: /{path}: the gateway's answer is not SMG's forward ({str(answer)[:200]})")
        if status in (401, 403):
            raise SGLangError(
                f"{self.name}: /{path}: HTTP {status}: the worker refused the key the gateway sends it (SMG's "
                "--api-key): behind SMG a worker is launched with --api-key set to the gateway's and no "
                "--admin-api-key, which would refuse the gateway's key on SGLang's admin routes",
                status=status,
            )
        if status >= 400:
            raise SGLangError(f"{self.name}: /{path}: HTTP {status}: {str(answer.get('body'))[:500]}", status=status)
        return answer.get("body")


def routes(url: str, *, keys: ServerKeys | None = None,
           timeout_s: float = defaults.SERVER_REQUEST_TIMEOUT_S) -> list[Route]:  # fmt: skip
    """The workers behind ``url``: the server itself, or every healthy SGLang worker SMG's control plane lists (in
    its order).

    Raises:
        InvalidArgumentError: ``url`` is a gateway launched without its control plane (naming ``--enable-rl``), one
            that lists no healthy SGLang worker, or answers neither as SGLang nor as SMG.
        SGLangError: no answer, or a key refused (naming the option to pass).
    """
    url = server_url(url)
    try:
        http_json(f"{url}/server_info", timeout_s=timeout_s, keys=keys)
        return [Route.direct(url)]
    except SGLangError as e:
        if e.status != 404:
            raise
    try:
        listed = http_json(f"{url}{WORKERS_PATH}", timeout_s=timeout_s, keys=keys, control=True)
    except SGLangError as e:
        if e.status != 404:
            raise
        raise InvalidArgumentError(
            f"{url} answers neither GET /server_info (an SGLang server) nor GET {WORKERS_PATH} (SGLang's gateway, "
            "SMG, with its control plane): if it is SMG, relaunch it with --enable-rl (and --control-plane-api-keys "
            "ID:NAME:admin:KEY, that key passed here as --admin-api-key): eagle-io reaches each worker through it"
        ) from None
    workers = listed.get("workers") if isinstance(listed, dict) else listed
    out = []
    for w in workers or []:
        if w.get("engine") != "sglang" or w.get("health") != "ready":
            logger.warning("eagle-io: %s worker %s (%s) is left out: engine %s, health %s", url, w.get("id"),
                           w.get("url"), w.get("engine"), w.get("health"))  # fmt: skip
            continue
        wid = str(w["id"])
        name = f"{url} worker {wid} ({w.get('url')})"
        out.append(Route(url, f"{url}/generate", f"{url}{WORKERS_PATH}/{quote(wid, safe='')}/engine", name, wid))
    if not out:
        raise InvalidArgumentError(f"the gateway at {url} lists no healthy SGLang worker ({WORKERS_PATH}: "
                                   f"{str(listed)[:300]}); workers register in the background: retry")  # fmt: skip
    return out
