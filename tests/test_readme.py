"""README.md holds what a newcomer runs: its Python snippet runs as written (the embedded SmolLM2 swapped for a tiny
random model of the same family, so no real model loads), and its command list names every subcommand the parser
has, each with help text and defaults on every option."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from eagle_io.cli import COMMANDS, build_parser

README = Path(__file__).resolve().parent.parent / "README.md"


def _blocks(lang: str) -> list[str]:
    """The README's fenced blocks opened by ```` ```lang ```` (``""``: a bare fence)."""
    blocks: list[str] = []
    fence: str | None = None  # the open fence's language
    for line in README.read_text().splitlines(keepends=True):
        if line.startswith("```"):
            if fence is None:
                fence = line.strip()[3:]
                if fence == lang:
                    blocks.append("")
            else:
                fence = None
        elif fence == lang:
            blocks[-1] += line
    return blocks


def test_the_python_snippet_runs_as_written(tmp_path, monkeypatch):
    from helpers.tiny_model import build_tiny_model_dir

    from eagle_io.capturing import models

    tiny = build_tiny_model_dir(tmp_path / "tiny")
    real = models.load_target
    monkeypatch.setattr(models, "load_target", lambda model=None, **kw: real(tiny, **kw))
    monkeypatch.chdir(tmp_path)  # the snippet writes "out"
    (snippet,) = _blocks("python")
    scope: dict = {}
    exec(compile(snippet, str(README), "exec"), scope)
    assert len(scope["ds"]) == 4 and scope["batch"]["input_ids"].shape[0] == 4
    assert scope["ds"].metadata["tokenizer"]["chat_template_sha256"]  # the snippet records the tokenizer identity
    assert scope["item"]["aux_hidden_states"].shape[1] == 3 * scope["item"]["hidden_states"].shape[1]


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_the_readme_lists_every_subcommand_once_a_line():
    listed = [m.group(1) for block in _blocks("") for m in re.finditer(r"^eagle-io ([a-z-]+) ", block, flags=re.M)]
    assert set(_subparsers()) == set(COMMANDS)
    missing = sorted(set(COMMANDS) - set(listed))
    assert not missing, f"README.md's command list lacks {missing}"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_has_help_and_shows_its_default(name):
    p = _subparsers()[name]
    text = p.format_help()
    for a in p._actions:
        if a.help == argparse.SUPPRESS or isinstance(a, argparse._HelpAction):
            continue
        assert a.help and a.help.strip(), f"{name} {a.option_strings or a.dest}: no help text"
        if a.option_strings and not (a.default is None or a.default is False):  # [] too: --sglang-arg did not
            shown = p._get_formatter()._get_help_string(a) % {**vars(a), "prog": p.prog}
            assert "default" in shown, f"{name} {a.option_strings[0]}: help does not give the default {a.default!r}"
    if name == "generate":
        assert "(default: 2048)" in text and "one per CPU) (default: 0)" in text and "default $RANK, else 0" in text
        sglang_arg = r"--sglang-arg KEY=VALUE\s+further sglang\.launch_server setting, .* \(default:\s+none\)"
        assert re.search(sglang_arg, text, re.S)
