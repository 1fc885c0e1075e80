# Thin wrapper over CMake + the Python package. Every target does its own set-up (scripts/setup.sh).
BUILD ?= build
VENV ?= .venv
JOBS ?= $(shell nproc)
PY := $(VENV)/bin/python
CTEST := ctest --test-dir $(BUILD) --output-on-failure
# The Python tests find the CLI and the struct_layout program in the build directory built here (MXFP8_BUILD_DIR).
PYTEST := MXFP8_BUILD_DIR=$(abspath $(BUILD)) $(PY) -m pytest tests/python -q -p no:cacheprovider

.PHONY: all setup setup-test build python test test-c test-python test-packaging test-sanitize test-fuzz fuzz mutants run bench \
	clean

all: build

# setup: what build/run/python need (apt packages, .venv with numpy, ml_dtypes, scikit-build-core); setup-test adds
# what the Python tests need (pytest, safetensors, matplotlib, tqdm; torch system-wide, seen through the venv).
setup:
	@scripts/setup.sh

setup-test:
	@scripts/setup.sh --test

# The compiler's output goes to $(BUILD)/build.log (its end is shown when the build fails).
build: setup
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@echo "build: the library, the mxfp8 command and the tests in $(BUILD)/ (log: $(BUILD)/build.log)"
	@cmake --build $(BUILD) -j $(JOBS) >$(BUILD)/build.log 2>&1 \
		|| { tail -n 40 $(BUILD)/build.log; echo "build: failed (the whole log: $(BUILD)/build.log)"; exit 1; }

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

test-python: setup-test python
	$(PYTEST)
	MXFP8_ISA=scalar $(PYTEST)

# What the bench reports; the installed C package (cmake --install: pkg-config and CMake consumers), the wheel in a
# fresh venv, README blocks.
test-packaging: setup-test python
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
test: setup-test python
	@BUILD=$(BUILD) VENV=$(VENV) JOBS=$(JOBS) FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/test.sh

# The mutation check (not part of `make test`: it rebuilds once per mutant; about a minute or two each). MUTANTS_ARGS
# passes options / mutant ids to scripts/mutants.py (e.g. MUTANTS_ARGS="--fast moe-clamp-mask-lower").
mutants: setup-test
	JOBS=$(JOBS) VENV=$(VENV) scripts/mutants.sh $(MUTANTS_ARGS)

# The main job; also leaves the Python package installed in $(VENV).
run: python
	$(BUILD)/mxfp8 moe-bwd

bench: build
	$(BUILD)/mxfp8 bench

clean:
	rm -rf $(BUILD)
