"""The launch arguments eagle-io's serving checks read: the target, the draft, the speculative algorithm and the
context length, from raw ``sglang serve`` / ``python -m sglang.launch_server`` arguments, a mapping of
``ServerArgs`` fields, or a live ``ServerArgs``. Nothing here imports SGLang at module import time.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .compat import resolve_algorithm

__all__ = ["LaunchArgs", "launch_args"]


@dataclass(frozen=True)
class LaunchArgs:
    """The launch arguments the serving checks read.

    ``algorithm`` is as given; ``resolved_algorithm`` is what SGLang runs (``NEXTN -> EAGLE``; read from
    ``sglang.srt.arg_groups.overrides.resolved_view`` when a resolved ``ServerArgs`` is given).
    """

    model_path: str | None = None
    draft_path: str | None = None
    algorithm: str | None = None
    resolved_algorithm: str | None = None
    context_length: int | None = None


def _launch_parser() -> argparse.ArgumentParser:
    # Flag spellings of sglang/srt/server_args.py (ServerArgs.add_cli_args); unknown flags are ignored.
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--model-path", "--model", dest="model_path")
    p.add_argument("--speculative-draft-model-path", "--speculative-draft-model", dest="draft_path")
    p.add_argument("--speculative-algorithm", dest="algorithm")
    p.add_argument("--context-length", dest="context_length", type=int)
    return p


def launch_args(server_args: Any) -> LaunchArgs:
    """Reads :class:`LaunchArgs` from raw SGLang launch arguments (``["--model-path", "m", ...]``, as given to
    ``python -m sglang.launch_server``), a mapping of ``ServerArgs`` field names, or a ``ServerArgs`` object.

    For a ``ServerArgs`` object the resolved view is used when resolution has run
    (``ServerArgs.resolve_once``; ``sglang.srt.arg_groups.overrides.resolved_view``), so ``NEXTN`` already reads
    ``EAGLE`` there; an unresolved object is resolved here by :func:`resolve_algorithm`'s rule.
    """
    if server_args is None:
        return LaunchArgs()
    if isinstance(server_args, (list, tuple)):
        ns, _ = _launch_parser().parse_known_args([str(a) for a in server_args])
        return LaunchArgs(
            ns.model_path, ns.draft_path, ns.algorithm, resolve_algorithm(ns.algorithm), ns.context_length
        )
    if isinstance(server_args, Mapping):
        get = server_args.get
    else:
        view = server_args
        if getattr(server_args, "_resolution_finished", False):
            try:
                from sglang.srt.arg_groups.overrides import resolved_view

                view = resolved_view(server_args)
            except ImportError:  # pragma: no cover - a ServerArgs without sglang cannot exist
                pass

        def get(key: str, default: Any = None) -> Any:
            return getattr(view, key, default)

    algo = get("speculative_algorithm")
    ctx = get("context_length")
    return LaunchArgs(
        model_path=get("model_path"),
        draft_path=get("speculative_draft_model_path"),
        algorithm=algo,
        resolved_algorithm=resolve_algorithm(algo),
        context_length=int(ctx) if isinstance(ctx, int) else None,
    )
