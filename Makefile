# The two commands: `make demo` and `make test`. Each sets up what it needs
# (Debian packages, .venv with pinned torch, the CMake build) first.
VENV      := .venv
PY        := $(VENV)/bin/python
BUILD     := build
JOBS      ?= 2
NPROC     ?= 2
CMAKE_ARGS ?=
LAUNCHER  := $(shell command -v ccache >/dev/null 2>&1 && echo -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)

.PHONY: all setup build demo test test-cpp test-py test-asan test-asan-ci test-tsan fuzz bench info clean

all: build

setup:
	@scripts/bootstrap.sh

$(BUILD)/CMakeCache.txt: CMakeLists.txt | setup
	cmake -S . -B $(BUILD) -DPython3_EXECUTABLE=$(abspath $(PY)) $(LAUNCHER) $(CMAKE_ARGS)

build: setup $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)
	@# Make the in-tree package importable from the venv (a develop install).
	@$(PY) -c "import os, site; open(os.path.join(site.getsitepackages()[0], 'torch_smddp_dev.pth'), 'w').write(os.getcwd() + '\\n')"

demo: build
	$(PY) -m torch.distributed.run --standalone --nproc-per-node $(NPROC) examples/train_ddp.py --backend smddp

test: build
	cd $(BUILD) && ctest --output-on-failure -j 2 --timeout 300
	$(PY) -m pytest -q tests/python
	$(MAKE) --no-print-directory test-asan-ci
	$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=$(FUZZ_SECONDS_CI)

test-cpp: build
	cd $(BUILD) && ctest --output-on-failure -j 2 --timeout 300

test-py: build
	$(PY) -m pytest -q tests/python

# Core + Catch2 tests under sanitizers (no torch extension).
test-asan: setup
	cmake -S . -B build-asan -DSMDDP_BUILD_EXTENSION=OFF -DSMDDP_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=Debug $(LAUNCHER)
	cmake --build build-asan -j $(JOBS)
	cd build-asan && UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure --timeout 600

# What `make test` runs under ASan/UBSan: the same build as test-asan, with
# the Catch2 tests that are slow under ASan (ASAN_SLOW_TESTS) left out.
ASAN_SLOW_TESTS ?=
test-asan-ci: setup
	cmake -S . -B build-asan -DSMDDP_BUILD_EXTENSION=OFF -DSMDDP_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=Debug $(LAUNCHER)
	cmake --build build-asan -j $(JOBS)
	cd build-asan && UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j 2 --timeout 600 $(if $(ASAN_SLOW_TESTS),-E '$(ASAN_SLOW_TESTS)')

# libFuzzer on the frame validators (tests/fuzz). The corpus it grows is
# kept in build-fuzz/corpus, so repeated runs start where the last ended.
FUZZ_SECONDS ?= 20
FUZZ_SECONDS_CI ?= 20
fuzz: setup
	cmake -S . -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DSMDDP_BUILD_FUZZERS=ON -DSMDDP_BUILD_TESTS=OFF -DSMDDP_BUILD_EXTENSION=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo $(LAUNCHER)
	cmake --build build-fuzz --target fuzz_frame -j $(JOBS)
	mkdir -p build-fuzz/corpus
	build-fuzz/fuzz_frame -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 build-fuzz/corpus

test-tsan: setup
	cmake -S . -B build-tsan -DSMDDP_BUILD_EXTENSION=OFF -DSMDDP_SANITIZE=thread -DCMAKE_BUILD_TYPE=Debug $(LAUNCHER)
	cmake --build build-tsan -j $(JOBS)
	cd build-tsan && ctest --output-on-failure --timeout 600

bench: build
	$(PY) -m torch_smddp.bench

info: build
	$(PY) -m torch_smddp.info

clean:
	rm -rf $(BUILD) build-asan build-tsan build-fuzz torch_smddp/_C*.so
