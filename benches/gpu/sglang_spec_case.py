"""The speculative-decoding check of tests/test_sglang_spec.py on a GPU, with SGLang's own CUDA kernels (the normal
sgl-kernel) instead of the CPU test's torch ops: the same tiny target and self-trained draft
(tests/helpers/spec_fixture.py), float32, then one engine per launch (tests/helpers/sglang_spec_run.py):
non-speculative, EAGLE3 chain and tree, EAGLE with eagle-io's plugin off, EAGLE with it on (refused). Checks each
speculative launch is lossless, EAGLE3 > 1.8 > 1.2 > EAGLE (SGLang's pooled figure), the refusal, and eagle_io.spec's
tokens and per-request verify counts against SGLang's (chain, EAGLE3 and EAGLE). Writes OUT/sglang_spec.json and exits
non-zero when an expectation fails. Usage: python sglang_spec_case.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402
from helpers import sglang_spec_run  # noqa: E402
from helpers.spec_fixture import NEW_TOKENS, STEPS, build_spec_fixture  # noqa: E402

from eagle_io.capturing.models import load_target  # noqa: E402
from eagle_io.spec import SpeculativeDecoder, load_served_draft  # noqa: E402
from eagle_io.spec.served import engine_args  # noqa: E402

GPU = {"device": "cuda", "dtype": "float32", "mem_fraction_static": 0.5}


def main(out_dir: str) -> int:
    work = Path(tempfile.mkdtemp())
    target, ds, draft, prompts, eos = build_spec_fixture(work)

    def spec(algorithm: str, topk: int = 1) -> dict:
        return engine_args(target, draft, algorithm=algorithm, num_steps=STEPS, topk=topk, extra=GPU)

    runs = [
        {"name": "none", "args": {"model_path": str(target), "skip_tokenizer_init": True, **GPU}},
        {"name": "eagle3_chain", "args": spec("EAGLE3")},
        {"name": "eagle3_tree", "args": spec("EAGLE3", topk=4)},
        {"name": "eagle_plugin_off", "args": spec("EAGLE"), "env": {"EAGLE_IO_SGLANG_PLUGIN": "0"}},
        {"name": "eagle_guarded", "args": spec("EAGLE")},
    ]
    job, res_path = work / "job.json", work / "res.json"
    job.write_text(json.dumps({"prompts": prompts, "max_new_tokens": NEW_TOKENS, "stop_token_ids": eos, "runs": runs}))
    sglang_spec_run.main(str(job), str(res_path))
    res = json.loads(res_path.read_text())
    checks: dict[str, bool] = {}
    ok = {k: "error" not in v for k, v in res.items()}
    plain = res["none"].get("tokens")
    for name in ("eagle3_chain", "eagle3_tree", "eagle_plugin_off"):
        checks[f"{name} lossless"] = ok[name] and res[name]["tokens"] == plain
    if ok["eagle3_chain"] and ok["eagle_plugin_off"]:
        checks["EAGLE3 chain > 1.8"] = res["eagle3_chain"]["sglang_accept_length"] > 1.8
        checks["EAGLE < 1.2"] = res["eagle_plugin_off"]["sglang_accept_length"] < 1.2
    checks["EAGLE refused at startup"] = not ok["eagle_guarded"] and "ServingGuardError" in res["eagle_guarded"]["log"]
    model, _, info = load_target(str(target), dtype=torch.float32)
    served = load_served_draft(str(draft), model, info, dataset=str(ds))
    for algo, name in (("EAGLE3", "eagle3_chain"), ("EAGLE", "eagle_plugin_off")):
        dec = SpeculativeDecoder(served.target, served.draft, num_steps=STEPS, as_algorithm=algo, eos_token_ids=eos)
        out = dec.generate(prompts, NEW_TOKENS)
        checks[f"reference decoder = SGLang ({algo})"] = ok[name] and (
            out.tokens == res[name]["tokens"] and [h.verify_steps for h in out.per_request] == res[name]["verify_ct"]
        )
    summary = {
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "checks": checks,
        "runs": {k: {kk: vv for kk, vv in v.items() if kk != "log"} for k, v in res.items()},
    }
    Path(out_dir, "sglang_spec.json").write_text(json.dumps(summary, indent=2))
    for k, v in checks.items():
        print(f"{'ok  ' if v else 'FAIL'} {k}")
    return 0 if checks and all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
