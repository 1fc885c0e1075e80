#!/usr/bin/env bash
# Installs everything the project needs on a fresh Debian machine (idempotent, quick when already done):
# Debian packages (compiler, CMake, OpenMP, libcjson, oneDNN, Python venv) and a Python virtual environment
# (.venv) holding the test dependencies and the mxfp8 package itself.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v gcc >/dev/null || need+=(gcc)
command -v make >/dev/null || need+=(make)
[ -f /usr/include/cjson/cJSON.h ] || need+=(libcjson-dev)
[ -f /usr/include/oneapi/dnnl/dnnl.h ] || need+=(libdnnl-dev)
ls /usr/lib/gcc/x86_64-linux-gnu/*/include/omp.h >/dev/null 2>&1 || need+=(libgomp1)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
# make test-sanitize / fuzz: clang + libFuzzer, libomp (TSan-aware OpenMP, Archer), valgrind
command -v clang >/dev/null || need+=(clang)
ls /usr/lib/llvm-*/lib/libarcher.so >/dev/null 2>&1 || need+=(libomp-dev)
command -v valgrind >/dev/null || need+=(valgrind)
# Expert parallelism over MPI (libmxfp8_mpi, its ctest label "mpi", mxfp8.mpi, `--expert-parallel`): Debian's Open MPI
command -v mpicc >/dev/null && command -v mpirun >/dev/null || need+=(openmpi-bin libopenmpi-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating the Python virtual environment $VENV"
  python3 -m venv "$VENV"
fi
stamp="$VENV/.deps-stamp"
# scikit-build-core: the build backend of pyproject.toml, installed here so `make python` can reinstall the
# package quickly with --no-build-isolation (CMake itself comes from apt above).
# safetensors: the reference implementation, used by tests/python/test_cli.py to cross-check the CLI's reader/writer.
reqs="numpy ml_dtypes pytest scikit-build-core safetensors"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$reqs" ]; then
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q $reqs
  echo "$reqs" > "$stamp"
fi
# mpi4py for mxfp8.mpi and its tests, compiled against the Open MPI above (--no-binary: a prebuilt wheel may carry
# another MPI, whose communicator handles libmxfp8_mpi could not use).
if ! "$VENV/bin/python" -c "import mpi4py" >/dev/null 2>&1; then
  echo "setup: building mpi4py against $(command -v mpicc)"
  MPICC=mpicc "$VENV/bin/python" -m pip install -q --no-binary mpi4py mpi4py
fi
