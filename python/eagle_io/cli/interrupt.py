"""Interrupts of the command line: SIGINT (Ctrl-C) and SIGTERM end a command with a line, not a traceback.

:func:`run` (``eagle_io.cli.main`` runs every command through it) turns SIGTERM into a ``KeyboardInterrupt``
(``_Terminated``), so the code that commits what a run did on Ctrl-C (the capture: ``eagle-io generate``) does the
same on SIGTERM, and an interrupt that reaches it into one line and :func:`exit_code`, the status each ends with (130
for SIGINT, 143 for SIGTERM: 128 + the signal, as a shell reports a process the signal killed). :func:`shielded`
lets the commit finish: a second signal while it runs is told to wait instead of leaving a half-written run.
"""

from __future__ import annotations

import contextlib
import os
import select
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence


class _Terminated(KeyboardInterrupt):
    """SIGTERM (or another signal :func:`signals` turns into an interrupt), as a ``KeyboardInterrupt``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def signal_name(exc: BaseException) -> str:
    """``"SIGINT"`` for Ctrl-C, ``"SIGTERM"``... for an interrupt :func:`run` raised on that signal."""
    return signal.Signals(getattr(exc, "signum", signal.SIGINT)).name


def exit_code(exc: BaseException) -> int:
    """128 + the signal: 130 for SIGINT (Ctrl-C), 143 for SIGTERM."""
    return 128 + int(getattr(exc, "signum", signal.SIGINT))


def _raise_terminated(signum: int, frame: object) -> None:
    raise _Terminated(signum)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _stdout_closed() -> bool:
    """Whether standard output is a pipe whose reader has gone (``poll`` reports ``POLLERR`` on its write end)."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
    except (AttributeError, OSError, ValueError):  # no poll (Windows), or stdout is not a file
        return False
    return any(events & select.POLLERR for _, events in poll.poll(0))


def run(command: str, body: Callable[[], int]) -> int:
    """``body()``'s exit code; an interrupt that reaches here (SIGINT, or SIGTERM, which raises a
    ``KeyboardInterrupt`` in the main thread while ``body`` runs) is one line on stderr and :func:`exit_code`.
    Outside the main thread (a test calling ``main``), the handlers are left as they are."""
    old = signal.signal(signal.SIGTERM, _raise_terminated) if _in_main_thread() else None
    try:
        return body()
    except KeyboardInterrupt as e:
        print(f"eagle-io {command}: interrupted ({signal_name(e)})", file=sys.stderr)
        return exit_code(e)
    except BrokenPipeError:
        if not _stdout_closed():
            raise  # another pipe or socket: not ours to hide
        # the reader of our output left (``| head``): what a shell's own tools do, quietly; 128 + SIGPIPE
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)


@contextlib.contextmanager
def shielded(what: str) -> Iterator[None]:
    """SIGINT and SIGTERM do not interrupt the block (committing what an interrupted run captured): each prints
    that ``what`` is under way, once the block ends the handlers are restored."""
    if not _in_main_thread():
        yield
        return

    def told(signum: int, frame: object) -> None:
        print(f"eagle-io: {signal.Signals(signum).name} received: still {what}; wait for it", file=sys.stderr)

    old = {s: signal.signal(s, told) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def rerun_command(argv: Sequence[str], flag: str = "--resume") -> str:
    """The command line ``argv`` was run with (``eagle-io`` + its arguments), with ``flag`` added if missing, quoted
    for a POSIX shell."""
    args = list(argv)
    if flag not in args:
        args.append(flag)
    return shlex.join(["eagle-io", *args])
