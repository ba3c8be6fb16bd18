"""The distckpt Python package, built by the project's CMake, for `pip install .` and `pip wheel .`.

The native module (_distckpt) and the package's Python files come from a CMake build tree:
DISTCKPT_CMAKE_BUILD_DIR when set, else ./build when it holds a configured build (so a
checkout that was built costs no second build), else ./build-pip, configured here (Release,
without tests, benchmarks or examples, for the interpreter running pip). `cmake --build`
brings the module up to date; the package is then copied into the wheel, which is
platform-specific (it holds the module, linked against libdistckpt statically and against
Debian's shared libraries: Open MPI, HDF5, protobuf, OpenSSL, ISA-L, liburing, xxHash, zlib).
The version is the CMake project's.
"""
import os
import re
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))


def cmake_version():
    with open(os.path.join(HERE, "CMakeLists.txt")) as f:
        found = re.search(r"project\(distckpt\s+VERSION\s+([0-9][0-9.]*)", f.read())
    if found is None:
        raise RuntimeError("setup.py: no `project(distckpt VERSION x.y.z)` in CMakeLists.txt")
    return found.group(1)


def cmake_build_dir():
    """(the build tree, whether it must be configured here)."""
    given = os.environ.get("DISTCKPT_CMAKE_BUILD_DIR")
    if given:
        path = os.path.abspath(given)
        if not os.path.exists(os.path.join(path, "CMakeCache.txt")):
            raise RuntimeError(f"setup.py: DISTCKPT_CMAKE_BUILD_DIR={given} holds no configured CMake build")
        return path, False
    default = os.path.join(HERE, "build")
    if os.path.exists(os.path.join(default, "CMakeCache.txt")):
        return default, False
    own = os.path.join(HERE, "build-pip")
    return own, not os.path.exists(os.path.join(own, "CMakeCache.txt"))


class BuildWithCMake(build_ext):
    """Builds the module with CMake, then copies the package the build tree holds (as the
    build's extension step: the package has no pure modules of its own for setuptools)."""

    def run(self):
        build, configure = cmake_build_dir()
        if configure:
            subprocess.check_call(["cmake", "-S", HERE, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                                   "-DDISTCKPT_BUILD_TESTS=OFF", "-DDISTCKPT_BUILD_BENCH=OFF",
                                   "-DDISTCKPT_BUILD_EXAMPLES=OFF", f"-DPython3_EXECUTABLE={sys.executable}"])
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
        subprocess.check_call(["cmake", "--build", build, "--target", "_distckpt", "-j", jobs])
        package = os.path.join(build, "python", "distckpt")
        target = os.path.join(self.build_lib, "distckpt")
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(package, target, ignore=shutil.ignore_patterns("__pycache__"))


class BinaryDistribution(Distribution):
    """The wheel holds a native module: tagged for this platform and interpreter."""

    def has_ext_modules(self):
        return True


setup(
    version=cmake_version(),
    cmdclass={"build_ext": BuildWithCMake},
    distclass=BinaryDistribution,
    # setuptools' own scratch space, away from the CMake build trees.
    options={"build": {"build_base": os.path.join(HERE, "build-setuptools")}},
)
