"""The paths a command will read and write, checked before it loads or computes anything: an output in a directory
that does not exist, under a file, or where this user cannot write was found only when the work was done (``report
--out`` in a missing directory after every figure was computed, ``generate --summary-json`` after the whole
capture, as a traceback), an input that is not there after the target had loaded (``generate --dataset``,
``eval-draft --prompts-file``, ``train-draft --vocab-map``)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from ..errors import InvalidArgumentError
from ..store import layout


def check_output(option: str, path: str | os.PathLike[str] | None, *, directory: bool, makes_parents: bool) -> None:
    """Refuses an output path the command could not write: ``path`` a directory where a file is written (or a file
    where a directory is), a path under a file, a missing parent directory when the command does not create it
    (``makes_parents`` False), or a directory this user cannot write in. None and object-storage URLs pass.

    Raises:
        InvalidArgumentError: ``"{option} {path}: {what is wrong}; {what to do}"``.
    """
    if path is None or layout.is_url(path):
        return
    p = Path(os.path.abspath(path))
    where = f"{option} {os.fspath(path)}"
    if p.exists():
        if directory and not p.is_dir():
            raise InvalidArgumentError(f"{where}: is a file, not a directory; pass a directory (new or existing)")
        if not directory and p.is_dir():
            raise InvalidArgumentError(f"{where}: is a directory; pass the name of the file to write")
        _check_can_write(where, p if directory else p.parent)
        return
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise InvalidArgumentError(f"{where}: {parent} is a file, not a directory; pass a path in a directory")
    if not makes_parents and parent != p.parent:
        raise InvalidArgumentError(
            f"{where}: its directory {p.parent} does not exist; create it first, or pass a path in an existing one"
        )
    _check_can_write(where, parent)


def check_input(option: str, path: str | os.PathLike[str] | None, what: str) -> None:
    """Refuses an input file the command could not read (missing, a directory, not readable); None and
    object-storage URLs pass. ``what``: the file expected, for the message.

    Raises:
        InvalidArgumentError: ``"{option} {path}: cannot read it ({why}); pass {what}"``.
    """
    if path is None or layout.is_url(path):
        return
    try:
        open(path, "rb").close()
    except OSError as e:
        raise InvalidArgumentError(
            f"{option} {os.fspath(path)}: cannot read it ({e.strerror or e}); pass {what}"
        ) from e


def _check_can_write(where: str, directory: Path) -> None:
    if not os.access(directory, os.W_OK | os.X_OK):
        raise InvalidArgumentError(
            f"{where}: cannot write in {directory} ({os.strerror(errno.EACCES)}); pass a path this user can write"
        )
