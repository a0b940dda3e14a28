"""The command-line form of aux layer ids, shared by every subcommand that takes them."""

from __future__ import annotations

import argparse

__all__ = ["layer_ids_arg"]


def layer_ids_arg(text: str) -> list[int]:
    """``argparse`` type for ``--aux-layer-ids 2,15,27`` and the like: comma-separated integers (spaces allowed).

    Only the syntax is checked here; the range (``1..N`` of the target, which the parser does not know) is checked
    by :func:`eagle_io.capturing.layers.validate_aux_layer_ids` where the target is known, which raises
    ``InvalidArgumentError`` (printed as one line by :func:`eagle_io.cli.main`).

    Raises:
        argparse.ArgumentTypeError: empty text, an empty item (``2,,5``) or a non-integer item (argparse prints
            the usage and one error line and exits with status 2).
    """
    items = [x.strip() for x in text.split(",")]
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    if not all(items):  # "2,,5" is a dropped id, not [2, 5]
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r} (an empty item)")
    try:
        return [int(x) for x in items]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from e
