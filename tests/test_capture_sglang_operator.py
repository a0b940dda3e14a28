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
    ok = CaptureOptions(writer_options={"queue_depth": 64, "threads": 1})
    assert policy.admit_start(str(tmp_path / "ds"), ok, None)[0] == os.path.realpath(tmp_path / "ds")
