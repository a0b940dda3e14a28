#!/usr/bin/env bash
# The flywheel without SGLang (issue 43 item 4), prepared for a lent device machine (Python 3.12, torch, transformers;
# NO SGLang, no network): benches/gpu/flywheel_offline.py. Dataset A (original answers) -> draft v0; the target's own
# greedy answers to held-out first turns (`generate --regenerate`, B_offline) and the same prompts' original answers
# cut to as many supervised tokens (A'); v1 = v0 continued on B_offline, v1' = v0 continued on A'
# (`train-draft --init-from v0`, same steps); each measured by `eval-draft`'s reference decoder on held-out prompts.
#
# NOT run here, because each needs SGLang: serving the target with a draft, the live capture of its served answers
# (dataset B proper), `swap-draft` into a running server, and SGLang's own accept length. Those stay with
# benches/bench_flywheel.py on a machine with SGLang (this project's CPU runs use the test-only sgl_kernel).
# eagle-io's HF capture, train-draft and the reference decoder take no device option: they run on the machine's CPU
# cores (16 on a lent machine), not on its GPU; no CUDA device is required.
#
# Needs: the eagle-io tree with its built extension (python/eagle_io/_native.abi3.so: carry it) and the embedded
# SmolLM2 GGUF (dequantised once to $EAGLE_IO_CACHE, default ~/.cache/eagle-io).
# Writes $OUT/flywheel_offline.json (or ./flywheel_offline/) and one log per stage.
# Usage: benches/gpu/flywheel_offline.sh [flywheel_offline.py options]
#   (defaults: 200 + 200 records, 600 + 300 steps, 64 eval prompts; size it to the device time left: at
#   --a-records 8 --b-records 8 --eval-prompts 2 --steps 3 --continue-steps 2 it is a smoke run of a few minutes)
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
RES=${OUT:-$PWD/flywheel_offline}
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PY" -c "import torch, transformers, eagle_io._native" 2>/dev/null; then
  echo "flywheel_offline: needs torch, transformers and eagle-io's built extension for $PY" >&2
  exit 3
fi
"$PY" -c "import torch; print('cuda', torch.cuda.is_available(), '(unused: the stages run on CPU)')"
timeout 3000 "$PY" benches/gpu/flywheel_offline.py --out "$RES" "$@" >"$RES.log" 2>&1
rc=$?
tail -40 "$RES.log"
exit $rc
