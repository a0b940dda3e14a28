#!/usr/bin/env bash
# GPU run of benches/bench_live_overhead.py (issue 32, item 5: overhead of a live capture, measured): one
# `python -m sglang.launch_server` serving a target + EAGLE-3 draft under EAGLE3 (chain), eagle-io's plugin on, takes
# the same load with no capture, a live capture at rate 0 and one at rate 1, interleaved in rounds; reports output
# tokens/s, p50/p99 latency, the server tree's CPU per token, each against no capture, the tokens check and what rate 1
# stored. Not yet run on a GPU.
#
# Needs (the lent GPU machines of 2026-12 have neither SGLang nor network: install first, or this refuses):
#   - a CUDA device and SGLang 0.5.23 with its CUDA dependencies (sgl-kernel, flashinfer) importable by $PY
#     (default python3), plus transformers, psutil, safetensors;
#   - the eagle-io tree with its built extension (python/eagle_io/_native.abi3.so, from `make dev`: carry it);
#   - TARGET=<HF dir of the target> DRAFT=<HF dir of an EAGLE-3 draft for it> (prompts: 8 built-in English prompts
#     tokenized by the target's tokenizer, or PROMPTS_FILE=<one prompt per line>); DTYPE (default bfloat16).
#     Without TARGET/DRAFT it builds tests/helpers/spec_fixture.py's tiny float32 Llama + trained draft (2-3 min,
#     CPU): that measures SGLang's per-step overhead, not a production-width copy.
# The plugin is found through a temporary entry-point distribution on PYTHONPATH, so nothing is pip-installed.
# Writes $OUT/live_overhead.json (or ./live_overhead.json), live_overhead.log and live_overhead_server.log.
# Usage: TARGET=... DRAFT=... benches/gpu/bench_live_overhead.sh [--rounds 3 --clients 8 --requests 64 ...]
#        (about 5 minutes with a small target: one engine start, 3 rounds x 3 settings)
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=${PY:-python3}
RES=${OUT:-$ROOT}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
if ! "$PY" -c "import sglang" 2>/dev/null; then
  echo "bench_live_overhead: SGLang is not importable by $PY: install SGLang 0.5.23 (with its CUDA dependencies)" \
    "on this machine first; nothing was run" >&2
  exit 3
fi
if ! "$PY" -c "import torch, psutil; assert torch.cuda.is_available()" 2>/dev/null; then
  echo "bench_live_overhead: needs torch with a CUDA device and psutil for $PY" >&2
  exit 3
fi
ARGS=(--device cuda --out "$RES")
if [[ -n "${TARGET:-}${DRAFT:-}" ]]; then
  if [[ -z "${TARGET:-}" || -z "${DRAFT:-}" || ! -d "${TARGET:-}" || ! -d "${DRAFT:-}" ]]; then
    echo "bench_live_overhead: TARGET and DRAFT must both name model directories (TARGET='${TARGET:-}'," \
      "DRAFT='${DRAFT:-}')" >&2
    exit 3
  fi
  ARGS+=(--target "$TARGET" --draft "$DRAFT" --dtype "${DTYPE:-bfloat16}")
  [[ -n "${PROMPTS_FILE:-}" ]] && ARGS+=(--prompts-file "$PROMPTS_FILE")
else
  echo "bench_live_overhead: no TARGET/DRAFT: building the tiny float32 fixture" >&2
  ARGS+=(--dtype float32)
fi
mkdir -p "$WORK/ep/eagle_io_live_bench-0.0.0.dist-info"
printf 'Metadata-Version: 2.1\nName: eagle-io-live-bench\nVersion: 0.0.0\n' \
  >"$WORK/ep/eagle_io_live_bench-0.0.0.dist-info/METADATA"
printf '[sglang.srt.plugins]\neagle_io = eagle_io.serving.plugin:register\n' \
  >"$WORK/ep/eagle_io_live_bench-0.0.0.dist-info/entry_points.txt"
export PYTHONPATH="$WORK/ep:$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >"$RES/live_overhead.gpu.txt" 2>&1
timeout 580 "$PY" benches/bench_live_overhead.py "${ARGS[@]}" "$@" >"$RES/live_overhead.log" 2>&1
rc=$?
tail -25 "$RES/live_overhead.log"
exit $rc
