"""store/layout.py's atomic writes: a file or a directory appears whole or not at all, and a failed write leaves
the old content and no temporary behind."""

from __future__ import annotations

import os
import stat
import tempfile

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


@pytest.fixture(params=[0o022, 0o027])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def test_committed_files_get_the_mode_a_plain_open_gives(tmp_path, umask):
    want = 0o666 & ~umask
    assert layout.created_mode() == want
    plain = tmp_path / "plain"
    plain.write_bytes(b"x")
    layout.write_atomic(tmp_path / "f", b"x")
    stale = layout.temp_path(tmp_path / "g")
    stale.write_bytes(b"")
    os.chmod(stale, 0o600)  # a leftover temp file of a crashed writer, reused by open()
    layout.write_atomic(tmp_path / "g", b"x")
    with layout.atomic_dir(tmp_path / "d") as d:
        fd, name = tempfile.mkstemp(dir=d)  # 0o600, as libraries' temp files are
        os.close(fd)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (plain, tmp_path / "f", tmp_path / "g")}
    modes["in dir"] = stat.S_IMODE((tmp_path / "d" / os.path.basename(name)).stat().st_mode)
    assert modes == {"plain": want, "f": want, "g": want, "in dir": want}


def test_save_draft_commits_its_files_with_the_umask_mode(tmp_path, umask):
    import torch

    from eagle_io.draft import save_draft
    from eagle_io.draft.model import Eagle3Draft, Eagle3DraftConfig

    torch.manual_seed(0)
    cfg = Eagle3DraftConfig(64, 16, 16, 16, num_attention_heads=2, num_key_value_heads=1, intermediate_size=16)
    draft = Eagle3Draft(cfg)
    t2d = torch.zeros(64, dtype=torch.bool)
    t2d[:16] = True  # the draft vocabulary: the first 16 target ids (d2t offsets 0)
    draft.set_vocab_mapping(torch.zeros(16, dtype=torch.int64), t2d)
    paths = save_draft(draft, tmp_path / "draft", [1, 2, 3], target={"num_layers": 4})
    modes = {k: stat.S_IMODE(os.stat(p).st_mode) for k, p in paths.items()}
    assert modes == {"weights": 0o666 & ~umask, "config": 0o666 & ~umask}
    assert sorted(os.listdir(tmp_path / "draft")) == ["config.json", "model.safetensors"]  # no temp left


def test_a_link_at_the_temp_name_is_never_written_through_and_modes_are_kept(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    os.chmod(victim, 0o600)
    target = tmp_path / "out.json"
    os.symlink(victim, layout.temp_path(target))  # planted (or left) at the temp name
    layout.write_atomic(target, b"{}")
    assert victim.read_bytes() == b"precious" and stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert not target.is_symlink() and target.read_bytes() == b"{}"
    os.chmod(target, 0o640)  # a rewrite keeps the permissions someone gave the file, as open() would
    layout.write_atomic(target, b"[]")
    assert stat.S_IMODE(target.stat().st_mode) == 0o640 and target.read_bytes() == b"[]"
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(StorageError, match=r"dir\.json"):
        layout.write_atomic(tmp_path / "dir.json", b"{}")
    assert not layout.temp_path(tmp_path / "dir.json").exists(), "a failed rename removes its temp file"
    with layout.atomic_dir(tmp_path / "d") as d:
        os.symlink(victim, d / "link")
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600, "atomic_dir does not chmod through links"
