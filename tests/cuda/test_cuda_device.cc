// CudaDevice (csrc/device/cuda/cuda_device.h) against the device seam's
// contract, torch-free: copies through page-locked memory, events, waits of
// one stream on another, pool streams that outlive everything, the rule
// that a thread must be bound to the device, capture, and the reaper. The
// simulated device is held to the same contract (tests/cpp/test_sim_device.cc).
// Needs a GPU; without one each test prints SMDDP_TEST_SKIPPED (ctest
// counts it as skipped), except the one that checks the error a missing
// device gives.
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
#include "device/cuda/nccl_intra.h"
#include "device/reaper.h"

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

TEST_CASE("NCCL is linked and answers its version", "[cuda]") {
  // No GPU needed: the intra-host path's library loads and is the wheel's.
  const std::string v = ncclVersionString();
  INFO("NCCL " << v);
  CHECK(v.size() >= 5);
  CHECK(v.find('.') != std::string::npos);
}

TEST_CASE("copies round-trip through page-locked memory on pool streams", "[cuda]") {
  if (skipWithoutGpu()) return;
  auto device = CudaDevice::at(0);
  device->bindThread();
  CHECK(device->name() == "cuda:0");
  DeviceStream& stream = device->poolStream(0);
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{4097}, size_t{9} << 20}) {
    auto in = device->allocHost(bytes);
    auto out = device->allocHost(bytes);
    auto src = pattern(bytes, 7);
    std::memcpy(in.get(), src.data(), bytes);
    std::memset(out.get(), 0, bytes);
    DeviceBuffer dev(bytes + 1);
    stream.copy(dev.p, in.get(), bytes);
    stream.copy(out.get(), dev.p, bytes);
    auto done = stream.record();
    REQUIRE(completesWithin(*done, 10s));
    CHECK(std::memcmp(out.get(), src.data(), bytes) == 0);
  }
}

TEST_CASE("a stream waits for another's event", "[cuda]") {
  if (skipWithoutGpu()) return;
  auto device = CudaDevice::at(0);
  device->bindThread();
  constexpr size_t kBytes = 64 << 20;  // long enough that the order shows
  auto in = device->allocHost(kBytes), out = device->allocHost(kBytes);
  auto src = pattern(kBytes, 3);
  std::memcpy(in.get(), src.data(), kBytes);
  std::memset(out.get(), 0, kBytes);
  DeviceBuffer dev(kBytes);
  DeviceStream& a = device->poolStream(2);
  DeviceStream& b = device->poolStream(3);
  a.copy(dev.p, in.get(), kBytes);
  b.wait(a.record());
  b.copy(out.get(), dev.p, kBytes);
  REQUIRE(completesWithin(*b.record(), 10s));
  CHECK(std::memcmp(out.get(), src.data(), kBytes) == 0);
}

TEST_CASE("pool streams are the same streams for the life of the process", "[cuda]") {
  if (skipWithoutGpu()) return;
  auto device = CudaDevice::at(0);
  device->bindThread();
  cudaStream_t first = CudaDevice::native(device->poolStream(1));
  CHECK(CudaDevice::at(0).get() == device.get());
  CHECK(CudaDevice::native(CudaDevice::at(0)->poolStream(1)) == first);
  CHECK(cudaStreamQuery(first) != cudaErrorInvalidResourceHandle);
}

TEST_CASE("a thread bound to another device is refused, never silently switched", "[cuda]") {
  if (deviceCount() < 2) {
    std::printf("SMDDP_TEST_SKIPPED: needs 2 CUDA devices\n");
    return;
  }
  auto device = CudaDevice::at(1);
  std::thread([&] {
    REQUIRE(cudaSetDevice(0) == cudaSuccess);
    CHECK_THROWS_WITH(device->poolStream(0).record(), Catch::Contains("not bound"));
    int current = -1;
    REQUIRE(cudaGetDevice(&current) == cudaSuccess);
    CHECK(current == 0);
    device->bindThread();
    CHECK(completesWithin(*device->poolStream(0).record(), 10s));
  }).join();
}

TEST_CASE("capture is seen, and a bound thread may query while another captures", "[cuda]") {
  if (skipWithoutGpu()) return;
  auto device = CudaDevice::at(0);
  device->bindThread();
  DeviceEventPtr before = device->poolStream(0).record();
  REQUIRE(completesWithin(*before, 10s));
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  CHECK_FALSE(device->capturing(s));
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  CHECK(device->capturing(s));
  bool queried = false;
  std::thread([&] {
    device->bindThread();  // relaxed, as the pipeline's threads are
    queried = before->query();
  }).join();
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamEndCapture(s, &graph) == cudaSuccess);  // the query did not break it
  if (graph) (void)cudaGraphDestroy(graph);
  (void)cudaStreamDestroy(s);
  CHECK(queried);
}

TEST_CASE("the reaper frees memory only after its event", "[cuda]") {
  if (skipWithoutGpu()) return;
  auto device = CudaDevice::at(0);
  device->bindThread();
  std::shared_ptr<Device> d = device;
  auto payload = std::make_shared<int>(1);
  std::weak_ptr<int> watch = payload;
  constexpr size_t kBytes = 256 << 20;
  DeviceBuffer a(kBytes), b(kBytes);
  DeviceStream& s = device->poolStream(2);
  for (int i = 0; i < 8; ++i) s.copy(b.p, a.p, kBytes);  // tens of ms of work
  DeviceEventPtr after = s.record();
  DeviceReaper::of(d).release(after, std::move(payload));
  const bool early = !watch.expired() && !after->query();
  REQUIRE(completesWithin(*after, 20s));
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!watch.expired() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  CHECK(early);
  CHECK(watch.expired());
}
