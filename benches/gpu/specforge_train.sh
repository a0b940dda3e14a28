#!/usr/bin/env bash
# GPU check of `specforge train` on an eagle-io dataset with no export (issue 31, item 3): SpecForge 0.2.0's own
# CLI, FSDP trainer and Triton loss through `python -m eagle_io.interop.specforge_train`, beside the same run on
# `export-specforge` output of the same dataset, bf16 and FP8 (see benches/gpu/specforge_train_case.py).
# tests/test_specforge_train.py checks the data path on CPU up to SpecForge's Trainer; this runs the rest.
#
# Needs: a CUDA GPU; $PY (default python3) with torch (CUDA, Triton), transformers, tokenizers, safetensors; the
# eagle-io tree with its built extension (python/eagle_io/_native.abi3.so: carry it); SpecForge 0.2.0 and the
# modules its offline trainer imports (accelerate, pydantic, pyyaml, datasets): installed, or a directory of them
# carried and named by SPECFORGE_SITE (put first on PYTHONPATH; `pip install --no-deps --target DIR
# specforge==0.2.0 ...` on a machine with network). No network.
# Writes $OUT/specforge_train.json (or ./specforge_train.json) and one log per run; exits non-zero when a run did
# not train all its steps.
# Usage: benches/gpu/specforge_train.sh [--max-steps 16]     (about 3-5 minutes: 2 captures, 4 training runs)
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
RES=${OUT:-$PWD}
export PYTHONPATH="${SPECFORGE_SITE:+$SPECFORGE_SITE:}$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PY" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  echo "specforge_train: needs torch with a CUDA device for $PY" >&2
  exit 3
fi
missing=$("$PY" - <<'PY'
import importlib
mods = ["specforge.cli", "specforge.training.trainer", "specforge.algorithms.eagle3.model", "specforge.data.utils",
        "accelerate.utils", "transformers", "eagle_io._native"]
bad = []
for m in mods:
    try:
        importlib.import_module(m)
    except Exception as e:  # report every missing piece at once
        bad.append(f"{m} ({type(e).__name__}: {e})")
print("; ".join(bad))
PY
)
if [ -n "$missing" ]; then
  echo "specforge_train: cannot import $missing (set SPECFORGE_SITE, see the header)" >&2
  exit 3
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >"$RES/specforge_train.gpu.txt" 2>&1
timeout 560 "$PY" benches/gpu/specforge_train_case.py "$RES" "$@" >"$RES/specforge_train.log" 2>&1
rc=$?
tail -60 "$RES/specforge_train.log"
exit $rc
