SHELL := /bin/bash
# libqsakv: `make` builds, `make demo` runs the main example, `make test` runs every
# suite. Builds go to build/ (CPU + CUDA code for CUDA_ARCHS: by default the GPU present,
# so its first run needs no JIT compilation, or, on a machine without one, sm_75 alone,
# so that a clean build on 2 cores stays within minutes).
BUILD ?= build
GPU_ARCH := $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | grep -E '^[0-9]+\.[0-9]+$$' | head -1 | tr -d .)
CUDA_ARCHS ?= $(if $(GPU_ARCH),$(GPU_ARCH),75)
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
PYTHON ?= python3
PREFIX ?= /usr/local
# The Python test dependencies live in a project-local virtual environment that
# `make test` creates from $(PYTHON) (no system pip: works on Debian's externally managed
# Python); the Python-driven suites run with its interpreter. Building and `make demo`
# never need it.
VENV ?= .venv
VENV_PY = $(abspath $(VENV))/bin/python

.PHONY: all build build-deps demo test deps venv install gpu-test bench sanitize fuzz clean

all: build

# System packages: for the build alone (build-deps), or for the build, the tests and the
# maintainers' suites (deps: what `make test` needs); see tools/install-deps.sh.
build-deps:
	@PYTHON=$(PYTHON) bash tools/install-deps.sh --build

deps:
	@PYTHON=$(PYTHON) bash tools/install-deps.sh --system

venv: $(VENV)/.qsakv-deps-ok .deps-cuda12/.qsakv-cuda12-ok

$(VENV)/.qsakv-deps-ok: tools/install-deps.sh
	@PYTHON=$(PYTHON) QSAKV_VENV=$(abspath $(VENV)) bash tools/install-deps.sh --python

# CUDA 12.9 NVRTC for the sm70_build suite (CUDA 13 has no sm_70 target).
.deps-cuda12/.qsakv-cuda12-ok: tools/install-deps.sh | $(VENV)/.qsakv-deps-ok
	@PYTHON=$(PYTHON) QSAKV_VENV=$(abspath $(VENV)) bash tools/install-deps.sh --cuda12

$(BUILD)/CMakeCache.txt: | build-deps
	@echo "qsakv: CUDA code for sm_$(CUDA_ARCHS) ($(if $(GPU_ARCH),the GPU present,no GPU found: CI's short list); CUDA_ARCHS=... overrides)"
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DQSAKV_CUDA_ARCHS="$(CUDA_ARCHS)" $(CMAKE_FLAGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j$(JOBS)

# The C demo; DEMO_ARGS=--keep keeps (and prints) its working directory.
demo: build
	$(BUILD)/qsakv_demo $(DEMO_ARGS)

# The library (with its SONAME links), headers, the qsakv tool, qsakv.pc and the CMake
# package config (find_package(qsakv) -> qsakv::qsakv) under $(PREFIX).
install: build
	cmake --install $(BUILD) --prefix "$(PREFIX)"

# Every suite must run: configuring fails when tests/SUITES and the registered tests
# disagree, ctest fails on a failure, and check-suites fails when a suite that
# tests/SUITES requires did not run or did not pass.
# The Python-driven suites (pytest_*, test_overlay_cli, python_wheel) take CMake's
# Python3_EXECUTABLE: the venv's interpreter here. System packages first (python3-venv),
# then the venv, then the long build.
test: deps venv build
	cmake -S . -B $(BUILD) -DPython3_EXECUTABLE=$(VENV_PY) -DQSAKV_BUILD_TESTS=ON >/dev/null
	cmake --build $(BUILD) -j$(JOBS)
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS) 2>&1 | tee ctest.log; exit $${PIPESTATUS[0]}
	$(VENV_PY) tools/check_suites.py $(BUILD)/ctest.log tests/SUITES

# On a machine with a GPU: build for the GPU present and run the suites (CUDA parts
# included; the test framework is required), list the suites skipped for a missing
# toolchain, then run the GPU cases under compute-sanitizer.
# A GPU run: a CUDA case that finds no GPU fails instead of skipping (tests/testutil.h).
gpu-test: export QSAKV_REQUIRE_GPU := 1
gpu-test:
	cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DQSAKV_CUDA_ARCHS=native -DQSAKV_BUILD_TESTS=ON $(CMAKE_FLAGS)
	cmake --build build-gpu -j$(JOBS)
	cd build-gpu && ctest --output-on-failure -j$(JOBS) 2>&1 | tee ctest.log; exit $${PIPESTATUS[0]}
	$(PYTHON) tools/check_suites.py build-gpu/ctest.log tests/SUITES
	bash tools/sanitize-gpu.sh build-gpu

bench:
	cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DQSAKV_CUDA_ARCHS=native $(CMAKE_FLAGS)
	cmake --build build-gpu -j$(JOBS) --target qsakv_bench
	build-gpu/qsakv_bench --json bench.json
	@echo "bench: bench.json written; figures: $(PYTHON) tools/plot_bench.py bench.json --out figures (matplotlib: the test venv has it)"

# ASan + UBSan (Debug, CPU backend) of the library, the tool and every C suite. The
# Python-driven suites load the library into an uninstrumented interpreter: they are
# neither built for (no SWIG module) nor run here (they run in `make test`). Any
# sanitizer report aborts its test (UBSan does not recover), so it fails; check-suites
# then checks that every C suite of tests/SUITES ran, and the adversarial suite's counts
# are printed.
# The demo (the whole pipeline on the CPU backend) runs too, with leak checks off: it
# keeps its own host buffers to the end (the library's objects are all released).
# SAN_BUILD names the build tree (e.g. an existing Debug ASan tree, to reuse it).
SAN_BUILD ?= build-asan
# What runs here comes from tests/SUITES's sanitize column (it says why each suite is
# where it is): `asan` suites are built as targets; `excluded` ones (Python-driven) are
# registered but not run; `absent` ones are not registered; check-suites then requires
# the `asan` and `script` ones.
SAN_LIST = $(shell $(PYTHON) tools/check_suites.py list tests/SUITES $(1))
SAN_SUITES = $(call SAN_LIST,sanitize=asan needs=-)
SAN_EXCLUDED = $(subst $(eval) ,|,$(call SAN_LIST,sanitize=excluded))
sanitize:
	cmake -S . -B $(SAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DQSAKV_WITH_CUDA=OFF -DQSAKV_SANITIZE=ON $(CMAKE_FLAGS)
	cmake --build $(SAN_BUILD) -j$(JOBS) --target qsakv qsakv_tool qsakv_demo $(SAN_SUITES)
	cd $(SAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -j$(JOBS) -E '^($(SAN_EXCLUDED))$$' 2>&1 | tee ctest.log; exit $${PIPESTATUS[0]}
	$(PYTHON) tools/check_suites.py --sanitize $(SAN_BUILD)/ctest.log tests/SUITES
	@grep -h 'adversarial \] cases tried' $(SAN_BUILD)/Testing/Temporary/LastTest.log
	ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 $(SAN_BUILD)/qsakv_demo \
	  > $(SAN_BUILD)/demo.log
	@echo "demo under ASan + UBSan: $$(tail -1 $(SAN_BUILD)/demo.log)"

# The file parsers (safetensors, manifest, index, statistics) under libFuzzer (clang),
# bounded in time; the seed corpus is copied so libFuzzer's new inputs never land in the
# repository.
fuzz:
	cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DQSAKV_WITH_CUDA=OFF -DQSAKV_FUZZ=ON
	cmake --build build-fuzz --target fuzz_safetensors -j$(JOBS)
	rm -rf build-fuzz/corpus && mkdir -p build-fuzz/corpus && cp tests/fuzz/corpus/* build-fuzz/corpus/
	build-fuzz/tests/fuzz/fuzz_safetensors -max_total_time=$${FUZZ_SECONDS:-60} -rss_limit_mb=2048 build-fuzz/corpus

clean:
	rm -rf $(BUILD) build-gpu $(SAN_BUILD) build-fuzz
