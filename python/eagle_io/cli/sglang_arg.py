"""``--sglang-arg KEY=VALUE``: further ``sglang.Engine`` keyword arguments given on the command line (``generate
--backend sglang``, ``eval-draft --engine sglang``)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from ..errors import InvalidArgumentError


def parse_sglang_args(pairs: Iterable[str]) -> dict[str, Any]:
    """``{KEY: VALUE}`` with each VALUE read as JSON (``true``, ``0.3``, ``[1, 2]``), else kept as a string.

    Raises:
        InvalidArgumentError: a pair that is not ``KEY=VALUE``.
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidArgumentError(f"--sglang-arg {pair!r} is not KEY=VALUE")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out
