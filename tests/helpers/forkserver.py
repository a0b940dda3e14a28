"""A fork server for the reliability tests.

Starting a Python that imports eagle_io, torch and transformers takes seconds, so killing a fresh
process at dozens of points would take minutes. The server imports everything once, then for
each job forks a child that runs one function of :mod:`helpers.jobs` and exits. The server (the
child's parent) can SIGKILL the child after a delay, and reports how the child ended. The
server itself runs with the test-only fault injector preloaded (``fault_inject.c``, unarmed), so
a child can arm it to die or fail inside a chosen system call.

Run as a script it is the server (one JSON job per stdin line, JSON replies on stdout); the
:class:`ForkServer` class is the test side.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent


def build_fault_injector(out_dir: str | os.PathLike[str]) -> str | None:
    """Compiles fault_inject.c into ``out_dir``; None (with no error) when no C compiler exists."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return None
    so = os.path.join(out_dir, "fault_inject.so")
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", "-o", so, str(HERE / "fault_inject.c"), "-ldl"],
        check=True,
        capture_output=True,
    )
    return so


class ForkServer:
    """The test side: ``run(job)`` sends a job and waits for the child's end."""

    def __init__(self, preload_generate: bool = False) -> None:
        self.tmp = tempfile.mkdtemp(prefix="eio-forkserver-")
        self.shim = build_fault_injector(self.tmp)
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "EIO_FAULT")}
        env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env["OMP_NUM_THREADS"] = "1"
        env["TOKENIZERS_PARALLELISM"] = "false"
        env["HF_HUB_OFFLINE"] = "1"
        if self.shim:
            env["LD_PRELOAD"] = self.shim
        args = [sys.executable, str(HERE / "forkserver.py")] + (["--generate"] if preload_generate else [])
        self.proc = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=str(TESTS)
        )
        hello = self._read()
        self.threads_at_fork = hello["tasks"]
        self.has_shim = bool(hello["shim"])

    def _read(self) -> dict[str, Any]:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"fork server exited with {self.proc.wait()}")
        return json.loads(line)

    def run(
        self,
        func: str,
        kwargs: dict[str, Any],
        *,
        kill_after: float | None = None,
        fault: str | None = None,
        rlimit_fsize: int | None = None,
        timeout: float = 120.0,
    ) -> dict[str, Any]:
        """Runs ``helpers.jobs.<func>(**kwargs)`` in a fresh child. Returns ``{"signal": int | None,
        "exit": int | None, "killed": bool, "seconds": float, "result": ..., "error": ...}``:
        ``result`` is the function's return value, ``error`` the exception it raised (type,
        message, path, errno), both None when the child died first."""
        result = os.path.join(self.tmp, f"result-{time.monotonic_ns()}.json")
        log = result.replace(".json", ".log")
        job = {
            "func": func,
            "kwargs": kwargs,
            "kill_after": kill_after,
            "fault": fault,
            "rlimit_fsize": rlimit_fsize,
            "timeout": timeout,
            "result": result,
            "log": log,
        }
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        reply = self._read()
        out = json.loads(Path(result).read_text()) if os.path.exists(result) else {}
        reply["result"] = out.get("result")
        reply["error"] = out.get("error")
        reply["log"] = Path(log).read_text(errors="replace") if os.path.exists(log) else ""
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # it holds no state; its exit would only unload torch (seconds)
            self.proc.wait(timeout=30)
        self.proc.stdin.close()
        self.proc.stdout.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


_SHARED: ForkServer | None = None


def shared() -> ForkServer:
    """One server for every reliability test module of this pytest run (started on first use with
    eagle_io, torch and transformers imported; killed at exit)."""
    global _SHARED
    if _SHARED is None or _SHARED.proc.poll() is not None:
        import atexit

        _SHARED = ForkServer(preload_generate=True)
        atexit.register(_SHARED.close)
    return _SHARED


def _error_info(e: BaseException) -> dict[str, Any]:
    return {
        "type": type(e).__name__,
        "message": str(e),
        "path": getattr(e, "path", None),
        "errno": getattr(e, "errno", None),
        "sample_id": getattr(e, "sample_id", None),
        "mro": [c.__name__ for c in type(e).__mro__],
        "after_error": getattr(e, "after_error", None),
    }


def _child(job: dict[str, Any], lib: Any) -> int:
    import resource

    from helpers import jobs

    fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    if job["rlimit_fsize"] is not None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        resource.setrlimit(resource.RLIMIT_FSIZE, (job["rlimit_fsize"], hard))
    if job["fault"] and (lib is None or lib.eio_fault_arm(job["fault"].encode()) != 0):
        raise RuntimeError(f"cannot arm fault {job['fault']!r}")
    out: dict[str, Any] = {}
    try:
        out["result"] = getattr(jobs, job["func"])(**job["kwargs"])
    except Exception as e:
        out["error"] = _error_info(e)
    if job["rlimit_fsize"] is not None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
    if lib is not None:
        lib.eio_fault_arm(b"")
    # Written under a temp name and renamed: a kill landing while the result is written (the job
    # had finished) must read as "died first", not as a torn result file.
    tmp = job["result"] + ".part"
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.replace(tmp, job["result"])
    return 0


def serve(preload_generate: bool) -> None:
    import ctypes

    import helpers.jobs  # noqa: F401  (eagle_io, torch, numpy)

    if preload_generate:
        import transformers  # noqa: F401
        from transformers import LlamaForCausalLM  # noqa: F401

    lib = ctypes.CDLL(None)
    lib = lib if hasattr(lib, "eio_fault_arm") else None
    tasks = len(os.listdir("/proc/self/task"))
    print(json.dumps({"ready": True, "tasks": tasks, "shim": lib is not None}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:
            rc = 1
            try:
                rc = _child(job, lib)
            except BaseException:
                import traceback

                traceback.print_exc()
                sys.stderr.flush()
            finally:
                os._exit(rc)
        killed = False
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            elapsed = time.monotonic() - t0
            if not killed and job["kill_after"] is not None and elapsed >= job["kill_after"]:
                os.kill(pid, signal.SIGKILL)  # the parent has not reaped it: the pid is still this child
                killed = True
            elif elapsed > job["timeout"] and not killed:
                os.kill(pid, signal.SIGKILL)
                killed = True
            time.sleep(0.001)
        print(
            json.dumps(
                {
                    "pid": pid,
                    "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                    "exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
                    "killed": killed,
                    "seconds": time.monotonic() - t0,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    sys.path.insert(0, str(TESTS))
    serve("--generate" in sys.argv[1:])
