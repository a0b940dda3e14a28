"""No file of the repository names a path of one machine (a checkout, a venv, a data directory under /work, /home or
/Users): commands in docs and benches are relative to the repository root (issue 33)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|home|Users)/[\w.-]+")
TEXT = {".py", ".pyi", ".rs", ".md", ".toml", ".txt", ".yml", ".yaml", ".cfg", ".sh", ".html", ""}


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / p for p in out.splitlines() if Path(p).suffix in TEXT and (ROOT / p).is_file()]


def test_no_machine_specific_paths_in_the_repository():
    files = _tracked()
    assert any(p.name == "Makefile" for p in files) and any(p.suffix == ".rs" for p in files), "the walk sees files"
    found = []
    for path in files:
        if path == Path(__file__).resolve():
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            found += [f"{path.relative_to(ROOT)}:{n}: {m}" for m in MACHINE_PATH.findall(line)]
    assert found == [], "\n".join(found)


def test_the_pattern_finds_a_machine_path_and_spares_the_others():
    assert MACHINE_PATH.findall("cd /work/main && /home/ci/venv/bin/python") == ["/work/main", "/home/ci"]
    assert MACHINE_PATH.findall(".venv/bin/python runs/work/x s3://b/home/y --staging /scratch/stage") == []
