"""TEST-ONLY: the capture client's HTTP calls answered in this process by the scheduler side's own control and status
hooks (``_control_hook``, ``_status_hook`` of ``eagle_io.capturing.sglang.scheduler``), as SGLang's
``/set_internal_state`` and ``/server_info`` would answer them from one DP rank: the same commands and statuses, no
server. SGLang's ``SetInternalStateReqOutput`` is imported by the hook, so SGLang must be importable."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

URL = "http://scheduler.test"


def route_to_scheduler(monkeypatch: Any, scheduler: Any = None) -> str:
    """Patches the HTTP call of the client's routes (``eagle_io.sglang.gateway.http_json``) so that
    ``URL/set_internal_state`` and ``URL/server_info`` reach this process's active scheduler capture as a scheduler
    ``scheduler`` (its ``server_args`` say which keys SGLang checked: none by default); returns ``URL``. The target
    facts of the status are a writing rank's."""
    from eagle_io.capturing.sglang import scheduler as sc
    from eagle_io.sglang import gateway

    monkeypatch.setattr(sc, "_FACTS", {"writes": True, "writers": 1})

    def http_json(url: str, body: Any = None, timeout_s: float = 30.0, **_: Any) -> Any:
        if url == f"{URL}/set_internal_state":
            req = SimpleNamespace(server_args=body["server_args"])
            out = sc._control_hook(lambda *a, **k: SimpleNamespace(updated=False), scheduler, req)
            return [out.updated]  # SGLang answers a bool per DP rank (TokenizerManager.set_internal_state)
        if url == f"{URL}/server_info":
            state: dict[str, Any] = {}
            sc._status_hook(SimpleNamespace(internal_state=state), scheduler)
            return {"internal_states": [state]}
        raise AssertionError(f"no route for {url}")

    monkeypatch.setattr(gateway, "http_json", http_json)
    return URL
