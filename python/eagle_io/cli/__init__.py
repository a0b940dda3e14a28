"""The ``eagle-io`` command line. One module per subcommand; each has ``add_parser`` and ``run``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..errors import EagleIOError
from . import (
    check_serving_cmd,
    eval_draft_cmd,
    generate_cmd,
    inspect_cmd,
    interrupt,
    live_cmd,
    merge_cmd,
    report_cmd,
    swap_draft_cmd,
    train_draft_cmd,
    transcode_cmd,
    verify_cmd,
    vocab_cmd,
)
from .layer_ids_arg import attach_id_lists
from .specforge_cmd import export_cmd, import_cmd
from .specforge_cmd import train_cmd as specforge_train_cmd
from .speculators_cmd import export_cmd as export_speculators_cmd
from .speculators_cmd import import_cmd as import_speculators_cmd

COMMANDS = {
    "generate": generate_cmd,
    "inspect": inspect_cmd,
    "verify": verify_cmd,
    "report": report_cmd,
    "merge": merge_cmd,
    "check-serving": check_serving_cmd,
    "import-specforge": import_cmd,
    "export-specforge": export_cmd,
    "specforge-train": specforge_train_cmd,
    "import-speculators": import_speculators_cmd,
    "export-speculators": export_speculators_cmd,
    "vocab-map": vocab_cmd,
    "train-draft": train_draft_cmd,
    "eval-draft": eval_draft_cmd,
    "transcode": transcode_cmd,
    "live": live_cmd,
    "swap-draft": swap_draft_cmd,
}


class HelpFormatter(argparse.HelpFormatter):
    """Each option's help ends with its default (``(default: 2048)``; ``(default: none)`` for a repeatable option
    given no value) unless the text already says it, or there is none to show (``None``, a flag's ``False``)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        none = action.default is None or action.default is False or action.default == ""
        shown = action.option_strings and not none and action.default is not argparse.SUPPRESS
        if not shown or "default" in text:
            return text
        return f"{text} (default: none)" if action.default == [] else f"{text} (default: %(default)s)"


def build_parser() -> argparse.ArgumentParser:
    """The ``eagle-io`` parser: one subparser per :data:`COMMANDS` entry."""
    parser = argparse.ArgumentParser(prog="eagle-io", description="EAGLE-3 draft training data tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, mod in COMMANDS.items():
        mod.add_parser(sub.add_parser(name, help=mod.__doc__, description=mod.__doc__, formatter_class=HelpFormatter))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``eagle-io``. Returns the process exit code (0 ok, 1 problems found, 2 errors; 130 / 143
    interrupted by SIGINT / SIGTERM: :mod:`.interrupt`)."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(attach_id_lists(argv))
    args.argv = argv  # what a rerun repeats (generate's --resume line after an interrupt)

    def body() -> int:
        try:
            return COMMANDS[args.command].run(args)
        except EagleIOError as e:
            print(f"eagle-io {args.command}: {type(e).__name__}: {e}", file=sys.stderr)
            return 2

    return interrupt.run(args.command, body)


if __name__ == "__main__":
    sys.exit(main())
