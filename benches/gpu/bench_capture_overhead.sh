#!/usr/bin/env bash
# GPU check of the capture overhead at production width (issue: codec and read path at the per-core limit, item 5),
# prepared for a lent GPU machine (Python 3.12, torch with CUDA, transformers; no SGLang, no network).
#
# Needs: the eagle-io tree with its built extension (python/eagle_io/_native.abi3.so, from `make dev` here: carry
# it), a CUDA device. Runs benches/gpu/capture_overhead.py (random Llama, hidden 7168, 8 layers, aux [2, 4, 5]:
# 21,504-wide bf16 rows; prefill batches of 4 x 2048 tokens): forward alone vs with the pinned ring, then 60 s of
# sustained capture on every core, then the same two phases with FP8 storage (quantised on the GPU before the copy;
# 30 s sustained, --fp8-sustain-s 0 skips them), then verify. Writes $OUT/capture_overhead.json (or
# ./capture_overhead.json).
# Usage: benches/gpu/bench_capture_overhead.sh            (about 5-7 minutes on one H200 with 16 cores)
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
RES=${OUT:-$PWD}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
if ! "$PY" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  echo "bench_capture_overhead: needs torch with a CUDA device for $PY" >&2
  exit 3
fi
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >"$RES/capture_overhead.gpu.txt" 2>&1
timeout 560 "$PY" benches/gpu/capture_overhead.py --out "$WORK" "$@" >"$RES/capture_overhead.log" 2>&1
rc=$?
cp "$WORK/capture_overhead.json" "$RES/" 2>/dev/null
tail -40 "$RES/capture_overhead.log"
exit $rc
