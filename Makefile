# The two commands: `make demo` and `make test`. Each sets up what it needs
# (Debian packages, .venv with pinned torch, the CMake build) first.
VENV      := .venv
PY        := $(VENV)/bin/python
BUILD     := build
JOBS      ?= 2
NPROC     ?= 2
CMAKE_ARGS ?=
LAUNCHER  := $(shell command -v ccache >/dev/null 2>&1 && echo -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)

.PHONY: all setup build build-ext layers demo test test-cpp test-py build-asan test-asan test-asan-ci test-tsan build-fuzz fuzz bench info clean \
        setup-cuda build-cuda-ext check-cuda check-cuda-run build-install check-install check-install-run test-gpu gpu-debs

all: build

setup:
	@scripts/bootstrap.sh

$(BUILD)/CMakeCache.txt: CMakeLists.txt | setup
	cmake -S . -B $(BUILD) -DPython3_EXECUTABLE=$(abspath $(PY)) $(LAUNCHER) $(CMAKE_ARGS)

DEV_PTH := @$(PY) -c "import os, site; open(os.path.join(site.getsitepackages()[0], 'torch_smddp_dev.pth'), 'w').write(os.getcwd() + '\\n')"

build: setup $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)
	@# Make the in-tree package importable from the venv (a develop install).
	$(DEV_PTH)

# What the demo needs and nothing more: the extension, not the tests.
build-ext: setup $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) --target _C -j $(JOBS)
	$(DEV_PTH)

demo: build-ext
	$(PY) -m torch.distributed.run --standalone --nproc-per-node $(NPROC) examples/train_ddp.py --backend smddp

# ctest and pytest, then the sanitizer, fuzz, CUDA and install stages, whose
# builds run in the background at idle priority while pytest runs
# (scripts/make_test.sh says why). Each stage says when it starts, so a CI
# log shows where the time goes.
test: build layers
	@MAKE="$(MAKE)" PY="$(PY)" FUZZ_SECONDS_CI="$(FUZZ_SECONDS_CI)" scripts/make_test.sh

test-cpp: build layers
	cd $(BUILD) && ctest --output-on-failure -j 2 --timeout 300

# Every include in csrc/ points down the layer table, and docs/design.md's
# table agrees with scripts/check_layers.py's (the build runs the first
# half before it compiles).
layers:
	python3 scripts/check_layers.py --design docs/design.md

test-py: build
	$(PY) -m pytest -q --durations=15 tests/python tests/tools

# Core + Catch2 tests under sanitizers (no torch extension).
build-asan: setup
	cmake -S . -B build-asan -DSMDDP_BUILD_EXTENSION=OFF -DSMDDP_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=Debug $(LAUNCHER)
	cmake --build build-asan -j $(JOBS)

test-asan: build-asan
	cd build-asan && UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure --timeout 600

# What `make test` runs under ASan/UBSan: the same build as test-asan, with
# the Catch2 tests that are slow under ASan (ASAN_SLOW_TESTS) left out.
ASAN_SLOW_TESTS ?=
test-asan-ci: build-asan
	cd build-asan && UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j 2 --timeout 600 $(if $(ASAN_SLOW_TESTS),-E '$(ASAN_SLOW_TESTS)')

# libFuzzer on the wire validators (tests/fuzz): the peers' frames
# (fuzz_frame) and the reduction servers' (fuzz_server_frame), each for
# FUZZ_SECONDS. The corpora they grow are kept in build-fuzz/corpus*, so
# repeated runs start where the last ended.
FUZZ_SECONDS ?= 20
FUZZ_SECONDS_CI ?= 20
build-fuzz: setup
	cmake -S . -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DSMDDP_BUILD_FUZZERS=ON -DSMDDP_BUILD_TESTS=OFF -DSMDDP_BUILD_EXTENSION=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo $(LAUNCHER)
	cmake --build build-fuzz --target fuzz_frame fuzz_server_frame -j $(JOBS)

fuzz: build-fuzz
	mkdir -p build-fuzz/corpus build-fuzz/corpus-server
	build-fuzz/fuzz_frame -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 build-fuzz/corpus
	build-fuzz/fuzz_server_frame -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 build-fuzz/corpus-server

test-tsan: setup
	cmake -S . -B build-tsan -DSMDDP_BUILD_EXTENSION=OFF -DSMDDP_SANITIZE=thread -DCMAKE_BUILD_TYPE=Debug $(LAUNCHER)
	cmake --build build-tsan -j $(JOBS)
	cd build-tsan && ctest --output-on-failure --timeout 600

# ---- the CUDA build (SMDDP_WITH_CUDA=ON) --------------------------------
# Built the way users build it (docs/install.md): `pip install .` into a venv
# holding the CUDA build of torch, which turns the CUDA path on by itself
# (SMDDP_WITH_CUDA=auto: torch has CUDA, nvcc is found) and never touches
# that torch (tests/install/check_installed.py proves it, byte for byte).
# Its own venv, so it never touches the CPU build's .venv or
# torch_smddp/_C*.so. SMDDP_BUILD_DIR keeps pip's CMake build in build-cuda,
# where the CUDA device's Catch2 tests are then built from the same cache.
# No GPU is needed to build it or to run it on CPU tensors (CUDA-BUILD.md in
# the shared notes).
CUDA_VENV      := .venv-cuda
# On a machine that has its own CUDA torch and no network (the lent GPU
# machines), use it instead of the venv (scripts/gpu_check.sh does):
#   make test-gpu CUDA_PY=$(command -v python3) CUDA_SETUP= CMAKE_ARGS=-DCMAKE_PREFIX_PATH=<libfabric, catch2>
CUDA_PY        ?= $(CUDA_VENV)/bin/python
CUDA_SETUP     ?= setup-cuda
CUDA_BUILD     := build-cuda
CUDA_TORCH_PIN := torch==2.14.1
CUDA_LAUNCHER  := $(shell command -v ccache >/dev/null 2>&1 && echo -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
# pip's own flags for the CUDA install (gpu_check.sh adds --no-build-isolation
# where there is no index to fetch setuptools from).
CUDA_PIP_ARGS  ?=
# Run from build-cuda: `python -m` puts the working directory first on
# sys.path, and the checkout's torch_smddp holds the CPU build's _C; the
# installed package is in the venv's site-packages.
CUDA_RUN       := cd $(CUDA_BUILD) && $(abspath $(CUDA_PY))
# What check-cuda runs of tests/python against the CUDA build (about 2
# minutes here): every collective against Gloo, also through the device path
# on the simulated device (test_device_sim.py's calls, bad inputs and DDP:
# its rules and failure cases run on the CPU build, on the same C++), the
# backend's surface, directly made groups, the parameters, DDP and FSDP2
# against Gloo. Left out: the install, cluster and benchmark tests, the
# harness's self-tests and the torchrun demo (nothing of the extension's
# build in them), and the long engine, failure, robustness and torch-suite
# runs, which the CPU build runs on the same C++.
CUDA_SIM_TESTS    := test_collectives_vs_gloo_through_the_device_path test_more_collectives_through_the_device_path \
                     test_bad_inputs_are_rejected_on_the_callers_thread test_ddp_through_the_device_path_matches_gloo \
                     test_tensors_on_devices_it_cannot_serve_fail_at_once_naming_the_call
CUDA_PYTESTS      ?= $(addprefix test_device_sim.py::,$(CUDA_SIM_TESTS)) test_collectives.py test_more_collectives.py \
                     test_sim_torch_device.py test_surface.py test_direct_group.py test_params.py test_ddp.py test_fsdp.py
CUDA_PYTEST_ARGS  ?= -k "not harness and not demo"

setup-cuda:
	@SMDDP_VENV=$(CUDA_VENV) SMDDP_TORCH_PIN=$(CUDA_TORCH_PIN) SMDDP_PY_PACKAGES="pytest numpy expecttest nvidia-cuda-cuobjdump==13.5.37" \
	  scripts/bootstrap.sh

# `pip install .` (what users run; -v shows its build summary), with the
# torch it must not touch recorded before and checked after (check-cuda),
# then the CUDA device's Catch2 tests from the same CMake build (the core's
# own tests are torch-free and CUDA-free, the same as the CPU build's, so
# not built again; ctest -L cuda runs the CUDA ones only, and without a GPU
# they report themselves skipped, never passed).
build-cuda-ext: $(CUDA_SETUP)
	mkdir -p $(CUDA_BUILD)
	$(CUDA_PY) tests/install/check_installed.py --record $(CUDA_BUILD)/torch-before.json
	SMDDP_BUILD_DIR=$(abspath $(CUDA_BUILD)) SMDDP_CMAKE_ARGS="-DSMDDP_BUILD_TESTS=ON $(CUDA_LAUNCHER) $(CMAKE_ARGS)" \
	  $(CUDA_PY) -m pip install -v $(CUDA_PIP_ARGS) . >$(CUDA_BUILD)/pip-install.log 2>&1 || \
	  { tail -80 $(CUDA_BUILD)/pip-install.log; echo "pip install . failed: $(CUDA_BUILD)/pip-install.log"; exit 1; }
	grep -E "torch-smddp build:|Successfully installed" $(CUDA_BUILD)/pip-install.log
	cmake --build $(CUDA_BUILD) --target smddp_cuda_tests -j $(JOBS)

# The CUDA build installs like a user's, compiles, imports without a GPU and
# serves CPU tensors; a checkout built against the CPU torch (make build)
# fails to import under this torch with the one error naming both.
# (The CUDA device's tests report themselves skipped where there is no GPU.)
check-cuda: build-cuda-ext
	@$(MAKE) --no-print-directory check-cuda-run

# check-cuda's checks of a finished build-cuda-ext (make test builds it in
# the background).
check-cuda-run:
	cd $(CUDA_BUILD) && ctest -L cuda --output-on-failure --timeout 300
	$(CUDA_RUN) $(CURDIR)/tests/install/check_installed.py --torch-before torch-before.json --expect cuda \
	  $(if $(wildcard torch_smddp/_build_info.py),--mismatch-checkout $(CURDIR))
	$(CUDA_RUN) -m pytest -q -p no:cacheprovider --rootdir=$(CURDIR) $(CUDA_PYTEST_ARGS) \
	  $(addprefix $(CURDIR)/tests/python/,$(CUDA_PYTESTS))

# The install a user makes, into a fresh venv with the CPU torch, from the
# EFA installer's layout of libfabric (tests/install/fresh_venv_install.py):
# a full compile (build-install, which make test runs in the background),
# then its checks.
INSTALL_DIR := build-install
build-install: setup
	$(PY) tests/install/fresh_venv_install.py build $(INSTALL_DIR)

check-install: build-install
	@$(MAKE) --no-print-directory check-install-run

check-install-run:
	$(PY) tests/install/fresh_venv_install.py check $(INSTALL_DIR)

# The GPU path's own tests (tests/gpu); they skip where there is no GPU.
test-gpu: build-cuda-ext
	cd $(CUDA_BUILD) && ctest -L cuda --output-on-failure --timeout 300
	$(CUDA_RUN) -m pytest -q -rsP -p no:cacheprovider --rootdir=$(CURDIR) $(CURDIR)/tests/gpu

# The Debian packages a GPU machine without apt or network needs for
# scripts/gpu_check.sh (libfabric and its libraries, Catch2, OpenSSL's libcrypto), as .deb files
# in .gpu-debs/ to carry there.
GPU_DEBS := libfabric1 libfabric-dev catch2 libibverbs1 ibverbs-providers librdmacm1 libpsm2-2 \
            libpsm-infinipath1 libnl-3-200 libnl-route-3-200 libssl-dev libssl3
gpu-debs:
	mkdir -p .gpu-debs && cd .gpu-debs && apt-get download $(GPU_DEBS)

bench: build
	$(PY) -m torch_smddp.bench

info: build
	$(PY) -m torch_smddp.info

clean:
	rm -rf $(BUILD) build-asan build-tsan build-fuzz $(CUDA_BUILD) $(INSTALL_DIR) build-bg torch_smddp/_C*.so
