"""The launch arguments eagle-io's serving checks read: the target, the draft, the speculative algorithm, the context
length and whether Ray runs the schedulers, from raw ``sglang serve`` / ``python -m sglang.launch_server``
arguments, a mapping of ``ServerArgs`` fields, or a live ``ServerArgs``.

Raw arguments are parsed as SGLang parses them when SGLang is importable: its own parser
(``srt/server_args.py``, ``prepare_server_args``: ``argparse.ArgumentParser(prog="sglang serve")`` filled by
``ServerArgs.add_cli_args``, abbreviations allowed, so ``--speculative-algo EAGLE3`` is ``--speculative-algorithm``)
and its ``--config FILE`` merge (``srt/utils/server_args_config_parser.py``, ``ConfigArgumentMerger``: the YAML's
keys become flags, command-line arguments win). Without SGLang a small parser reads the four flags eagle-io needs,
spelled out in full; it refuses ``--config`` and an abbreviation of them rather than misread them
(:attr:`LaunchArgs.parser` says which ran). Nothing here imports SGLang at module import time.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgumentError
from .compat import resolve_algorithm

__all__ = ["LaunchArgs", "launch_args", "reader"]


@dataclass(frozen=True)
class LaunchArgs:
    """The launch arguments the serving checks read.

    ``algorithm`` is as given; ``resolved_algorithm`` is what SGLang runs (``NEXTN -> EAGLE``; read from
    ``sglang.srt.arg_groups.overrides.resolved_view`` when a resolved ``ServerArgs`` is given). ``use_ray``: the
    schedulers run as Ray actors (``--use-ray``). ``parser``: who read raw arguments, ``"sglang"`` (SGLang's own
    parser) or ``"eagle-io"`` (the fallback without SGLang); None for a mapping or a ``ServerArgs``.
    ``config_ignored``: a config file SGLang parses as ``--config`` but never reads: ``prepare_server_args`` merges
    the file only when the exact token ``--config`` is in argv (``"--config" in argv``;
    ``ConfigArgumentMerger._extract_config_file_path`` looks for that token too), so ``--config=launch.yaml`` or an
    abbreviation (``--conf launch.yaml``) launches without the file's settings, silently; beside an exact
    ``--config b.yaml``, a ``--config=a.yaml`` is parsed and ``a.yaml`` never read.
    """

    model_path: str | None = None
    draft_path: str | None = None
    algorithm: str | None = None
    resolved_algorithm: str | None = None
    context_length: int | None = None
    num_steps: int | None = None  # --speculative-num-steps; None when not given (SGLang then picks one)
    use_ray: bool = False
    parser: str | None = None
    config_ignored: str | None = None
    model_revision: str | None = None  # --revision: the snapshot of a Hub id SGLang loads (None: main)
    draft_revision: str | None = None  # --speculative-draft-model-revision
    eagle_topk: int | None = None  # --speculative-eagle-topk; None when not given
    num_draft_tokens: int | None = None  # --speculative-num-draft-tokens; None when not given


class _Refused(argparse.ArgumentParser):
    """An ``argparse`` parser whose errors raise instead of exiting (``exit_on_error=False`` does not cover
    unrecognised arguments)."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        raise InvalidArgumentError(f"the SGLang launch arguments do not parse ({self.prog}: {message})")


def _sglang_parse(argv: list[str]) -> argparse.Namespace | None:
    """``argv`` parsed by SGLang's own parser and ``--config`` merge (``prepare_server_args`` without building a
    ``ServerArgs``); no argument is required here (``--model-path`` may come as ``check-serving --target``).
    None when SGLang is not importable."""
    try:
        from sglang.srt.server_args import ServerArgs
        from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger
    except ImportError:
        return None
    # add_help=False: SGLang's -h / --help prints its help and exits 0, which made check-serving exit 0 (no error)
    # without checking anything; here it is an unrecognised argument (a launch with it serves nothing).
    parser = _Refused(prog="sglang serve", add_help=False)
    ServerArgs.add_cli_args(parser)
    for action in parser._actions:  # what SGLang requires (--model-path) may be given to check-serving instead
        action.required = False
    if "--config" in argv:
        import yaml  # what ConfigArgumentMerger reads the file with (an SGLang dependency)

        try:
            argv = ConfigArgumentMerger(parser).merge_config_with_args(argv)
        except (ValueError, OSError, yaml.YAMLError) as e:  # YAMLError: a file that is not valid YAML
            raise InvalidArgumentError(f"--config: SGLang's config merge refuses it: {e}") from e
    return parser.parse_args(argv)


_FALLBACK = {
    "model_path": ("--model-path", "--model"),
    "speculative_draft_model_path": ("--speculative-draft-model-path", "--speculative-draft-model"),
    "speculative_algorithm": ("--speculative-algorithm",),
    "context_length": ("--context-length",),
    "speculative_num_steps": ("--speculative-num-steps",),
    "speculative_eagle_topk": ("--speculative-eagle-topk",),
    "speculative_num_draft_tokens": ("--speculative-num-draft-tokens",),
    "revision": ("--revision",),
    "speculative_draft_model_revision": ("--speculative-draft-model-revision",),
}
_SI = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_IEC = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def _token_count(value: str) -> int:
    """``--context-length`` as SGLang reads it (``human_readable_int`` in ``srt/utils/common.py``): an integer, or
    one with an SI (``32k`` = 32000, decimals allowed) or IEC (``32Ki`` = 32768) suffix, case-sensitive."""
    import re
    from decimal import Decimal

    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value.strip())
    if not m:
        return int(value)
    number, suffix = m.groups()
    if suffix in _IEC and "." in number:
        raise InvalidArgumentError(f"{value}: no decimals with an IEC suffix")
    return int(Decimal(number) * (_IEC.get(suffix) or _SI[suffix]))


_TYPES = {  # as SGLang's add_cli_args types them
    "context_length": _token_count,
    "speculative_num_steps": int,
    "speculative_eagle_topk": int,
    "speculative_num_draft_tokens": int,
}


def _fallback_parse(argv: list[str]) -> argparse.Namespace:
    """The flags eagle-io reads, without SGLang: spelled in full (SGLang would also take abbreviations, which only
    its full flag list can resolve, so one is refused here rather than ignored), ``--config`` refused, other flags
    ignored."""
    full = {flag for flags in _FALLBACK.values() for flag in flags} | {"--use-ray"}
    for a in argv:
        name = a.split("=", 1)[0]
        if name == "--config":
            raise InvalidArgumentError(
                "--config: reading a launch config file the way SGLang merges it needs SGLang installed; pass the "
                "flags themselves, or install SGLang"
            )
        if name.startswith("--") and name not in full and any(f.startswith(name) for f in full):
            raise InvalidArgumentError(
                f"{name}: SGLang may take it for an abbreviation of {[f for f in full if f.startswith(name)]}; without "
                "SGLang installed eagle-io cannot resolve abbreviations: spell the flag out"
            )
    p = _Refused(prog="eagle-io, without SGLang", add_help=False, allow_abbrev=False)
    for dest, flags in _FALLBACK.items():
        p.add_argument(*flags, dest=dest, type=_TYPES.get(dest, str))
    p.add_argument("--use-ray", dest="use_ray", action="store_true")
    ns, _ = p.parse_known_args(argv)
    return ns


def reader(server_args: Any) -> Callable[..., Any]:
    """``get(field, default=None)`` over ``server_args``: a mapping of ``ServerArgs`` field names (its keys), or a
    ``ServerArgs`` (its resolved view once resolution has run, ``ServerArgs.resolve_once`` /
    ``sglang.srt.arg_groups.overrides.resolved_view``: the raw attribute can still show an unresolved value)."""
    if isinstance(server_args, Mapping):
        return server_args.get
    view = server_args
    if getattr(server_args, "_resolution_finished", False):
        from sglang.srt.arg_groups.overrides import resolved_view

        view = resolved_view(server_args)

    def get(key: str, default: Any = None) -> Any:
        return getattr(view, key, default)

    return get


def launch_args(server_args: Any) -> LaunchArgs:
    """Reads :class:`LaunchArgs` from raw SGLang launch arguments (``["--model-path", "m", ...]``, as given to
    ``python -m sglang.launch_server``), a mapping of ``ServerArgs`` field names, or a ``ServerArgs`` object.

    For a ``ServerArgs`` object the resolved view is used when resolution has run
    (``ServerArgs.resolve_once``; ``sglang.srt.arg_groups.overrides.resolved_view``), so ``NEXTN`` already reads
    ``EAGLE`` there; an unresolved object is resolved here by :func:`resolve_algorithm`'s rule.

    Raises:
        InvalidArgumentError: raw arguments SGLang's parser refuses (an unknown or ambiguous flag, a bad value, a
            ``--config`` file it cannot merge; ``-h`` / ``--help``, with which SGLang serves nothing); without
            SGLang, ``--config`` or an abbreviated flag.
    """
    if server_args is None:
        return LaunchArgs()
    parser = ignored = None
    if isinstance(server_args, Sequence) and not isinstance(server_args, str):
        argv = [str(a) for a in server_args]
        ns = _sglang_parse(argv)
        parser = "sglang"
        if ns is None:
            ns, parser = _fallback_parse(argv), "eagle-io"
        else:  # the merge removes the "--config FILE" pair it read: a config left in ns is another, never read
            read = argv[argv.index("--config") + 1] if "--config" in argv else None
            if getattr(ns, "config", None) and str(ns.config) != read:
                ignored = str(ns.config)
        server_args = vars(ns)
    get = reader(server_args)
    algo = get("speculative_algorithm")
    ctx, steps = get("context_length"), get("speculative_num_steps")

    def whole(v: Any) -> int | None:
        return int(v) if isinstance(v, int) and not isinstance(v, bool) else None

    return LaunchArgs(
        model_path=get("model_path"),
        draft_path=get("speculative_draft_model_path"),
        algorithm=algo,
        resolved_algorithm=resolve_algorithm(algo),
        context_length=int(ctx) if isinstance(ctx, int) else None,
        num_steps=int(steps) if isinstance(steps, int) and not isinstance(steps, bool) else None,
        use_ray=bool(get("use_ray", False)),
        parser=parser,
        config_ignored=ignored,
        model_revision=get("revision"),
        draft_revision=get("speculative_draft_model_revision"),
        eagle_topk=whole(get("speculative_eagle_topk")),
        num_draft_tokens=whole(get("speculative_num_draft_tokens")),
    )
