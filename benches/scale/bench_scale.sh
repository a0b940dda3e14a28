#!/usr/bin/env bash
# Scaling of encode/decode and of the capture ring at 1-16 threads (issue 10, item 3), as one script for a bigger
# machine (the lent device machine has 16 cores; <= 8 minutes there). Prepare here, where the model and data are:
#   make wheel                                       # abi3 wheel: runs on the device machine's Python 3.12
#   (cd benches && ../.venv/bin/python realdata.py -n 8)   # .bench-data/states-8.pt, ~35 MB of real states
# (zstandard, for the zstd-1 baseline rows, is optional: without it those rows print nan).
# then run with dist/ and .bench-data carried:  bash benches/scale/bench_scale.sh
# Results go to $OUT (or ./scale-results): codec.md (bench_codec_v2.py) and capture.md (bench_capture_rate.py).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-scale-results}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
if ! "$PY" -c "import eagle_io" 2>/dev/null; then
  "$PY" -m pip install -q --no-deps --target "$OUT/site" ../dist/eagle_io-*.whl
  export PYTHONPATH="$OUT/site${PYTHONPATH:+:$PYTHONPATH}"
fi
THREADS="${THREADS:-1,2,4,8,16}"
nproc | tee "$OUT/machine.txt"
N="${N:-8}"
timeout 200 "$PY" bench_codec_v2.py -n "$N" --repeat 2 --threads "$THREADS" --label scale | tee "$OUT/codec.md"
timeout 250 "$PY" bench_capture_rate.py -n "$N" --tokens 512 --samples 16 --threads "$THREADS" | tee "$OUT/capture.md"
