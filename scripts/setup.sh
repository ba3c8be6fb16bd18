#!/usr/bin/env bash
# Installs the Debian 12 packages distckpt builds against (see CONTRIBUTING.md "Dependencies").
# Idempotent and quick when everything is already installed. Run as root (or with sudo).
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  openmpi-bin libopenmpi-dev          # MPI runtime and headers
  libhdf5-openmpi-dev hdf5-tools      # parallel HDF5 (integrated format), h5dump
  protobuf-compiler libprotobuf-dev   # index schema, MindSpore .ckpt records
  libssl-dev                          # OpenSSL EVP (encryption)
  libisal-dev                         # ISA-L: hardware CRC32C
  liburing-dev                        # io_uring: a load's small scattered reads in one submission
  libxxhash-dev                       # XXH3-128: incremental saves tell unchanged chunks by content
  libcli11-dev nlohmann-json3-dev     # command-line parsing, JSON (CLI, safetensors headers)
  zlib1g-dev                          # CRC-32 combine for MindSpore's .ckpt footer
  libcurl4-openssl-dev                # HTTP(S) with SigV4 signing: the S3 client of s3:// roots
  libgtest-dev libgmock-dev           # tests
  python3-h5py python3-numpy          # tests: h5py reads the HDF5 files we write
  python3-dev pybind11-dev python3-pybind11  # the Python package (python/): headers, pybind11
  python3-mpi4py python3-pytest       # the Python package's tests: mpi4py communicators, pytest
  python3-torch                       # the Python package: torch tensors (tests, examples)
  python3-pip python3-venv python3-setuptools python3-wheel  # pip install . (pyproject.toml, setup.py)
  procps                              # tests: pgrep finds the ranks a crash test kills
  fio                                 # bench: ckpt_bench --compare-limit measures the storage's limit
  util-linux e2fsprogs quota          # tests (realfs): setpriv, losetup, mkfs.ext4, setquota
  iproute2                            # tests (multinode): ip netns, veth, bridge (cluster/netns.sh)
  slurmctld slurmd slurm-client       # tests (multinode-slurm): Slurm across the namespace hosts
  universal-ctags                     # scripts/check_structure.py: the length of every function
  ceph-mon ceph-osd ceph-mgr radosgw ceph-common  # tests (s3): a single-node Ceph RGW (scripts/s3.sh)
)

# --docs: the site's toolchain too (about 190 MB with Chromium): cmake --build build --target docs.
if [ "${1:-}" = --docs ]; then
  packages+=(
    python3-sphinx python3-myst-parser  # the site, its Markdown pages
    doxygen python3-breathe             # the C++ reference from the public headers
    python3-matplotlib python3-pil      # plots of the benchmarks; checks of images and screenshots
    chromium fonts-liberation           # headless screenshots of rendered pages (checked non-blank)
  )
fi

installed=$(dpkg-query -W -f='${Status}\n' "${packages[@]}" 2>/dev/null | grep -c "install ok installed" || true)
if [ "$installed" -ne "${#packages[@]}" ]; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${packages[@]}"
fi
echo "setup: all build dependencies are installed${1:+ ($1)}"
