#!/usr/bin/env bash
# Crash-and-resume demo for distckpt.
#
#   bash examples/run_train_mlp.sh BUILD_DIR WORK_DIR
#
# Trains the dp=2 x tp=2 MLP of examples/train_mlp.cc three times:
#   (a) uninterrupted for 50 steps                    -> WORK_DIR/ref
#   (b) with a simulated crash at step 25             -> WORK_DIR/run
#   (c) resumed from the newest committed checkpoint  -> WORK_DIR/run
# then lists the checkpoints of (b)+(c) and checks that (c) ended with exactly the same
# model and optimizer state as (a) (same fingerprint). Exit 0 on a match, 1 otherwise.
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR WORK_DIR" >&2
  exit 2
fi
BUILD_DIR=$1
WORK_DIR=$2

TRAIN=""
for candidate in "$BUILD_DIR/train_mlp" "$BUILD_DIR/examples/train_mlp"; do
  if [[ -x $candidate ]]; then TRAIN=$candidate; break; fi
done
if [[ -z $TRAIN ]]; then
  echo "error: train_mlp not found in $BUILD_DIR or $BUILD_DIR/examples (build it first)" >&2
  exit 2
fi
CLI=$BUILD_DIR/distckpt

MPIRUN=(mpirun --allow-run-as-root --oversubscribe -np 4)
ARGS=(--dp 2 --tp 2 --steps 50 --save-every 10)
# More train_mlp flags for all three runs, e.g. TRAIN_EXTRA_ARGS=--async.
read -ra EXTRA <<< "${TRAIN_EXTRA_ARGS:-}"
ARGS+=("${EXTRA[@]}")

mkdir -p "$WORK_DIR"
rm -rf "$WORK_DIR/ref" "$WORK_DIR/run"

# Prints the fingerprint of the "final step N fingerprint HEX" line of a log.
final_fingerprint() {
  awk '$1 == "final" && $4 == "fingerprint" { fp = $5 } END { print fp }' "$1"
}

echo "== (a) reference: 50 uninterrupted steps into $WORK_DIR/ref"
"${MPIRUN[@]}" "$TRAIN" "${ARGS[@]}" --dir "$WORK_DIR/ref" | tee "$WORK_DIR/ref.log"
REF=$(final_fingerprint "$WORK_DIR/ref.log")

echo
echo "== (b) training into $WORK_DIR/run; the last rank crashes at step 25 (expected failure)"
set +e
"${MPIRUN[@]}" "$TRAIN" "${ARGS[@]}" --dir "$WORK_DIR/run" --crash-at-step 25 \
  2>&1 | tee "$WORK_DIR/crash.log"
CRASH_RC=${PIPESTATUS[0]}
set -e
if [[ $CRASH_RC -eq 0 ]]; then
  echo "error: the run with --crash-at-step 25 exited 0; expected a failure" >&2
  exit 1
fi
echo "-- crashed run exited with status $CRASH_RC, as expected"

echo
echo "== (c) resuming in $WORK_DIR/run from the newest committed checkpoint"
"${MPIRUN[@]}" "$TRAIN" "${ARGS[@]}" --dir "$WORK_DIR/run" --resume | tee "$WORK_DIR/resume.log"
RESUMED=$(final_fingerprint "$WORK_DIR/resume.log")

echo
echo "== (d) checkpoints in $WORK_DIR/run"
if [[ -x $CLI ]]; then
  "$CLI" ls "$WORK_DIR/run"
else
  echo "(skipped: $CLI not found)"
fi

echo
echo "== (e) comparing final fingerprints"
echo "reference: ${REF:-<none>}"
echo "resumed:   ${RESUMED:-<none>}"
if [[ -n $REF && $REF == "$RESUMED" ]]; then
  echo "fingerprints match: $REF"
  exit 0
fi
echo "fingerprints MISMATCH: reference ${REF:-<none>} != resumed ${RESUMED:-<none>}" >&2
exit 1
