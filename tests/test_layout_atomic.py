"""store/layout.py's atomic writes: a file or a directory appears whole or not at all, and a failed write leaves
the old content and no temporary behind."""

from __future__ import annotations

import pytest

from eagle_io.errors import StorageError
from eagle_io.store import layout


def test_atomic_file_keeps_the_old_content_when_the_check_fails(tmp_path):
    target = tmp_path / "manifest.json"
    layout.write_atomic(target, b"old")

    def refuse(p):
        assert p.read_bytes() == b"new", "the check sees the complete new file"
        raise ValueError("not a manifest")

    with pytest.raises(ValueError, match="not a manifest"):
        layout.write_atomic(target, b"new", check=refuse)
    assert target.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]
    layout.write_atomic(target, b"new", check=lambda p: None)
    assert target.read_bytes() == b"new"


def test_atomic_file_names_the_file_on_an_os_error(tmp_path):
    with pytest.raises(StorageError, match="no-such-dir") as e:
        layout.write_atomic(tmp_path / "no-such-dir" / "f", b"x")
    assert e.value.errno == 2


def test_atomic_dir_appears_whole_or_not_at_all(tmp_path):
    out = tmp_path / "cache" / "abc"
    with pytest.raises(RuntimeError, match="killed"), layout.atomic_dir(out) as tmp:
        (tmp / "config.json").write_text("{}")
        raise RuntimeError("killed half way")
    assert not out.exists() and list((tmp_path / "cache").iterdir()) == []
    with layout.atomic_dir(out) as tmp:
        assert tmp.parent == out.parent and tmp.name.startswith(".abc.") and tmp.name.endswith(".tmp")
        (tmp / "config.json").write_text("{}")
        (tmp / "sub").mkdir()
        (tmp / "sub" / "w.bin").write_bytes(b"1")
    assert (out / "config.json").read_text() == "{}" and (out / "sub" / "w.bin").read_bytes() == b"1"
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["abc"]


def test_atomic_dir_loser_of_a_race_leaves_the_winners_copy(tmp_path):
    out = tmp_path / "abc"
    with layout.atomic_dir(out) as tmp:
        (tmp / "f").write_text("mine")
        out.mkdir()  # another process renamed its copy first
        (out / "f").write_text("theirs")
    assert (out / "f").read_text() == "theirs" and [p.name for p in tmp_path.iterdir()] == ["abc"]
