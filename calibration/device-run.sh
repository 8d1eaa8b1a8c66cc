#!/usr/bin/env bash
# One call on a GPU machine lent by the device tool (see calibration/README.md, "On a lent GPU
# machine"): install the carried wheels, run the harness within a budget, leave the rows in $OUT.
#
#   GRID=quick|full  BUDGET=seconds (default 420)  JOB_TIMEOUT=seconds (default 120)
#   OUTPUT=validation/measured-own.jsonl  ONLY=regex  SNAPSHOT=1 (what was live at each peak)
#   KEEP_LOAD_CACHE=1 (measure the step on top of what loading left in the cache)
#
# The rows file lives in the working tree, so copying it back from $OUT before the next call
# makes that call resume where this one stopped.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/moro-calibration-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} || exit 2
fi
export PYTHONUNBUFFERED=1
MORO=${MORO:-}
for m in .calib/moro target/release/moro; do
    if [ -z "$MORO" ] && [ -x "$m" ]; then MORO=$m; fi
done
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv 2>&1 | tee "$OUT/nvidia-smi.txt"
OUTPUT=${OUTPUT:-validation/measured-own.jsonl}
args=(--output "$OUTPUT" --grid "${GRID:-full}" --budget-seconds "${BUDGET:-420}"
      --job-timeout "${JOB_TIMEOUT:-120}")
if [ -n "$MORO" ]; then args+=(--moro "$MORO"); else args+=(--no-moro); fi
if [ -n "${ONLY:-}" ]; then args+=(--only "$ONLY"); fi
if [ -n "${SNAPSHOT:-}" ]; then args+=(--snapshot); fi
if [ -n "${KEEP_LOAD_CACHE:-}" ]; then args+=(--keep-load-cache); fi
python3 calibration/harness.py "${args[@]}" 2>&1 | tee "$OUT/harness.log"
rc=${PIPESTATUS[0]}
cp "$OUTPUT" "$OUTPUT.machine.json" "$OUT/" 2>/dev/null
if [ -d "$OUTPUT.traces" ]; then tar czf "$OUT/traces.tgz" -C "$OUTPUT.traces" .; fi
if [ -n "$MORO" ] && [ -f "$OUTPUT" ]; then
    "$MORO" validate "$OUTPUT" > "$OUT/validate.txt" 2>&1
    tail -n 25 "$OUT/validate.txt"
fi
exit "$rc"
