// CudaDevice (csrc/device/cuda/cuda_device.h) against the device seam's contract,
// torch-free: copies, events, stream-on-stream waits and host flags, with
// both ways a stream waits for the host. Needs a GPU; without one each test
// prints SMDDP_TEST_SKIPPED (ctest counts it as skipped), except the one
// that checks the error a missing device gives.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

#include "common/error.h"
#include "device/cuda/cuda_device.h"

using namespace smddp;
using namespace std::chrono_literals;

namespace {

int deviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

bool skipWithoutGpu() {
  if (deviceCount() > 0) return false;
  std::printf("SMDDP_TEST_SKIPPED: no CUDA device here\n");
  return true;
}

// Polls until the event completes or `limit` passes.
bool completesWithin(DeviceEvent& e, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (!e.query()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(100us);
  }
  return true;
}

struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) { REQUIRE(cudaMalloc(&p, bytes) == cudaSuccess); }
  ~DeviceBuffer() { cudaFree(p); }
};

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 31 + seed);
  return v;
}

}  // namespace

TEST_CASE("a missing CUDA device is an Error naming it", "[cuda]") {
  int n = deviceCount();
  try {
    CudaDevice device(n);  // one past the last (or 0 where there is none)
    FAIL("constructed a device that does not exist");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("cuda:" + std::to_string(n)) != std::string::npos);
  }
}

TEST_CASE("copies round-trip through page-locked memory", "[cuda]") {
  if (skipWithoutGpu()) return;
  CudaDevice device(0);
  CHECK(device.name() == "cuda:0");
  auto stream = device.newStream();
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{4097}, size_t{9} << 20}) {
    auto in = device.allocHost(bytes);
    auto out = device.allocHost(bytes);
    auto src = pattern(bytes, 7);
    std::memcpy(in.get(), src.data(), bytes);
    std::memset(out.get(), 0, bytes);
    DeviceBuffer dev(bytes + 1);
    stream->copy(dev.p, in.get(), bytes);
    stream->copy(out.get(), dev.p, bytes);
    auto done = stream->record();
    REQUIRE(completesWithin(*done, 10s));
    CHECK(std::memcmp(out.get(), src.data(), bytes) == 0);
  }
}

TEST_CASE("streams wait for host flags and for each other", "[cuda]") {
  if (skipWithoutGpu()) return;
  auto method = GENERATE(HostWaitMethod::kAuto, HostWaitMethod::kSpinKernel);
  CudaDevice device(0, method);
  INFO("waits with stream memory operations: " << device.waitsWithStreamMemOps());
  if (method == HostWaitMethod::kSpinKernel) CHECK_FALSE(device.waitsWithStreamMemOps());

  const size_t bytes = 1 << 20;
  auto src = pattern(bytes, 3);
  auto in = device.allocHost(bytes);
  auto out = device.allocHost(bytes);
  std::memcpy(in.get(), src.data(), bytes);
  std::memset(out.get(), 0, bytes);
  DeviceBuffer dev(bytes);
  auto flag = device.newHostFlag();
  auto first = device.newStream();
  auto second = device.newStream();

  // first: wait for flag >= 2, then copy in; second: wait for first, copy out.
  first->waitHost(*flag, 2);
  first->copy(dev.p, in.get(), bytes);
  auto landed = first->record();
  second->wait(landed);
  second->copy(out.get(), dev.p, bytes);
  auto done = second->record();

  std::this_thread::sleep_for(50ms);
  CHECK_FALSE(landed->query());
  flag->raise(1);  // not yet
  std::this_thread::sleep_for(50ms);
  CHECK_FALSE(done->query());
  CHECK(flag->value() == 1);
  flag->raise(2);
  REQUIRE(completesWithin(*done, 10s));
  CHECK(landed->query());
  CHECK(std::memcmp(out.get(), src.data(), bytes) == 0);
}

TEST_CASE("a flag raised to its maximum releases every waiter; raising is monotonic", "[cuda]") {
  if (skipWithoutGpu()) return;
  auto method = GENERATE(HostWaitMethod::kAuto, HostWaitMethod::kSpinKernel);
  CudaDevice device(0, method);
  auto flag = device.newHostFlag();
  auto stream = device.newStream();
  stream->waitHost(*flag, 5);
  stream->waitHost(*flag, uint64_t{1} << 40);
  auto done = stream->record();
  flag->raise(7);
  flag->raise(3);
  CHECK(flag->value() == 7);
  std::this_thread::sleep_for(50ms);
  CHECK_FALSE(done->query());
  // The cyclic comparison of cuStreamWaitValue64 would read UINT64_MAX as -1.
  flag->raise(std::numeric_limits<uint64_t>::max());
  CHECK(flag->value() == std::numeric_limits<uint64_t>::max());
  REQUIRE(completesWithin(*done, 10s));
}

TEST_CASE("the device lists the native streams it made while they live", "[cuda]") {
  if (skipWithoutGpu()) return;
  CudaDevice device(0);
  CHECK(device.streams().empty());
  auto a = device.newStream();
  {
    auto b = device.newStream();
    CHECK(device.streams().size() == 2);
  }
  CHECK(device.streams().size() == 1);
  // An event on a stream the device did not make (the caller's).
  cudaStream_t foreign = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&foreign, cudaStreamNonBlocking) == cudaSuccess);
  auto e = device.recordOn(foreign);
  CHECK(completesWithin(*e, 10s));
  a->wait(e);
  CHECK(completesWithin(*a->record(), 10s));
  cudaStreamDestroy(foreign);
}
