"""Runs real CPU SGLang engines, each in a process of its own, and writes what each answered: the speculative-decoding
tests' one engine runner (``python sglang_spec_run.py JOB.json OUT.json``).

JOB: ``{"prompts": [[ids]], "max_new_tokens": N, "stop_token_ids": [...], "runs": [{"name", "args", "env"}]}``;
``args`` are ``sglang.Engine`` keyword arguments (:func:`eagle_io.spec.served.engine_args` plus
:data:`helpers.sglang_cpu.SPEC_ENGINE_ARGS`), ``env`` variables of that engine's process (the eagle-io plugin's
switches). Each engine is measured by :func:`eagle_io.spec.served.run_engine`, the code ``eval-draft --engine sglang``
runs. OUT: ``{name: {"tokens", "verify_ct", "completion_tokens", "histograms", "sglang_accept_length",
"accept_length", "server"} | {"error": "..."}, plus "log": the process's output (its scheduler's log included)}``.

One process per engine: when a scheduler fails (a refused launch, a draft-width error in a forward) SGLang sends its
parent SIGQUIT and the parent kills its whole process tree, so a failing launch must not take the other runs with it.
The environment must have the test-only ``sgl_kernel`` on ``PYTHONPATH`` and ``SGLANG_USE_CPU_ENGINE=1``
(:func:`helpers.sglang_cpu.cpu_engine_env`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def run_one(job_path: str, name: str, out_path: str) -> None:
    """Runs the run ``name`` of the job in this process and writes its result (or its error) to ``out_path``."""
    from eagle_io.spec.served import run_engine

    job = json.loads(Path(job_path).read_text())
    (run,) = [r for r in job["runs"] if r["name"] == name]
    try:
        r = run_engine(run["args"], job["prompts"], job["max_new_tokens"], job.get("stop_token_ids", ()))
        res = {
            "tokens": r.tokens,
            "verify_ct": r.verify_ct,
            "completion_tokens": r.completion_tokens,
            "histograms": [h.counts for h in r.per_request],
            "sglang_accept_length": r.sglang_accept_length,
            "accept_length": r.histogram.accept_length,
            "server": r.server,
        }
    except Exception as e:  # the refused launches are expected failures: the test reads the error and the log
        res = {"error": f"{type(e).__name__}: {e}"}
    Path(out_path).write_text(json.dumps(res))


def main(job_path: str, out_path: str, timeout: float = 900) -> None:
    job = json.loads(Path(job_path).read_text())
    work = Path(out_path).parent
    out = {}
    for run in job["runs"]:
        name = run["name"]
        res_file, log_file = work / f"{name}.json", work / f"{name}.log"
        res_file.unlink(missing_ok=True)
        env = {**os.environ, **(run.get("env") or {})}
        with log_file.open("wb") as log:
            try:
                rc = subprocess.run(
                    [sys.executable, __file__, "--one", job_path, name, str(res_file)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    timeout=timeout,
                ).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        if res_file.is_file():
            res = json.loads(res_file.read_text())
        else:  # killed with its engine (SGLang's SIGQUIT on a failed scheduler), or timed out
            res = {"error": f"the engine's process ended ({rc}) without an answer"}
        res["log"] = log_file.read_text(errors="replace")[-30000:]
        out[name] = res
        print(name, "error" if "error" in res else res["sglang_accept_length"], flush=True)
    Path(out_path).write_text(json.dumps(out))


if __name__ == "__main__":
    if sys.argv[1] == "--one":
        run_one(*sys.argv[2:5])
    else:
        main(sys.argv[1], sys.argv[2])
