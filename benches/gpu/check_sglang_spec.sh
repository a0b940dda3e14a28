#!/usr/bin/env bash
# GPU check of speculative decoding in real SGLang with its CUDA kernels (issue "The seed's failure inside real
# SGLang", item 6): tests/test_sglang_spec.py's CPU check (which runs sgl-kernel's ops as the test-only torch
# versions of tests/support) repeated with the normal sgl-kernel. See benches/gpu/sglang_spec_case.py for the cases.
#
# Needs: a CUDA GPU, SGLang 0.5.23 with its CUDA dependencies importable by $PY (default python3), transformers,
# tokenizers and safetensors; the eagle-io tree with its built extension (python/eagle_io/_native.abi3.so: carry it).
# The plugin is found through a temporary entry-point distribution on PYTHONPATH, so nothing is pip-installed.
# Writes $OUT/sglang_spec.json (or ./sglang_spec.json) and sglang_spec.log; exits non-zero when a check fails.
# Usage: benches/gpu/check_sglang_spec.sh            (about 3-5 minutes: fixture 1 min, 5 engine starts)
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=${PY:-python3}
RES=${OUT:-$ROOT}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
if ! "$PY" -c "import sglang, torch; assert torch.cuda.is_available()" 2>/dev/null; then
  echo "check_sglang_spec: needs sglang importable by $PY and a CUDA device" >&2
  exit 3
fi
mkdir -p "$WORK/ep/eagle_io_spec_check-0.0.0.dist-info"
printf 'Metadata-Version: 2.1\nName: eagle-io-spec-check\nVersion: 0.0.0\n' \
  >"$WORK/ep/eagle_io_spec_check-0.0.0.dist-info/METADATA"
printf '[sglang.srt.plugins]\neagle_io = eagle_io.serving.plugin:register\n' \
  >"$WORK/ep/eagle_io_spec_check-0.0.0.dist-info/entry_points.txt"
export PYTHONPATH="$WORK/ep:$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >"$RES/sglang_spec.gpu.txt" 2>&1
timeout 580 "$PY" benches/gpu/sglang_spec_case.py "$RES" >"$RES/sglang_spec.log" 2>&1
rc=$?
tail -20 "$RES/sglang_spec.log"
exit $rc
