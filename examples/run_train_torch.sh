#!/usr/bin/env bash
# Crash-and-resume demo of the Python package, as run_train_mlp.sh is for the C++ one.
#
#   bash examples/run_train_torch.sh BUILD_DIR WORK_DIR
#
# Trains examples/train_torch.py at DP2 x TP2 on 4 ranks:
#   (a) uninterrupted for 30 steps                      -> WORK_DIR/ref
#   (b) the last rank crashes at step 17                -> WORK_DIR/run
#   (c) resumed from the newest committed checkpoint    -> WORK_DIR/run
#   (d) the same checkpoint resumed at DP1 x TP4 and at DP4 x TP1 (a reshard)
# and checks that (c) ends with the fingerprint of (a), and that (d) restores the
# fingerprint (b) printed when it saved that step. Exit 0 when all match.
set -euo pipefail
if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR WORK_DIR" >&2
  exit 2
fi
BUILD_DIR=$(cd "$1" && pwd)
WORK_DIR=$2
HERE=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
[[ -x $PYTHON ]] || PYTHON=python3
export PYTHONPATH=$BUILD_DIR/python${PYTHONPATH:+:$PYTHONPATH}
if ! "$PYTHON" -c 'import distckpt, torch, mpi4py' 2>/dev/null; then
  echo "error: cannot import distckpt, torch and mpi4py with $PYTHON (scripts/setup.sh; build first)" >&2
  exit 2
fi
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np 4)
TRAIN=("$PYTHON" "$HERE/train_torch.py" --steps 30 --save-every 5)
mkdir -p "$WORK_DIR"
rm -rf "$WORK_DIR/ref" "$WORK_DIR/run"

# fingerprint LOG WHAT [STEP]: the fingerprint of the last "WHAT step S fingerprint F" line
# (of step STEP when given).
fingerprint() {
  awk -v what="$2" -v step="${3:-}" '$1 == what && $4 == "fingerprint" && (step == "" || $3 == step) { fp = $5 } END { print fp }' "$1"
}

echo "== (a) reference: 30 uninterrupted steps at DP2 x TP2"
"${MPIRUN[@]}" "${TRAIN[@]}" --dp 2 --tp 2 --dir "$WORK_DIR/ref" | tee "$WORK_DIR/ref.log"
REF=$(fingerprint "$WORK_DIR/ref.log" final)

echo "== (b) the last rank crashes at step 17 (expected failure)"
set +e
"${MPIRUN[@]}" "${TRAIN[@]}" --dp 2 --tp 2 --dir "$WORK_DIR/run" --crash-at-step 17 2>&1 | tee "$WORK_DIR/crash.log"
rc=${PIPESTATUS[0]}
set -e
if [[ $rc -eq 0 ]]; then
  echo "error: the run with --crash-at-step 17 exited 0" >&2
  exit 1
fi
SAVED=$(fingerprint "$WORK_DIR/crash.log" saved 15)

status=0
for layout in "1 4" "4 1"; do
  read -r dp tp <<< "$layout"
  echo "== (d) the checkpoint of step 15 restored at DP$dp x TP$tp"
  rm -rf "$WORK_DIR/other"
  cp -r "$WORK_DIR/run" "$WORK_DIR/other"
  "${MPIRUN[@]}" "${TRAIN[@]}" --dp "$dp" --tp "$tp" --steps 15 --dir "$WORK_DIR/other" --resume | tee "$WORK_DIR/other.log"
  GOT=$(fingerprint "$WORK_DIR/other.log" restored 15)
  if [[ -z $SAVED || $GOT != "$SAVED" ]]; then
    echo "MISMATCH at DP$dp x TP$tp: restored ${GOT:-<none>}, saved ${SAVED:-<none>}" >&2
    status=1
  fi
done

echo "== (c) resuming at DP2 x TP2"
"${MPIRUN[@]}" "${TRAIN[@]}" --dp 2 --tp 2 --dir "$WORK_DIR/run" --resume | tee "$WORK_DIR/resume.log"
RESUMED=$(fingerprint "$WORK_DIR/resume.log" final)
echo "reference final: ${REF:-<none>}"
echo "resumed final:   ${RESUMED:-<none>}"
echo "saved at step 15: ${SAVED:-<none>}; restored elsewhere: as checked above"
if [[ -z $REF || $REF != "$RESUMED" ]]; then
  echo "fingerprints MISMATCH" >&2
  exit 1
fi
[[ $status -eq 0 ]] && echo "fingerprints match: $REF"
exit $status
