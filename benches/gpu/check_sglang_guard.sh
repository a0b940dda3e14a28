#!/usr/bin/env bash
# GPU check of the eagle-io SGLang serving guard, in real SGLang scheduler processes (prepared for a lent GPU
# machine; the CPU test suite covers the decision logic on SGLang's real config objects).
#
# Needs: a CUDA GPU, SGLang 0.5.x with its CUDA dependencies importable by $PY (default python3), transformers and
# safetensors; the eagle-io tree with its built extension (python/eagle_io/_native.abi3.so: carry it to the device
# machine). The plugin is found through a temporary entry-point distribution on PYTHONPATH (as an installed
# eagle-io wheel declares it), so nothing is pip-installed.
#
# Cases (one Engine each, ~1-2 min per start on an H200):
#   A  --speculative-algorithm EAGLE with an EAGLE-3 draft      -> startup aborted by the guard (before CUDA graphs)
#   B  --speculative-algorithm NEXTN (alias of EAGLE)           -> aborted the same way
#   C  --speculative-algorithm EAGLE3                           -> starts ("EAGLE-3 draft OK"), generates
#   D  EAGLE with EAGLE_IO_STARTUP_GUARD=0, width check = warn   -> starts; the draft-extend width check logs
#                                                                  "receives 512-wide states but its fc expects 1536"
#                                                                  and the watchdog reports mean accept length 1.00
#   E  eagle-io capture through a capture-only Engine        -> 8 samples verified, equal to the HF path within 3%
# Writes $OUT/guard_check.json (or ./guard_check.json) and the logs; exits non-zero when an expectation fails.
# Usage: benches/gpu/check_sglang_guard.sh            (about 8-10 minutes)
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=${PY:-python3}
RES=${OUT:-$ROOT}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

if ! "$PY" -c "import sglang, torch; assert torch.cuda.is_available()" 2>/dev/null; then
  echo "check_sglang_guard: needs sglang importable by $PY and a CUDA device" >&2
  "$PY" -c "import sglang" 2>&1 | tail -1 >&2
  exit 3
fi

mkdir -p "$WORK/ep/eagle_io_guard_check-0.0.0.dist-info"
printf 'Metadata-Version: 2.1\nName: eagle-io-guard-check\nVersion: 0.0.0\n' \
  >"$WORK/ep/eagle_io_guard_check-0.0.0.dist-info/METADATA"
printf '[sglang.srt.plugins]\neagle_io = eagle_io.serving.plugin:register\n' \
  >"$WORK/ep/eagle_io_guard_check-0.0.0.dist-info/entry_points.txt"
export PYTHONPATH="$WORK/ep:$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
export EAGLE_IO_ACCEPT_WINDOW=16

"$PY" benches/gpu/sglang_guard_case.py make "$WORK" || exit 4
"$PY" - "$WORK" <<'EOF' >"$RES/guard_preflight.txt" 2>&1
import sys
from eagle_io.serving import check_serving, format_findings
w = sys.argv[1]
print(format_findings(check_serving(f"{w}/target", f"{w}/draft", algorithm="EAGLE")))
EOF

run_case() {  # name algorithm [ENV=VALUE...]
  local name=$1 algo=$2
  shift 2
  env "$@" timeout 600 "$PY" benches/gpu/sglang_guard_case.py serve "$WORK" "$algo" >"$RES/guard_$name.out" 2>"$RES/guard_$name.log"
  echo "case $name ($algo $*): exit $?"
}
run_case A EAGLE
run_case B NEXTN
run_case C EAGLE3
run_case D EAGLE EAGLE_IO_STARTUP_GUARD=0 EAGLE_IO_DRAFT_WIDTH_CHECK=warn
timeout 600 "$PY" benches/gpu/sglang_guard_case.py capture "$WORK" >"$RES/guard_E.out" 2>"$RES/guard_E.log"
echo "case E (capture): exit $?"

"$PY" - "$RES" <<'EOF'
import json, pathlib, sys
res = pathlib.Path(sys.argv[1])
def case(n):
    out = (res / f"guard_{n}.out").read_text().strip().splitlines()
    log = (res / f"guard_{n}.log").read_text()
    j = json.loads(out[-1]) if out and out[-1].startswith("{") else {}
    return j, log
checks = {}
pre = (res / "guard_preflight.txt").read_text()
checks["preflight flags EAGLE"] = "eagle3-draft-wrong-algorithm" in pre
for n in "AB":
    j, log = case(n)
    checks[f"{n}: startup aborted"] = j.get("started") is False
    checks[f"{n}: by the eagle-io guard"] = "eagle-io serving guard: refusing" in log
    checks[f"{n}: before CUDA graphs"] = "Capture cuda graph" not in log.split("eagle-io serving guard")[0]
j, log = case("C")
checks["C: started"] = j.get("started") is True
checks["C: guard OK logged"] = "EAGLE-3 draft OK" in log
checks["C: generated"] = bool(j.get("generated")) and all(x > 0 for x in j["generated"])
j, log = case("D")
checks["D: started"] = j.get("started") is True
checks["D: width check fired"] = "receives 512-wide states but its fc expects 1536" in log
checks["D: watchdog fired"] = "mean accept length 1.00" in log
out = (res / "guard_E.out").read_text().strip().splitlines()
e = json.loads(out[-1]) if out and out[-1].startswith("{") else {}
checks["E: capture verified"] = e.get("samples") == 8 and e.get("verify_bad") == 0
checks["E: equals HF within 3%"] = bool(e.get("max_rel_diff")) and max(e["max_rel_diff"].values()) <= 0.03
summary = {"checks": checks, "capture": e, "ok": all(checks.values())}
(res / "guard_check.json").write_text(json.dumps(summary, indent=2))
print(json.dumps(summary, indent=2))
sys.exit(0 if summary["ok"] else 1)
EOF
