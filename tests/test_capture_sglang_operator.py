"""The operator's bounds on a remote capture (``eagle_io.capturing.sglang.operator``) and what a start that breaks
inside the scheduler leaves: found by attacking a real CPU server's control route (values the server must refuse
before it allocates anything)."""

from __future__ import annotations

import os

import pytest

from eagle_io.capturing.options import CaptureOptions
from eagle_io.capturing.sglang.operator import OperatorPolicy
from eagle_io.errors import CaptureRefusedError


@pytest.mark.parametrize(
    ("writer_options", "said"),
    [
        ({"queue_depth": 1 << 40}, "writer option queue_depth 1099511627776 > 256"),  # aborted the scheduler
        ({"queue_depth": 1 << 62}, "writer option queue_depth 4611686018427387904 > 256"),  # a Rust panic
        ({"threads": 1000}, f"writer option threads 1000 > {os.cpu_count()}"),  # 1,000 threads were made
        ({"threads": True}, "writer option threads True"),
    ],
)
def test_writer_options_that_allocate_at_once_are_bounded_by_the_operator(tmp_path, writer_options, said):
    policy = OperatorPolicy.from_env({"EAGLE_IO_CAPTURE_ROOT": str(tmp_path)})
    with pytest.raises(CaptureRefusedError, match=f"over this server's limits .*{said}"):
        policy.admit_start(str(tmp_path / "ds"), CaptureOptions(writer_options=writer_options), None)
    policy.admit_start(str(tmp_path / "ds"), CaptureOptions(writer_options={"queue_depth": 64, "threads": 1}), None)


def test_a_start_that_panics_in_the_core_is_a_failed_start_not_a_wedged_control_route(tmp_path, monkeypatch):
    """Before: a Rust panic (pyo3's PanicException derives from BaseException, not Exception) escaped the start's
    handler and left the status 'starting' for good: every later start was refused until a restart."""
    from eagle_io.capturing.sglang import scheduler as sc

    class PanicException(BaseException):  # TEST-ONLY stand-in: pyo3's, matched by its base
        pass

    def panics(*a, **k):
        raise PanicException("capacity overflow")

    monkeypatch.setattr(sc, "OPERATOR", OperatorPolicy.from_env({"EAGLE_IO_CAPTURE_ROOT": str(tmp_path)}))
    monkeypatch.setattr(sc, "_start", panics)
    monkeypatch.setattr(sc, "_STARTING", {"state": "starting", "id": "x", "error": None})
    sc._start_over_http(None, {"op": "start", "token": "s" * 64, "out_dir": str(tmp_path / "ds"), "options": {}})
    assert sc._STARTING["state"] == "failed" and "PanicException: capacity overflow" in sc._STARTING["error"]
