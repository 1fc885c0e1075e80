#!/usr/bin/env bash
# Installs what the project needs on a fresh Debian machine (idempotent, quick when already done).
#   scripts/setup.sh          what `make build` / `make run` / `make python` need: Debian packages (compiler, CMake,
#                             OpenMP, libcjson, oneDNN, Python venv) and a Python virtual environment (.venv) with
#                             numpy, ml_dtypes and scikit-build-core (`make python` then installs the package into it).
#   scripts/setup.sh --test   the above plus what the tests need: pytest, safetensors, matplotlib, tqdm in .venv, and
#                             PyTorch (for mxfp8.torch), installed once for the system python3 -- never into .venv.
# torch is 5.4 GB installed: .venv is created with --system-site-packages so that every clone shares the one copy.
set -euo pipefail
cd "$(dirname "$0")/.."
TEST=0
for arg in "$@"; do
  case "$arg" in
    --test) TEST=1 ;;
    *) echo "setup: unknown argument '$arg' (usage: scripts/setup.sh [--test])" >&2; exit 2 ;;
  esac
done

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
if [ "$TEST" = 1 ]; then
  # make test-sanitize / fuzz: clang + libFuzzer, libomp (TSan-aware OpenMP, Archer), valgrind
  command -v clang >/dev/null || need+=(clang)
  ls /usr/lib/llvm-*/lib/libarcher.so >/dev/null 2>&1 || need+=(libomp-dev)
  command -v valgrind >/dev/null || need+=(valgrind)
  # Expert parallelism over MPI (libmxfp8_mpi, its ctest label "mpi", mxfp8.mpi, `--expert-parallel`): Debian's
  # Open MPI. The build picks it up when present (a build configured before it was installed finds it on the next
  # configure).
  command -v mpicc >/dev/null && command -v mpirun >/dev/null || need+=(openmpi-bin libopenmpi-dev)
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

# The interpreter that owns the system site-packages the venv sees (a pyenv shim resolves to its real python).
PY3=$(python3 -c 'import sys; print(sys.executable)')

# PyTorch for the tests of mxfp8.torch: once, system-wide, never into a venv (--test only; `make run` never needs it).
if [ "$TEST" = 1 ] && ! "$PY3" -c 'import torch' >/dev/null 2>&1; then
  echo "setup: installing PyTorch for $PY3 (system-wide, about 3 GB to download)"
  "$PY3" -m pip --version >/dev/null 2>&1 || {
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-pip >/dev/null
  }
  pip_torch=("$PY3" -m pip install -q torch)
  # Debian marks its python EXTERNALLY-MANAGED (PEP 668); a system-wide install there needs the explicit opt-in.
  if [ -f "$("$PY3" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')/EXTERNALLY-MANAGED" ]; then
    pip_torch+=(--break-system-packages)
  fi
  if [ -w "$("$PY3" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" ]; then
    "${pip_torch[@]}"
  else
    $SUDO "${pip_torch[@]}"
  fi
fi

VENV=${VENV:-.venv}
if [ -x "$VENV/bin/python" ] && ! grep -qi '^include-system-site-packages *= *true' "$VENV/pyvenv.cfg" 2>/dev/null; then
  echo "setup: recreating $VENV with --system-site-packages (it must see the system-wide torch)"
  rm -rf "$VENV"
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating the Python virtual environment $VENV"
  "$PY3" -m venv --system-site-packages "$VENV"
fi

# pip_stamp NAME PACKAGES...: install PACKAGES into the venv unless its stamp file already lists exactly them.
pip_stamp() {
  local stamp="$VENV/.deps-$1" reqs="${*:2}"
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$reqs" ]; then
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q $reqs
    echo "$reqs" > "$stamp"
  fi
}
# scikit-build-core: the build backend of pyproject.toml, installed here so `make python` can reinstall the
# package quickly with --no-build-isolation (CMake itself comes from apt above).
pip_stamp base numpy ml_dtypes scikit-build-core
if [ "$TEST" = 1 ]; then
  # safetensors: the reference implementation, used by tests/python/test_cli.py to cross-check the CLI's
  # reader/writer. matplotlib: `mxfp8 bench --plot`, `mxfp8 quantize --plot` and the training example's plot; tqdm:
  # the example's progress bar. transformers (5.x): mxfp8.torch.hf, its tests and examples/finetune_hf_moe.py;
  # transformers does not require torch, so pip leaves the system-wide torch the only one.
  pip_stamp test pytest safetensors matplotlib tqdm "transformers>=5,<6"
  "$VENV/bin/python" -c 'import torch' || { echo "setup: $VENV does not see torch" >&2; exit 1; }
fi
# mpi4py for mxfp8.mpi and its tests, compiled against the Open MPI above (--no-binary: a prebuilt wheel may carry
# another MPI, whose communicator handles libmxfp8_mpi could not use).
if [ "$TEST" = 1 ] && ! "$VENV/bin/python" -c "import mpi4py" >/dev/null 2>&1; then
  echo "setup: building mpi4py against $(command -v mpicc)"
  MPICC=mpicc "$VENV/bin/python" -m pip install -q --no-binary mpi4py mpi4py
fi
