"""``--api-key`` / ``--admin-api-key``: SGLang's keys, on every command that talks to a running server (``generate
--server``, ``live``, ``eval-draft --server``, ``swap-draft``); each falls back to its environment variable, and is
never printed."""

from __future__ import annotations

import argparse

from ..sglang.servers import ENV_ADMIN_API_KEY, ENV_API_KEY


def add_key_args(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Adds both options to ``p`` (values None when not given: :class:`eagle_io.sglang.servers.ServerKeys` then reads
    the environment)."""
    p.add_argument("--api-key", metavar="KEY",
                   help=f"the server's --api-key, sent on every request; for SGLang's gateway, its --api-key (default "
                        f"${ENV_API_KEY})")  # fmt: skip
    p.add_argument("--admin-api-key", metavar="KEY",
                   help=f"the server's --admin-api-key, sent on its control routes (/set_internal_state, the weight "
                        f"updates); for SGLang's gateway, a control-plane key of the admin role (default "
                        f"${ENV_ADMIN_API_KEY})")  # fmt: skip
