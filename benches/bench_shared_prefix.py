"""Bytes on disk and read rate of samples sharing a long system prompt, stored whole vs as references to one prefix
record (format version 3, docs/FORMAT.md 4.7; issue 44 item 5, offline part).

Synthetic states (bf16, normal with std 3 for the aux blocks and 1 for the final state, like the tests'), at a
target's widths: this measures the format and the reader (what a reference saves and what reassembly costs), not a
model's value statistics. Both datasets hold the same whole samples (checked: every sample reads back equal).

    python benches/bench_shared_prefix.py --out /tmp/prefix-bench            # 2,000 + 500 tokens, 32 samples, H 576
    python benches/bench_shared_prefix.py --smoke --out /tmp/prefix-smoke    # tiny, for tests

``--generate`` measures the capture instead: ``eagle-io generate`` on the main job (the embedded SmolLM2-135M GGUF, or
``--model``) over the first ``--records`` ShareGPT conversations (the embedded file) with one shared system prompt of
about ``--system-words`` words put first in each (records that have a system turn of their own are left out), run with
``--dedup-prefixes`` on (the default) and off: bytes on disk per sample, and how many samples read back bit-identical
(a referencing sample's prefix rows are the first capture's: another forward's batch rounding may differ).

    python benches/bench_shared_prefix.py --generate --out /tmp/prefix-generate --records 12
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import eagle_io
from conftest import make_sample


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefix-tokens", type=int, default=2000)
    ap.add_argument("--suffix-tokens", type=int, default=500)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=576, help="SmolLM2-135M's width by default")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--smoke", action="store_true", help="40 + 10 tokens, 4 samples, hidden 16")
    ap.add_argument("--generate", action="store_true", help="measure eagle-io generate instead (see the docstring)")
    ap.add_argument("--model", help="--generate: the target (default: the embedded SmolLM2-135M GGUF)")
    ap.add_argument("--records", type=int, default=12, help="--generate: ShareGPT records read")
    ap.add_argument("--system-words", type=int, default=400, help="--generate: words of the shared system prompt")
    ap.add_argument("--max-length", type=int, default=1024, help="--generate: generate's --max-length")
    a = ap.parse_args(argv)
    if a.generate:
        return measure_generate(a)
    if a.smoke:
        a.prefix_tokens, a.suffix_tokens, a.samples, a.hidden = 40, 10, 4, 16
    shutil.rmtree(a.out, ignore_errors=True)
    schema = eagle_io.eagle3_schema(a.hidden)
    prefix = make_sample(10**6, a.prefix_tokens, hidden=a.hidden)
    result: dict = {"prefix_tokens": a.prefix_tokens, "suffix_tokens": a.suffix_tokens, "samples": a.samples}
    for name in ("whole", "dedup"):
        t0 = time.perf_counter()
        with eagle_io.ShardWriter(a.out / name, schema, {}) as w:
            if name == "dedup":
                w.write_prefix(1, prefix)
            for i in range(a.samples):
                s = make_sample(i, a.suffix_tokens, hidden=a.hidden)
                if name == "dedup":
                    w.write(i, s, prefix=1)
                else:
                    w.write(i, {k: torch.cat([prefix[k], v]) for k, v in s.items()})
        written = time.perf_counter() - t0
        m = json.loads((a.out / name / "manifest.json").read_text())
        ds = eagle_io.Dataset(a.out / name)
        t1 = time.perf_counter()
        for pos in range(len(ds)):
            ds[pos]
        read = time.perf_counter() - t1
        stored = sum(s["bytes"] for s in m["shards"] + m.get("prefixes", []))
        result[name] = {
            "bytes": stored,
            "bytes_per_sample": stored / a.samples,
            "write_s": round(written, 3),
            "read_samples_per_s": round(a.samples / read, 1),
        }
    whole, dedup = eagle_io.Dataset(a.out / "whole"), eagle_io.Dataset(a.out / "dedup")
    for pos in range(len(whole)):
        x, y = whole[pos], dedup[pos]
        assert all(torch.equal(x[k], y[k]) for k in ("input_ids", "loss_mask", "aux_hidden_states", "hidden_states"))
    result["bytes_ratio"] = round(result["whole"]["bytes"] / result["dedup"]["bytes"], 3)
    (a.out / "shared_prefix.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0


def measure_generate(a: argparse.Namespace) -> int:
    from eagle_io.cli import main as cli
    from eagle_io.data import SkipStats, default_dataset_path, iter_conversations

    shutil.rmtree(a.out, ignore_errors=True)
    a.out.mkdir(parents=True)
    words = "Always answer as the support assistant of an online bookshop, politely and precisely; cite the policy"
    system = " ".join(f"Rule {i}: {words} section {i} applies." for i in range(a.system_words // 20 + 1))
    records = []
    for c in iter_conversations(str(default_dataset_path()), on_error="skip", stats=SkipStats()):
        if len(records) == a.records:
            break
        if all(m["role"] != "system" for m in c.messages):
            records.append({"id": c.id, "messages": [{"role": "system", "content": system}, *c.messages]})
    data = a.out / "data.json"
    data.write_text(json.dumps(records))
    result: dict = {"records": len(records), "system_words": len(system.split()), "max_length": a.max_length}
    for mode in ("on", "off"):
        argv = ["generate", "--dataset", str(data), "--out", str(a.out / mode), "--max-length", str(a.max_length)]
        argv += ["--skip-bad-records", "--dedup-prefixes", mode, "--summary-json", str(a.out / f"{mode}.json")]
        argv += ["--model", a.model] if a.model else []
        t0 = time.perf_counter()
        assert cli(argv) == 0
        summary = json.loads((a.out / f"{mode}.json").read_text())
        ds = eagle_io.Dataset(a.out / mode)
        m = ds.manifest
        stored = sum(s["bytes"] for s in m["shards"] + m.get("prefixes", []))
        result[mode] = {
            "samples": len(ds),
            "tokens": summary["tokens_written"],
            "bytes": stored,
            "bytes_per_sample": round(stored / len(ds)),
            "prefix_records": [p[1] for p in ds.prefix_records()],
            "seconds": round(time.perf_counter() - t0, 1),
        }
    on, off = eagle_io.Dataset(a.out / "on"), eagle_io.Dataset(a.out / "off")
    identical, worst = 0, 0.0
    for pos in range(len(on)):
        x, y = on[pos], off[pos]
        same = all(torch.equal(x[k], y[k]) for k in ("input_ids", "loss_mask", "aux_hidden_states", "hidden_states"))
        identical += same
        for k in ("aux_hidden_states", "hidden_states"):
            worst = max(worst, float((x[k].float() - y[k].float()).abs().max()))
    result["bit_identical_samples"] = identical
    result["max_abs_difference"] = worst
    result["bytes_ratio"] = round(result["off"]["bytes"] / result["on"]["bytes"], 3)
    (a.out / "shared_prefix_generate.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
