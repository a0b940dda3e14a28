"""The command-line form of aux layer ids, shared by every subcommand that takes them."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence

__all__ = ["attach_id_lists", "layer_ids_arg"]

#: A value argparse would take for an option: "-1,2,3" (a negative first id) starts with "-".
_DASHED_LIST = re.compile(r"^-\d+\s*(,\s*-?\d+\s*)*$")


def layer_ids_arg(text: str) -> list[int]:
    """``argparse`` type for ``--aux-layer-ids 2,15,27`` and the like: comma-separated integers (spaces allowed).

    Only the syntax is checked here; the range (``1..N`` of the target, which the parser does not know) is checked
    by :func:`eagle_io.store.eagle3.validate_aux_layer_ids` where the target is known, which raises
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


def attach_id_lists(argv: Sequence[str]) -> list[str]:
    """``--aux-layer-ids -1,2,3`` -> ``--aux-layer-ids=-1,2,3`` for every ``--*-layer-ids`` option.

    argparse reads a value starting with ``-`` (other than one plain negative number) as an option and printed
    ``expected one argument``, hiding the real problem; attached, the ids reach the range check, which names
    the bad id.
    """
    out: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        tok = args[i]
        if (
            tok.startswith("--")
            and tok.endswith("-layer-ids")
            and i + 1 < len(args)
            and _DASHED_LIST.match(args[i + 1])
        ):
            out.append(f"{tok}={args[i + 1]}")
            i += 2
        else:
            out.append(tok)
            i += 1
    return out
