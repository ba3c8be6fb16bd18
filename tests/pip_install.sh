#!/usr/bin/env bash
# `pip install .` and `pip wheel .` offline, with Debian's setuptools and wheel, reusing the
# CMake build BUILD (no second library build): the installed package imports from outside the
# source tree, its version is the CMake project's, a 2-rank save and load run under mpirun, and
# the wheel is tagged for the platform.
#
#   bash tests/pip_install.sh BUILD WORK
set -euo pipefail
build=$(cd "$1" && pwd)
work=$(realpath -m "$2")
src=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-/usr/bin/python3}
if ! "$python" -m pip --version >/dev/null 2>&1 || ! "$python" -c 'import venv, ensurepip, setuptools, wheel' 2>/dev/null; then
  echo "SKIP: $python lacks pip, venv (ensurepip), setuptools or wheel (scripts/setup.sh installs them)" >&2
  exit 77
fi
rm -rf "$work" && mkdir -p "$work"
"$python" -m venv --system-site-packages "$work/venv"
export DISTCKPT_CMAKE_BUILD_DIR=$build PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
(cd "$src" && "$work/venv/bin/pip" install --no-build-isolation --no-deps . >"$work/install.log" 2>&1) ||
  { tail -n 30 "$work/install.log"; exit 1; }
want=$(sed -n 's/^project(distckpt VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
cd "$work"  # away from the source and build trees: the installed package must be the one imported
got=$("$work/venv/bin/python" -c 'import distckpt, importlib.metadata as m; print(distckpt.__version__, m.version("distckpt"), distckpt.__file__)')
echo "installed: $got (CMake project version $want)"
read -r version meta file <<<"$got"
[[ $version == "$want" && $meta == "$want" && $file == "$work/venv/"* ]] || { echo "FAIL: version or location" >&2; exit 1; }
cat >"$work/check.py" <<'PY'
import sys
import torch
import distckpt
import distckpt.torch as dt
comm = distckpt.Comm.world()
torch.manual_seed(0)
model = torch.nn.Linear(3, 2)
dt.save(comm, {"model": model}, sys.argv[1], step=1)
fresh = torch.nn.Linear(3, 2)
dt.load(comm, {"model": fresh}, sys.argv[1])
assert torch.equal(fresh.weight, model.weight)
comm.close()
PY
mpirun --allow-run-as-root --oversubscribe -np 2 "$work/venv/bin/python" "$work/check.py" "$work/ckpt"
(cd "$src" && "$work/venv/bin/pip" wheel --no-build-isolation --no-deps . -w "$work/wheels" >"$work/wheel.log" 2>&1) ||
  { tail -n 30 "$work/wheel.log"; exit 1; }
ls "$work/wheels"/distckpt-"$want"-cp3*-linux_x86_64.whl
echo "pip install and pip wheel: ok"
