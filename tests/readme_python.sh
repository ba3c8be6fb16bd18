#!/usr/bin/env bash
# The README's Python (torch) quickstart, run as users copy it: its ```python block after a
# prelude that makes what the prose leaves out (a small tensor-parallel model, an
# optimizer, a scheduler, RNGState, train_step), under mpirun -np 4 (dp=2 x tp=2), twice:
# the first run trains and saves, the second resumes where it ended.
# Usage: readme_python.sh SOURCE_DIR BUILD_DIR WORK_DIR
set -euo pipefail
src=$1 build=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
script=$work/quickstart.py
{
  cat "$src/tests/docs_prelude.py"  # the model, optimizer, scheduler and train_step the guides use too
  cat <<'PRELUDE'
import json, sys


class RNGState:
    def state_dict(self):
        return {"torch": torch.get_rng_state()}

    def load_state_dict(self, sd):
        torch.set_rng_state(sd["torch"])
PRELUDE
  awk '/^```python/{n++; if (n==1) {f=1; next}} /^```/{f=0} f' "$src/README.md" | sed "s#\"/ckpt\"#\"$work/ckpt\"#g"
  cat <<'POSTLUDE'
if comm.rank == 0:
    print(json.dumps({"start": start, "checkpoints": [e.name for e in distckpt.list_checkpoints(sys.argv[1])]}))
POSTLUDE
} >"$script"
run() {
  env PYTHONPATH="$build/python" DISTCKPT_BUILD_DIR="$build" \
    mpirun --allow-run-as-root --oversubscribe -np 4 "${PYTHON:-/usr/bin/python3}" "$script" "$work/ckpt" | grep '^{'
}
first=$(run)
second=$(run)
echo "first run: $first"
echo "second run: $second"
python3 - "$first" "$second" <<'CHECK'
import json, sys
first, second = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert first["start"] == 0, first                     # a fresh start
assert first["checkpoints"], first                    # the run saved
assert second["start"] == 5, second                   # resumed after step 4
print("readme python: the quickstart trains, saves and resumes")
CHECK
