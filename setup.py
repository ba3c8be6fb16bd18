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
import sysconfig

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


def fits(tree):
    """Why the CMake build `tree` cannot make this interpreter's package ("" when it can): it
    must be configured with the Python package, for the interpreter running pip."""
    cache = os.path.join(tree, "CMakeCache.txt")
    if not os.path.exists(cache):
        return "it holds no configured CMake build"
    if not os.path.exists(os.path.join(tree, "python", "distckpt", "__init__.py")):
        return "it was configured without the Python package (DISTCKPT_BUILD_PYTHON)"
    with open(cache) as f:
        found = re.search(r"^_?Python3_EXECUTABLE:[A-Z]+=(.*)$", f.read(), re.M)
    if found is None or os.path.realpath(found.group(1)) != os.path.realpath(sys.executable):
        return f"it was configured for {found.group(1) if found else 'another interpreter'}, not {sys.executable}"
    return ""


def cmake_build_dir():
    """(the build tree, whether it must be configured here)."""
    given = os.environ.get("DISTCKPT_CMAKE_BUILD_DIR")
    if given:
        path = os.path.abspath(given)
        why = fits(path)
        if why:
            raise RuntimeError(f"setup.py: DISTCKPT_CMAKE_BUILD_DIR={given} cannot be used: {why}")
        return path, False
    default = os.path.join(HERE, "build")
    if not fits(default):
        return default, False
    own = os.path.join(HERE, "build-pip")
    return own, bool(fits(own))


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
        # This interpreter's module only (a tree may hold another's from an earlier configure).
        mine = "_distckpt" + sysconfig.get_config_var("EXT_SUFFIX")
        shutil.copytree(package, target, ignore=lambda _, names: [
            n for n in names if n == "__pycache__" or (n.startswith("_distckpt.") and n.endswith(".so") and n != mine)])
        if not os.path.exists(os.path.join(target, mine)):
            raise RuntimeError(f"setup.py: the CMake build {build} made no {mine}")


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
