"""Where a dataset's files live and how they are written (docs/FORMAT.md section 1), for every Python caller: the
file names and the writer lock come from the Rust core (``src/layout.rs``, exported as ``_native.LAYOUT``,
``manifest_name``, ``shard_prefix``, ``RootLock``), so both languages agree; :func:`atomic_file` is the one
temp-file-then-rename write of the package (fsync of the file, then of its directory).

A dataset root holds ``manifest.json`` (one writer) or ``manifest.rNNNNN.json`` per rank (several writers sharing
the root, joined by ``eagle-io merge``), and ``shards/rNNNNN-NNNNNN.eio``. (The pure-Python reference reader,
:mod:`eagle_io.store.reference`, spells the default manifest name itself: it runs without this package.)
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO

from .. import _native
from ..errors import InvalidArgumentError, StorageError

__all__ = [
    "MANIFEST",
    "RANK_MANIFEST",
    "SHARD_DIR",
    "SHARD_FILE",
    "Footprint",
    "atomic_file",
    "created_mode",
    "dataset_manifests",
    "is_shard_temp",
    "is_url",
    "lock_name",
    "lock_writers",
    "manifest_file",
    "manifest_name",
    "rank_manifests",
    "shard_prefix",
    "storage_error",
    "temp_path",
    "write_atomic",
]

_L = _native.LAYOUT
MANIFEST: str = _L["manifest"]
"""The manifest of a dataset written by one writer (``manifest.json``)."""
SHARD_DIR: str = _L["shard_dir"]
"""Folder of the shard files, relative to the root (``shards``)."""
RANK_MANIFEST = re.compile(rf"^manifest\.r(\d{{{_L['rank_digits']}}})\.json$")
"""Names of per-rank manifests (``manifest.r00003.json``); group 1 is the rank."""
SHARD_FILE = re.compile(rf"^r\d{{{_L['rank_digits']}}}-\d{{{_L['seq_digits']}}}{re.escape(_L['shard_suffix'])}$")
"""Names of committed shard files (``r00003-000012.eio``)."""


def manifest_name(rank: int, world_size: int) -> str:
    """The manifest of writer ``rank`` of ``world_size``: ``manifest.json`` alone, else ``manifest.rNNNNN.json``."""
    return _native.manifest_name(rank, world_size)


def shard_prefix(rank: int) -> str:
    """``rNNNNN-``: the start of the names of writer ``rank``'s shards."""
    return _native.shard_prefix(rank)


def lock_name(manifest_name: str) -> str:
    """The writer lock file of ``manifest_name`` in its root: ``.manifest.json.lock`` (``src/layout.rs``'s
    ``lock_name``; ``tests/test_layout_atomic.py`` holds the two to the same name)."""
    return f".{manifest_name}.lock"


def rank_manifests(root: str | os.PathLike[str]) -> list[Path]:
    """The per-rank manifests in ``root`` (``manifest.rNNNNN.json``), in rank order; [] when there are none."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if RANK_MANIFEST.match(p.name))


def dataset_manifests(path: str | os.PathLike[str]) -> list[Path]:
    """The manifests a dataset path stands for: a manifest file itself; a root's ``manifest.json``; else the root's
    per-rank manifests in rank order (a multi-writer root not merged yet); [] when there is none."""
    p = Path(path)
    if not p.is_dir():
        return [p] if p.is_file() else []
    if (p / MANIFEST).is_file():
        return [p / MANIFEST]
    return rank_manifests(p)


def is_url(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is an object-storage URL (``s3://bucket/run``; docs/STORAGE.md) rather than a local path."""
    scheme, sep, _ = os.fspath(path).partition("://")
    return bool(sep) and scheme.isalnum()


def manifest_file(path: str | os.PathLike[str]) -> str:
    """The one manifest a single dataset path names: ``path`` itself when it is not a directory, else
    ``path/manifest.json`` (as :class:`eagle_io.Dataset` opens it). An object URL names its manifest when it
    ends in ``.json``, else the prefix holding ``manifest.json``.

    Raises:
        InvalidArgumentError: ``path`` is a multi-writer root not merged yet (no ``manifest.json``, rank manifests):
            the message lists them and says to run ``eagle-io merge`` (a missing file otherwise, which the caller's
            open reports as a StorageError naming it).
    """
    p = os.fspath(path)
    if is_url(p):
        return p if p.endswith(".json") else f"{p.rstrip('/')}/{MANIFEST}"
    if not os.path.isdir(p):
        return p
    single = os.path.join(p, MANIFEST)
    if not os.path.exists(single):
        ranks = rank_manifests(p)
        if ranks:
            names = ", ".join(r.name for r in ranks[:4]) + (", ..." if len(ranks) > 4 else "")
            raise InvalidArgumentError(
                f"{p}: no {MANIFEST}, but {len(ranks)} rank manifest(s) ({names}) of a multi-writer root not merged "
                f"yet: run `eagle-io merge {p}`, or pass one rank's manifest file"
            )
    return single


def temp_path(path: str | os.PathLike[str]) -> Path:
    """The name ``path`` is written under before its atomic rename: ``.NAME.tmp`` in the same directory."""
    p = Path(path)
    return p.with_name(f"{_L['temp_prefix']}{p.name}{_L['temp_suffix']}")


def is_shard_temp(name: str) -> bool:
    """Whether ``name`` is the temporary name of a shard being written (``.rNNNNN-NNNNNN.eio.tmp``)."""
    return (
        name.startswith(_L["temp_prefix"])
        and name.endswith(_L["temp_suffix"])
        and bool(SHARD_FILE.match(name[len(_L["temp_prefix"]) : -len(_L["temp_suffix"])]))
    )


class Footprint:
    """What a dataset root held before a writer or a run touched it, so that one ending with nothing stored (a
    refused writer, a run that failed before its first commit or whose every record was refused) takes back what it
    created, and the user's directory is as it was: no ``shards/``, lock or manifest left behind, no empty dataset
    that looks finished, nothing a retry into the same root trips on.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(os.path.abspath(root))
        self.new_dirs: list[Path] = []  # the root and the parents it lacked, deepest first
        p = self.root
        while not p.exists() and p != p.parent:
            self.new_dirs.append(p)
            p = p.parent
        self.before = frozenset(os.listdir(self.root)) if self.root.is_dir() else frozenset()

    def is_new(self, name: str) -> bool:
        """Whether the root's entry ``name`` was not there when the footprint was taken."""
        return name not in self.before

    def take_back(self, names: Iterable[str], *, shards_of: Iterable[int] = ()) -> list[str]:
        """Removes each file of ``names`` that is in the root now and was not before; from the shards folder (when
        ``names`` holds :data:`SHARD_DIR`), the shards, committed or temporary, of the writers of ranks ``shards_of``
        (this run's own: never another writer's, which may be writing beside it), then the folder itself when it
        is new and empty; then the directories the root lacked, each when empty. Entries that were there before,
        and anything else, are never touched. Never raises (it runs on the way out of an error): what cannot be
        removed stays. Returns the paths removed."""
        removed = []
        prefixes = tuple(p for r in shards_of for p in (shard_prefix(r), _L["temp_prefix"] + shard_prefix(r)))
        for name in names:
            path = self.root / name
            with contextlib.suppress(OSError):
                if name == SHARD_DIR and path.is_dir() and not path.is_symlink():
                    for shard in sorted(os.listdir(path)) if prefixes else []:
                        if shard.startswith(prefixes) and (SHARD_FILE.match(shard) or is_shard_temp(shard)):
                            os.unlink(path / shard)
                            removed.append(str(path / shard))
                    if self.is_new(name):
                        path.rmdir()  # only when empty
                        removed.append(str(path))
                elif self.is_new(name) and os.path.lexists(path) and not path.is_dir():
                    path.unlink()
                    removed.append(str(path))
        for d in self.new_dirs:
            with contextlib.suppress(OSError):
                d.rmdir()  # only when empty
                removed.append(str(d))
        return removed

    def take_back_all(self) -> None:
        """Removes every entry of the root that was not there before, folders with what they hold, then the
        directories the root lacked: for an output a run owns whole (an export into a new or empty directory) that
        failed. Never raises; what cannot be removed stays."""
        import shutil

        if self.root.is_dir():
            for name in set(os.listdir(self.root)) - self.before:
                path = self.root / name
                with contextlib.suppress(OSError):
                    if path.is_dir() and not path.is_symlink():
                        shutil.rmtree(path)
                    else:
                        path.unlink()
        self.take_back([])

    def take_back_dataset(self) -> list[str]:
        """:meth:`take_back` of the single-writer dataset a run that cannot be resumed wrote (a transcode, an import
        that failed or was interrupted: its part is no result, and it refused the retry): its manifest, lock and
        shards, committed ones too."""
        return self.take_back([MANIFEST, lock_name(MANIFEST), SHARD_DIR], shards_of=[0])


def storage_error(path: str | os.PathLike[str], e: OSError) -> StorageError:
    """A :class:`~eagle_io.errors.StorageError` naming ``path`` for the OS error ``e`` (``errno`` kept)."""
    err = StorageError(f"{path}: {e.strerror or e}")
    err.path, err.errno = str(path), e.errno
    return err


def created_mode() -> int:
    """``0o666 & ~umask``: the permissions a plain ``open(path, "w")`` gives a new file, which every file the atomic
    writes below commit gets too (a temporary file made by another means, e.g. ``mkstemp``, would be ``0o600``).
    The umask is read from ``/proc/self/status``; where that is missing, by setting and restoring it."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str], *, check: Callable[[Path], object] | None = None) -> Iterator[IO[bytes]]:
    """Writes ``path`` atomically: yields a binary file open on :func:`temp_path` (with the permissions of the file it
    replaces, else :func:`created_mode`, as a plain ``open`` would leave them; a stale temp entry is removed first and
    the temp file is created with ``O_EXCL | O_NOFOLLOW``, so a link planted at the temp name is never followed); on a
    clean exit fsyncs and closes it, runs ``check(temp_path)`` if given (e.g. open the written manifest), renames it
    over ``path`` and fsyncs the directory, so a crash leaves the old file or the new one, never a torn one. On an
    exception (in the block or from ``check``) the temp file is removed and ``path`` is untouched.

    Raises:
        StorageError: an OS error, naming the file.
    """
    target = Path(path)
    tmp = temp_path(target)
    try:
        st = os.stat(target)
        mode = stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else created_mode()
    except OSError:
        mode = created_mode()
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # a crashed writer's leftover, or a link: never written through
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        f = os.fdopen(os.open(tmp, flags, 0o600), "wb")
    except OSError as e:
        raise storage_error(tmp, e) from e
    try:
        with f:
            os.fchmod(f.fileno(), mode)
            yield f
            f.flush()
            os.fsync(f.fileno())
        if check is not None:
            check(tmp)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        if isinstance(e, OSError) and not isinstance(e, StorageError):
            raise storage_error(tmp, e) from e
        raise
    try:
        os.replace(tmp, target)
        _fsync_dir(target.parent)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise storage_error(target, e) from e


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Builds directory ``path`` atomically: yields an empty temporary directory beside it (``.NAME.PID.tmp``, one
    per process, so concurrent builders never share one); on a clean exit gives every file in it the mode of a plain
    ``open`` (:func:`created_mode`; a library's temporary files are often ``0o600``), fsyncs it, renames it to
    ``path`` and fsyncs the parent. When another process renamed its copy first, this one is removed (both hold the
    same content). On an exception the temporary directory is removed and ``path`` is untouched.

    Raises:
        StorageError: an OS error, naming the directory.
    """
    import shutil

    target = Path(path)
    tmp = target.with_name(f"{_L['temp_prefix']}{target.name}.{os.getpid()}{_L['temp_suffix']}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)  # a leftover of a crashed process with this pid
        tmp.mkdir(parents=True)
    except OSError as e:
        raise storage_error(tmp, e) from e
    try:
        yield tmp
        mode = created_mode()
        for f in sorted(p for p in tmp.rglob("*") if p.is_file() and not p.is_symlink()):
            with open(f, "rb") as fh:
                os.fchmod(fh.fileno(), mode)
                os.fsync(fh.fileno())
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another process finished first
        _fsync_dir(target.parent)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and not isinstance(e, StorageError):
            raise storage_error(target, e) from e
        raise


def write_atomic(path: str | os.PathLike[str], data: bytes, *, check: Callable[[Path], object] | None = None) -> None:
    """Writes ``data`` to ``path`` with :func:`atomic_file` (and its ``check``).

    Raises:
        StorageError: an OS error, naming the file.
    """
    with atomic_file(path, check=check) as f:
        f.write(data)


@contextlib.contextmanager
def lock_writers(root: str | os.PathLike[str], manifest_names: Iterable[str], *, busy: str) -> Iterator[None]:
    """Holds the writer locks of ``manifest_names`` in ``root`` (the ones each live :class:`eagle_io.ShardWriter`
    holds; ``_native.RootLock``) for the block's duration: no writer of those manifests runs meanwhile.

    Raises:
        InvalidArgumentError: a live writer holds one of them: ``"{root}: a writer is still writing {name};
            {busy}"``.
        StorageError: a lock file cannot be created.
    """
    locks = []
    try:
        for name in manifest_names:
            try:
                locks.append(_native.RootLock(os.fspath(root), name))
            except InvalidArgumentError:
                raise InvalidArgumentError(f"{root}: a writer is still writing {name}; {busy}") from None
        yield
    finally:
        for lock in locks:
            lock.release()
