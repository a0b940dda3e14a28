"""Resource faults (issue 6, item 5): a full disk, a file-size limit, permission and I/O errors while
writing give a StorageError naming the file (with its errno) and leave every committed shard intact
and resumable; a capture ring keeps memory bounded by its size however much is pushed through it.

Faults are injected in children of the fork server (tests/helpers/forkserver.py): RLIMIT_FSIZE with
SIGXFSZ ignored (real EFBIG from the kernel), and the test-only LD_PRELOAD injector
(tests/helpers/fault_inject.c) for ENOSPC, EACCES, EIO and EROFS at a chosen call.
"""

from __future__ import annotations

import errno
import os
import signal
import stat

import pytest
from helpers.checks import check_samples, on_disk
from helpers.forkserver import ForkServer, shared

import eagle_io

N = 40
SHARD_BYTES = 6_000


@pytest.fixture(scope="module")
def server() -> ForkServer:
    return shared()


def needs_injector(server: ForkServer) -> None:
    if not server.has_shim:
        pytest.skip("no C compiler to build the test-only fault injector (tests/helpers/fault_inject.c)")


def assert_intact_then_resume(server: ForkServer, root, long_from: int | None = None) -> list[int]:
    """Everything committed before the fault verifies and reopens; a resume (fault gone) completes
    exactly the missing ids. Returns the ids committed before the fault."""
    state = on_disk(root)
    committed = state["listed_ids"] + state["orphan_ids"]
    assert sorted(committed) == list(range(len(committed)))
    resumed = server.run(
        "write_dataset",
        {"root": str(root), "n": N, "shard_bytes": SHARD_BYTES, "resume": True, "long_from": long_from},
    )
    assert resumed["error"] is None, resumed
    assert resumed["result"]["found"] == sorted(committed)
    assert resumed["result"]["written"] == list(range(len(committed), N))
    assert eagle_io.Dataset.verify(root) == []
    check_samples(root, list(range(N)), long_from=long_from)
    return committed


def test_file_size_limit_gives_efbig_storage_error_naming_the_shard(server, tmp_path):
    """A real kernel EFBIG (RLIMIT_FSIZE, SIGXFSZ ignored): samples 0-19 make small shards that fit,
    sample 20 on makes a shard larger than the limit."""
    root = tmp_path / "ds"
    r = server.run(
        "write_dataset",
        {"root": str(root), "n": N, "shard_bytes": SHARD_BYTES, "long_from": 20, "queue_depth": 1},
        rlimit_fsize=30_000,
    )
    assert r["signal"] is None and r["error"] is not None, r
    e = r["error"]
    assert e["type"] == "StorageError" and "OSError" in e["mro"]
    assert e["errno"] == errno.EFBIG
    name = os.path.basename(e["path"])
    assert name.startswith(".r00000-") and name.endswith(".eio.tmp") and e["path"] in e["message"]
    assert os.path.dirname(e["path"]) == str(root / "shards"), "the error names the shard being written"
    # Later calls keep failing, naming the first error; the root stays resumable.
    after = e["after_error"]
    assert "failed earlier" in after["write"]["message"] and e["path"] in after["write"]["message"]
    committed = assert_intact_then_resume(server, root, long_from=20)
    assert 10 <= len(committed) <= 20


# (spec, errno, file the error names (suffix), committed shards that must survive)
INJECTED = {
    "disk full writing a shard": ("ENOSPC:write:.eio.tmp:3", errno.ENOSPC, ".r00000-000002.eio.tmp", 2),
    "disk full writing the manifest": ("ENOSPC:write:.manifest.json.tmp:4", errno.ENOSPC, ".manifest.json.tmp", 3),
    "I/O error on a shard fsync": ("EIO:fsync:.eio.tmp:2", errno.EIO, ".r00000-000001.eio.tmp", 1),
    "permission denied creating a shard": ("EACCES:open:.eio.tmp:4", errno.EACCES, ".r00000-000003.eio.tmp", 3),
    "read-only filesystem at the shard rename": ("EROFS:rename_before:.eio$:2", errno.EROFS, "r00000-000001.eio", 1),
}


@pytest.mark.parametrize("case", list(INJECTED))
def test_injected_write_failures_raise_storage_error_and_keep_committed_shards(server, tmp_path, case):
    needs_injector(server)
    spec, code, names, survivors = INJECTED[case]
    root = tmp_path / "ds"
    r = server.run("write_dataset", {"root": str(root), "n": N, "shard_bytes": SHARD_BYTES}, fault=spec)
    assert r["signal"] is None and r["error"] is not None, r
    e = r["error"]
    assert (e["type"], e["errno"]) == ("StorageError", code), e
    assert e["path"].endswith(names) and e["path"] in e["message"], e
    assert os.strerror(code) in e["message"]
    committed = assert_intact_then_resume(server, root)
    state_shards = len(committed)
    assert state_shards >= survivors, "every shard committed before the fault survives"


def test_failed_writer_releases_the_root_for_a_resume_in_the_same_process(server, tmp_path):
    needs_injector(server)
    root = tmp_path / "ds"
    r = server.run(
        "write_dataset",
        {"root": str(root), "n": N, "shard_bytes": SHARD_BYTES, "queue_depth": 1},
        fault="ENOSPC:write:.eio.tmp:2",
    )
    after = r["error"]["after_error"]
    assert "failed earlier" in after["close"]["message"]
    assert after["resume_in_process"] is None, after["resume_in_process"]


def test_a_full_disk_stays_a_storage_error_with_its_errno_on_every_later_call(server, tmp_path):
    """The shard I/O thread hits a real ENOSPC (injected at the write(2) of the second shard's temp file): the
    write that finds it, every later write and close raise StorageError with errno ENOSPC and the file, each
    saying it failed earlier (the sticky error was kept as a string and came back as InvalidArgumentError)."""
    needs_injector(server)
    root = tmp_path / "ds"
    r = server.run(
        "write_dataset",
        {"root": str(root), "n": 30, "shard_bytes": 9_000, "queue_depth": 1},
        fault="ENOSPC:write:.eio.tmp:2",
    )
    first = r["error"]
    assert (first["type"], first["errno"]) == ("StorageError", errno.ENOSPC), first
    for call, after in first["after_error"].items():
        if call == "resume_in_process":
            continue
        assert (after["type"], after["errno"], after["storage"]) == ("StorageError", errno.ENOSPC, True), (call, after)
        assert after["path"] == first["path"] and after["message"].startswith("the writer failed earlier")
        assert "No space left on device" in after["message"]


def test_permission_denied_on_a_read_only_shards_dir(server, tmp_path):
    """A real EACCES from the kernel. Root bypasses file modes, so as root this uses a path component
    that is a file instead; the same error path (a StorageError naming the file) is taken."""
    root = tmp_path / "ds"
    first = server.run("write_dataset", {"root": str(root), "n": 10, "shard_bytes": SHARD_BYTES})
    assert first["exit"] == 0 and first["error"] is None
    before = on_disk(root)
    if os.geteuid() != 0:
        shards = root / "shards"
        mode = shards.stat().st_mode
        shards.chmod(stat.S_IRUSR | stat.S_IXUSR)
        try:
            r = server.run("write_dataset", {"root": str(root), "n": N, "shard_bytes": SHARD_BYTES, "resume": True})
        finally:
            shards.chmod(mode)
        assert r["error"]["type"] == "StorageError" and r["error"]["errno"] == errno.EACCES, r
        assert r["error"]["path"].startswith(str(shards))
    else:
        blocked = tmp_path / "blocked"
        blocked.write_text("a file where a directory is needed")
        r = server.run("write_dataset", {"root": str(blocked / "ds"), "n": N, "shard_bytes": SHARD_BYTES})
        assert r["error"]["type"] == "StorageError" and r["error"]["errno"] == errno.ENOTDIR, r
        assert str(blocked) in r["error"]["path"]
    after = on_disk(root)
    assert after["listed_ids"] == before["listed_ids"] == list(range(10))


def test_disk_full_under_the_capture_ring_surfaces_to_the_producer_and_close(server, tmp_path):
    """The sink thread's writer hits ENOSPC: the next put fails at once (no hang until the ring
    timeout) with a message naming the file and the error, close() raises the StorageError itself,
    and what was committed before stays valid."""
    needs_injector(server)
    root = tmp_path / "ds"
    r = server.run(
        "ring_until_error",
        {"root": str(root), "n": 200, "shard_bytes": SHARD_BYTES, "ring_bytes": 1 << 16},
        fault="ENOSPC:write:.eio.tmp:3",
    )
    assert r["error"] is None and r["signal"] is None, r
    out = r["result"]
    put, close = out["put"], out["close"]
    assert put is not None and ".r00000-000002.eio.tmp" in put["message"] and "No space left" in put["message"]
    assert close["storage"] and close["errno"] == errno.ENOSPC and close["path"].endswith(".r00000-000002.eio.tmp")
    assert r["seconds"] < 20, "the producer failed fast, not after the ring's 30 s timeout"
    state = on_disk(root)
    assert len(state["listed"]) == 2 and eagle_io.Dataset.verify(root) == []


def test_disk_full_under_the_capture_ring_is_a_storage_error_for_the_producer(server, tmp_path):
    needs_injector(server)
    r = server.run(
        "ring_until_error",
        {"root": str(tmp_path / "ds"), "n": 200, "shard_bytes": SHARD_BYTES, "ring_bytes": 1 << 16},
        fault="ENOSPC:write:.eio.tmp:3",
    )
    put = r["result"]["put"]
    assert put["storage"], put
    assert put["errno"] == errno.ENOSPC and put["path"].endswith(".r00000-000002.eio.tmp")


def test_ring_memory_stays_bounded_by_the_ring_size(server, tmp_path):
    """Pushes 50x the ring's size through it (the producer far faster than the compressing writer, so
    it stalls on a full ring): peak RSS grows by at most the ring plus a fixed margin (the writer's
    queue of 2 records, its 1 MiB shard buffer, codec scratch, zstd contexts), far less than what
    was pushed. ru_maxrss of the child, whose baseline is taken after its inputs exist."""
    ring = 2 << 20
    r = server.run(
        "ring_push",
        {
            "root": str(tmp_path / "ds"),
            "ring_bytes": ring,
            "total_bytes": 50 * ring,
            "sample_tokens": 256,
            "hidden": 256,
        },
    )
    assert r["error"] is None and r["exit"] == 0, r
    out = r["result"]
    assert out["stored_samples"] == out["samples"] and out["pushed_bytes"] >= 45 * ring
    assert out["high_water_bytes"] <= out["ring_capacity"] == ring
    assert out["stall_seconds"] > 0, "the producer must have waited on a full ring (else nothing was tested)"
    assert out["control_growth_bytes"] >= 60 << 20, "ru_maxrss sees a 64 MiB allocation (the instrument works)"
    margin = 24 << 20
    growth = out["peak_bytes"] - out["baseline_bytes"]
    assert growth <= ring + margin, (
        f"peak RSS grew {growth / 2**20:.1f} MiB pushing {out['pushed_bytes'] / 2**20:.0f} MiB"
    )
    print(f"\nring {ring >> 20} MiB: pushed {out['pushed_bytes'] >> 20} MiB, peak RSS +{growth / 2**20:.1f} MiB")


def test_the_injector_is_inert_until_armed(server, tmp_path):
    """The fork server runs with the injector preloaded: an unarmed child writes normally, so no
    other test's result comes from the injector by accident."""
    r = server.run("write_dataset", {"root": str(tmp_path / "ds"), "n": 20, "shard_bytes": SHARD_BYTES})
    assert r["exit"] == 0 and r["error"] is None and r["signal"] != signal.SIGKILL
    check_samples(tmp_path / "ds", list(range(20)))
