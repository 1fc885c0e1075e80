#!/usr/bin/env bash
# scripts/mutants.sh -- the mutation check: applies each known bug of scripts/mutants.list to a scratch copy of the
# tree, one at a time, rebuilds, runs the suite's fast subset (ctest on the default ISA path and under
# MXFP8_ISA=scalar, and the pytest files that check kernel results) and prints which tests killed each mutant, or
# SURVIVED. Exits non-zero when a mutant survives. Not part of `make test` (it rebuilds once per mutant); run it
# before closing any change to a kernel. Options and environment: scripts/mutants.py --help.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 scripts/mutants.py "$@"
