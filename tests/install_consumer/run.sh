#!/usr/bin/env bash
# Installs the build into a scratch prefix and moves it, builds a consumer with
# find_package(distckpt) against the moved prefix and runs it on 2 ranks. Usage: run.sh BUILD_DIR WORK_DIR
set -euo pipefail
build=$1
work=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work"
# Installed to one prefix, then moved: the package is relocatable (no path of the
# install in its CMake files; the tool finds its HDF5 reader beside itself).
cmake --install "$build" --prefix "$work/installed-here" > "$work.install.log"
if grep -rl "$work/installed-here" "$work/installed-here/lib/cmake"; then
  echo "install_consumer: the CMake package names its install prefix (above)"; exit 1
fi
mv "$work/installed-here" "$work/prefix"
cmake -S "$here" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" > "$work.configure.log"
cmake --build "$work/build" > "$work.build.log"
mpirun --allow-run-as-root --oversubscribe -np 2 "$work/build/consumer" "$work/ckpt" "$work/prefix/"
# The installed HDF5 reader (libexec/distckpt/) reads an .h5 file for the installed tool,
# which finds it beside its bin/ before the build tree's.
reader="$work/prefix/libexec/distckpt/distckpt-hdf5-reader"
test -x "$reader" || { echo "install_consumer: no $reader"; exit 1; }
"$work/prefix/bin/distckpt" convert "$work/ckpt/consumer" "$work/model" --to hdf5 > /dev/null
"$work/prefix/bin/distckpt" verify "$work/model.h5"
# The Python package (when built) lands under the prefix, never in the system's site
# directory, and imports from there (without MPI: importing does not initialise it).
if [ -d "$build/python/distckpt" ]; then
  site=$(find "$work/prefix" -path '*/distckpt/__init__.py' -printf '%h\n' | head -1)
  [ -n "$site" ] || { echo "install_consumer: the Python package was not installed under $work/prefix"; exit 1; }
  py=$(sed -n 's/^Python3_EXECUTABLE:[A-Z]*=//p' "$build/CMakeCache.txt")  # the interpreter it was built for
  PYTHONPATH=$(dirname "$site") "${py:-/usr/bin/python3}" -c 'import distckpt, sys; assert distckpt.__file__.startswith(sys.argv[1]), distckpt.__file__' "$work/prefix"
fi
