#!/usr/bin/env bash
# Crash-and-resume check of examples/train_torch.py (a small GPT at DP x TP):
#
#   bash examples/run_train_torch.sh BUILD_DIR WORK_DIR
#
#   (a) 36 uninterrupted steps at DP2 x TP2                  -> WORK_DIR/ref
#   (b) the same run; its last rank is killed (SIGKILL) at step 17 -> WORK_DIR/run
#   (c) resumed at DP2 x TP2 from the newest committed checkpoint (step 15): every loss of
#       steps 16-36 must equal (a)'s exactly, bit for bit
#   (d) that checkpoint resumed at DP1 x TP4, DP4 x TP1 (4 ranks) and DP1 x TP2 (2 ranks,
#       another world size): the 20 losses of steps 16-35 must be within a relative 1e-5 of (a)'s
#   (e) that checkpoint resumed under torch's launcher instead (--spawn 4: torch.multiprocessing,
#       gloo, Comm.from_torch, no MPI) up to step 20, and (f) its step-20 checkpoint resumed
#       under mpirun up to step 24: both bit-identical to (a)
# Exit 0 when all hold.
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
# The example's checkpoint code: non-blank, non-comment lines between its markers, at most 15.
lines=$(awk '/# checkpoint: begin/ { on = 1; next } /# checkpoint: end/ { on = 0 } on && !/^[[:space:]]*(#|$)/' \
  "$HERE/train_torch.py" | wc -l)
echo "checkpoint code: $lines lines"
if [[ $lines -gt 15 || $lines -lt 5 ]]; then
  echo "error: examples/train_torch.py has $lines lines of checkpoint code (5-15 expected)" >&2
  exit 1
fi
run() {  # run NP ARGS...: the example on NP ranks
  local np=$1
  shift
  mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$np" "$PYTHON" "$HERE/train_torch.py" --save-every 5 "$@"
}
mkdir -p "$WORK_DIR"
rm -rf "$WORK_DIR/ref" "$WORK_DIR/run"

echo "== (a) reference: 36 uninterrupted steps at DP2 x TP2"
run 4 --dp 2 --tp 2 --steps 36 --dir "$WORK_DIR/ref" | tee "$WORK_DIR/ref.log"

echo "== (b) the last rank is killed at step 17 (expected failure)"
set +e
run 4 --dp 2 --tp 2 --steps 36 --dir "$WORK_DIR/run" --crash-at-step 17 > "$WORK_DIR/crash.log" 2>&1
rc=$?
set -e
tail -n 3 "$WORK_DIR/crash.log"
if [[ $rc -eq 0 ]]; then
  echo "error: the run killed at step 17 exited 0" >&2
  exit 1
fi

# compare REF LOG FIRST LAST TOLERANCE: the losses of steps FIRST..LAST in LOG against REF's
# (tolerance 0: the same text, bit-identical floats; else a relative difference).
compare() {
  "$PYTHON" - "$@" <<'PY'
import sys
ref, log, first, last, tol = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
def losses(path):
    out = {}
    for line in open(path):
        w = line.split()
        if len(w) == 4 and w[0] == "step" and w[2] == "loss":
            out[int(w[1])] = w[3]
    return out
a, b = losses(ref), losses(log)
steps = range(first, last + 1)
missing = [s for s in steps if s not in a or s not in b]
if missing:
    sys.exit(f"{log}: no loss for steps {missing}")
worst = max(abs(float(a[s]) - float(b[s])) / abs(float(a[s])) for s in steps)
same = all(a[s] == b[s] for s in steps)
print(f"{log}: steps {first}-{last}: {'bit-identical' if same else 'differ'}, largest relative difference {worst:.3g}")
sys.exit(0 if (same if tol == 0 else worst <= tol) else 1)
PY
}

status=0
for layout in "4 1 4" "4 4 1" "2 1 2"; do
  read -r np dp tp <<< "$layout"
  echo "== (d) the checkpoint of step 15 resumed at DP$dp x TP$tp ($np ranks)"
  rm -rf "$WORK_DIR/other"
  cp -r "$WORK_DIR/run" "$WORK_DIR/other"
  # On another mesh each rank plays another part: its RNG state (per rank) is left out.
  run "$np" --dp "$dp" --tp "$tp" --steps 35 --dir "$WORK_DIR/other" --resume --reshard > "$WORK_DIR/other-$dp-$tp.log"
  grep -q "^resumed step 15$" "$WORK_DIR/other-$dp-$tp.log" || { echo "DP$dp x TP$tp did not resume step 15" >&2; status=1; }
  compare "$WORK_DIR/ref.log" "$WORK_DIR/other-$dp-$tp.log" 16 35 1e-5 || status=1
done

echo "== (e) the checkpoint of step 15 resumed under torch.multiprocessing (gloo, no MPI) at DP2 x TP2"
rm -rf "$WORK_DIR/torch"
cp -r "$WORK_DIR/run" "$WORK_DIR/torch"
# Without mpirun's environment: these processes must not believe they run under MPI.
env -u OMPI_COMM_WORLD_SIZE -u OMPI_COMM_WORLD_RANK -u PMIX_RANK -u PMI_SIZE \
  "$PYTHON" "$HERE/train_torch.py" --spawn 4 --dp 2 --tp 2 --steps 20 --save-every 5 --dir "$WORK_DIR/torch" \
  --resume > "$WORK_DIR/torch.log"
grep -q "^resumed step 15$" "$WORK_DIR/torch.log" || { echo "the torch launcher did not resume step 15" >&2; status=1; }
compare "$WORK_DIR/ref.log" "$WORK_DIR/torch.log" 16 20 0 || status=1
echo "== (f) the torch launcher's checkpoint of step 20 resumed under mpirun"
run 4 --dp 2 --tp 2 --steps 24 --dir "$WORK_DIR/torch" --resume > "$WORK_DIR/torch-mpi.log"
grep -q "^resumed step 20$" "$WORK_DIR/torch-mpi.log" || { echo "mpirun did not resume step 20" >&2; status=1; }
compare "$WORK_DIR/ref.log" "$WORK_DIR/torch-mpi.log" 21 24 0 || status=1

echo "== (c) resumed at DP2 x TP2"
run 4 --dp 2 --tp 2 --steps 36 --dir "$WORK_DIR/run" --resume | tee "$WORK_DIR/resume.log"
grep -q "^resumed step 15$" "$WORK_DIR/resume.log" || { echo "the resume did not start from step 15" >&2; exit 1; }
compare "$WORK_DIR/ref.log" "$WORK_DIR/resume.log" 16 36 0 || exit 1
exit $status
