# Thin wrapper over CMake + the Python package. Every target does its own set-up (scripts/setup.sh).
BUILD ?= build
VENV ?= .venv
JOBS ?= $(shell nproc)
PY := $(VENV)/bin/python
CTEST := ctest --test-dir $(BUILD) --output-on-failure
PYTEST := $(PY) -m pytest tests/python -q -p no:cacheprovider

.PHONY: all setup build python test test-c test-python test-packaging test-sanitize test-fuzz fuzz run bench clean

all: build

setup:
	@scripts/setup.sh

build: setup
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# Installs the Python package (with its own copy of the shared library and the CLI) into the virtual environment.
# pyproject.toml (scikit-build-core) compiles them in $(BUILD)/python (incremental); a failed install stops here
# rather than leaving an older mxfp8 in place.
python: build
	@$(PY) -m pip install -q --no-build-isolation -C build-dir=$(BUILD)/python . \
		|| { echo "python: pip install . failed"; exit 1; }
	@cd /tmp && $(abspath $(PY)) -c "import mxfp8; i = mxfp8.info(); print('python: mxfp8', mxfp8.__version__, 'isa', i['isa'], 'from', i['library'])" \
		|| { echo "python: mxfp8 did not import"; exit 1; }

test-c: build
	$(CTEST)
	MXFP8_ISA=scalar $(CTEST)

test-python: python
	@scripts/setup.sh --test
	$(PYTEST)
	MXFP8_ISA=scalar $(PYTEST)

# What the bench reports; the installed C package (cmake --install: pkg-config and CMake consumers), the wheel in a
# fresh venv, README blocks.
test-packaging: python
	@scripts/setup.sh --test
	$(PY) -m pytest tests/bench tests/packaging -q -p no:cacheprovider

# Reliability: ASan+UBSan build of the C tests (build-asan), TSan on tests/c/test_threads.c (build-tsan,
# clang + libomp), valgrind on `mxfp8 moe-bwd`; then every libFuzzer target for FUZZ_SECONDS (build-fuzz).
FUZZ_SECONDS ?= 60
test-sanitize: build
	BUILD=$(BUILD) JOBS=$(JOBS) scripts/sanitize.sh

fuzz: setup
	FUZZ_SECONDS=$(FUZZ_SECONDS) JOBS=$(JOBS) scripts/fuzz.sh

test-fuzz: fuzz

# Every suite (C, Python, packaging and README, sanitizers, fuzzers), each run even when one fails, then one line
# "N passed, N failed" (scripts/test.sh).
test: python
	@scripts/setup.sh --test
	@BUILD=$(BUILD) VENV=$(VENV) JOBS=$(JOBS) FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/test.sh

# The main job; also leaves the Python package installed in $(VENV).
run: python
	$(BUILD)/mxfp8 moe-bwd

bench: build
	$(BUILD)/mxfp8 bench

clean:
	rm -rf $(BUILD)
