#!/usr/bin/env bash
# GPU check of the training feed (issue 25, item 4), prepared for a lent GPU machine (Python 3.12, torch with CUDA;
# no SGLang, no network; SpecForge not needed: benches/peers.py reads its files as it does).
#
# Needs: the eagle-io tree with its built extension (python/eagle_io/_native.abi3.so, from `make dev` here: carry
# it) and psutil, a CUDA device. Runs benches/gpu/feed_gpu.py: 128 synthetic samples of 512-2048 tokens at hidden
# 4096 (about 5.4 GB of bf16 aux + final states) written in both formats, then per path one cold pass and two warm
# passes to the device: eagle-io's Loader (pinned ring, side-stream copies, 16 decode threads), and
# DataLoader(workers=4, pin_memory=True, persistent_workers=True) over eagle-io shards and over SpecForge .ckpt files.
# Writes $OUT/feed_gpu.json (or ./feed_gpu.json) and $OUT/feed_gpu.log.
# Usage: benches/gpu/bench_feed.sh [feed_gpu.py options]     (about 3-4 minutes on one H200 with 16 cores)
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
RES=${OUT:-$PWD}
if ! "$PY" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  echo "bench_feed: needs torch with a CUDA device for $PY" >&2
  exit 3
fi
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >"$RES/feed_gpu.gpu.txt" 2>&1
timeout 560 "$PY" benches/gpu/feed_gpu.py --out "$RES" "$@" >"$RES/feed_gpu.log" 2>&1
rc=$?
tail -40 "$RES/feed_gpu.log"
exit $rc
