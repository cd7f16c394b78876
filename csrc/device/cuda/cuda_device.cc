#include "device/cuda/cuda_device.h"

// Driver types and the entry points' signatures only: the driver itself is
// reached through cudaGetDriverEntryPointByVersion, never linked.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <atomic>
#include <limits>

#include "common/error.h"
#include "common/logging.h"
#include "device/cuda/host_wait_kernel.h"

namespace smddp {

namespace {

[[noreturn]] void throwCuda(const std::string& device, const char* call, cudaError_t err) {
  throwError(ErrorKind::kInternal, device + ": " + call + " failed: " + cudaGetErrorString(err) +
                                       " (" + cudaGetErrorName(err) + ")");
}

void check(cudaError_t err, const std::string& device, const char* call) {
  if (err != cudaSuccess) throwCuda(device, call, err);
}

// Makes `index` the calling thread's current device for the scope, and
// restores the previous one after: calls come from the pipeline's thread
// and from callers' threads, which may be working with another device.
// Destructors do without it: the destroy and free calls they make do not
// depend on the current device.
class DeviceGuard {
 public:
  DeviceGuard(int index, const std::string& name) : index_(index) {
    check(cudaGetDevice(&previous_), name, "cudaGetDevice");
    if (previous_ != index_) check(cudaSetDevice(index_), name, "cudaSetDevice");
  }
  ~DeviceGuard() {
    if (previous_ != index_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int index_;
  int previous_ = 0;
};

// The flag's mapped word never goes above this. cuStreamWaitValue64's GEQ
// is a cyclic comparison, (int64_t)(word - value) >= 0, which is an
// ordinary >= only while both sides stay within 2^63 of each other; a flag
// raised to UINT64_MAX (to drain every waiter) would otherwise release no
// one. Tickets never come near 2^62.
constexpr uint64_t kDeviceWordMax = uint64_t{1} << 62;

using StreamWaitValue64 = PFN_cuStreamWaitValue64_v11070;
using DeviceGetAttribute = PFN_cuDeviceGetAttribute_v2000;

void* driverEntryPoint(const char* symbol, unsigned int version) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
  cudaError_t err = cudaGetDriverEntryPointByVersion(symbol, &fn, version, cudaEnableDefault, &found);
#else
  (void)version;
  cudaError_t err = cudaGetDriverEntryPoint(symbol, &fn, cudaEnableDefault, &found);
#endif
  if (err != cudaSuccess || found != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();  // a missing symbol is an answer, not a failure to report later
    return nullptr;
  }
  return fn;
}

// cuStreamWaitValue64 when the driver has it and the device supports
// 64-bit stream memory operations; otherwise null, with the reason.
StreamWaitValue64 findStreamWaitValue64(int index, std::string* whyNot) {
  auto wait = reinterpret_cast<StreamWaitValue64>(driverEntryPoint("cuStreamWaitValue64", 11070));
  if (!wait) {
    *whyNot = "the driver has no cuStreamWaitValue64";
    return nullptr;
  }
  auto attribute = reinterpret_cast<DeviceGetAttribute>(driverEntryPoint("cuDeviceGetAttribute", 2000));
  int supported = 0;
  // The runtime's device ordinals are the driver's (both honour
  // CUDA_VISIBLE_DEVICES).
  if (!attribute ||
      attribute(&supported, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, index) != CUDA_SUCCESS) {
    *whyNot = "cuDeviceGetAttribute could not say whether 64-bit stream memory operations work";
    return nullptr;
  }
  if (!supported) {
    *whyNot = "the device does not support 64-bit stream memory operations";
    return nullptr;
  }
  return wait;
}

}  // namespace

struct CudaDevice::Shared {
  int index;
  std::string name;
  StreamWaitValue64 waitValue64 = nullptr;  // null: the polling kernel
  mutable std::mutex mu;
  std::vector<cudaStream_t> streams;  // guarded by mu
};

// ---- events -----------------------------------------------------------------

CudaEvent::CudaEvent(int index, std::string deviceName, cudaStream_t stream)
    : index_(index), deviceName_(std::move(deviceName)) {
  DeviceGuard guard(index_, deviceName_);
  check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), deviceName_, "cudaEventCreateWithFlags");
  cudaError_t err = cudaEventRecord(event_, stream);
  if (err != cudaSuccess) {
    (void)cudaEventDestroy(event_);
    throwCuda(deviceName_, "cudaEventRecord", err);
  }
}

CudaEvent::~CudaEvent() {
  // After the CUDA runtime has shut down (interpreter exit) this fails; the
  // event is gone with the context then anyway.
  (void)cudaEventDestroy(event_);
}

bool CudaEvent::query() {
  DeviceGuard guard(index_, deviceName_);
  cudaError_t err = cudaEventQuery(event_);
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();  // "not ready" is no error; do not leave it for the next check
    return false;
  }
  throwCuda(deviceName_, "cudaEventQuery", err);
}

// ---- host flags ---------------------------------------------------------------

namespace {

class CudaHostFlag : public HostFlag {
 public:
  explicit CudaHostFlag(const CudaDevice::Shared& device) : deviceName_(device.name) {
    DeviceGuard guard(device.index, device.name);
    void* mem = nullptr;
    check(cudaHostAlloc(&mem, sizeof(uint64_t), cudaHostAllocMapped | cudaHostAllocPortable), device.name,
          "cudaHostAlloc");
    word_ = static_cast<uint64_t*>(mem);
    *word_ = 0;
    void* devicePointer = nullptr;
    cudaError_t err = cudaHostGetDevicePointer(&devicePointer, mem, 0);
    if (err != cudaSuccess) {
      (void)cudaFreeHost(mem);
      throwCuda(device.name, "cudaHostGetDevicePointer", err);
    }
    devicePointer_ = static_cast<uint64_t*>(devicePointer);
  }

  ~CudaHostFlag() override {
    // A stream still waiting on the word would wait forever, and
    // cudaFreeHost would wait with it: release every waiter first.
    std::atomic_ref<uint64_t>(*word_).store(kDeviceWordMax, std::memory_order_release);
    (void)cudaFreeHost(word_);
  }

  void raise(uint64_t value) override {
    raiseTo(value_, value);
    // The device's view, a monotonic max of its own (two raisers may store
    // out of order), clamped so the cyclic comparison stays an ordinary one.
    std::atomic_ref<uint64_t> word(*word_);
    uint64_t clamped = std::min(value, kDeviceWordMax);
    uint64_t current = word.load(std::memory_order_relaxed);
    while (current < clamped &&
           !word.compare_exchange_weak(current, clamped, std::memory_order_release, std::memory_order_relaxed)) {
    }
  }

  uint64_t value() const override { return value_.load(std::memory_order_acquire); }

  uint64_t* devicePointer() const { return devicePointer_; }

 private:
  static void raiseTo(std::atomic<uint64_t>& target, uint64_t value) {
    uint64_t current = target.load(std::memory_order_relaxed);
    while (current < value &&
           !target.compare_exchange_weak(current, value, std::memory_order_release, std::memory_order_relaxed)) {
    }
  }

  static_assert(std::atomic_ref<uint64_t>::is_always_lock_free, "the device reads the word without locks");

  std::string deviceName_;
  uint64_t* word_ = nullptr;           // mapped page-locked memory; atomic_ref on the host
  uint64_t* devicePointer_ = nullptr;  // the same word as the device addresses it
  std::atomic<uint64_t> value_{0};     // the exact raised value, for value()
};

// ---- streams ------------------------------------------------------------------

class CudaStream : public DeviceStream {
 public:
  explicit CudaStream(std::shared_ptr<CudaDevice::Shared> device) : device_(std::move(device)) {
    DeviceGuard guard(device_->index, device_->name);
    // Non-blocking: never synchronises with the legacy default stream that
    // other code in the process may use.
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), device_->name, "cudaStreamCreateWithFlags");
    std::lock_guard<std::mutex> lock(device_->mu);
    device_->streams.push_back(stream_);
  }

  ~CudaStream() override {
    {
      std::lock_guard<std::mutex> lock(device_->mu);
      auto& all = device_->streams;
      all.erase(std::remove(all.begin(), all.end(), stream_), all.end());
    }
    // Queued work still runs; the stream's resources go once it has.
    (void)cudaStreamDestroy(stream_);
  }

  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    DeviceGuard guard(device_->index, device_->name);
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_), device_->name, "cudaMemcpyAsync");
  }

  DeviceEventPtr record() override { return std::make_shared<CudaEvent>(device_->index, device_->name, stream_); }

  void wait(const DeviceEventPtr& event) override {
    if (!event) return;
    auto* cudaEvent = dynamic_cast<CudaEvent*>(event.get());
    SMDDP_CHECK(cudaEvent, kInternal,
                device_->name + ": a stream was asked to wait for an event of another kind of device");
    DeviceGuard guard(device_->index, device_->name);
    check(cudaStreamWaitEvent(stream_, cudaEvent->native(), 0), device_->name, "cudaStreamWaitEvent");
  }

  void waitHost(const HostFlag& flag, uint64_t value) override {
    auto* cudaFlag = dynamic_cast<const CudaHostFlag*>(&flag);
    SMDDP_CHECK(cudaFlag, kInternal,
                device_->name + ": a stream was asked to wait for a host flag of another device kind");
    uint64_t target = std::min(value, kDeviceWordMax);
    DeviceGuard guard(device_->index, device_->name);
    if (device_->waitValue64) {
      CUresult r = device_->waitValue64(reinterpret_cast<CUstream>(stream_),
                                        reinterpret_cast<CUdeviceptr>(cudaFlag->devicePointer()), target,
                                        CU_STREAM_WAIT_VALUE_GEQ);
      SMDDP_CHECK(r == CUDA_SUCCESS, kInternal,
                  device_->name + ": cuStreamWaitValue64 failed: CUresult " + std::to_string(static_cast<int>(r)));
    } else {
      check(launchHostWaitKernel(stream_, cudaFlag->devicePointer(), target), device_->name,
            "launching the host-flag wait kernel");
    }
  }

 private:
  std::shared_ptr<CudaDevice::Shared> device_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

// ---- the device ---------------------------------------------------------------

CudaDevice::CudaDevice(int index, HostWaitMethod method)
    : index_(index), name_("cuda:" + std::to_string(index)), shared_(std::make_shared<Shared>()) {
  int count = 0;
  check(cudaGetDeviceCount(&count), name_, "cudaGetDeviceCount");
  SMDDP_CHECK(index >= 0 && index < count, kInvalidArgument,
              name_ + ": no such CUDA device (this process sees " + std::to_string(count) + ")");
  shared_->index = index;
  shared_->name = name_;
  DeviceGuard guard(index_, name_);
  std::string whyNot = "kernel requested";
  if (method == HostWaitMethod::kAuto) shared_->waitValue64 = findStreamWaitValue64(index_, &whyNot);
  if (shared_->waitValue64) {
    SMDDP_LOG(kInfo) << name_ << ": streams wait for host flags with cuStreamWaitValue64";
  } else {
    SMDDP_LOG(kInfo) << name_ << ": streams wait for host flags with a polling kernel (" << whyNot << ")";
  }
}

CudaDevice::~CudaDevice() = default;

std::unique_ptr<DeviceStream> CudaDevice::newStream() { return std::make_unique<CudaStream>(shared_); }

std::shared_ptr<HostFlag> CudaDevice::newHostFlag() { return std::make_shared<CudaHostFlag>(*shared_); }

std::shared_ptr<void> CudaDevice::allocHost(size_t bytes) {
  DeviceGuard guard(index_, name_);
  void* mem = nullptr;
  // Portable: page-locked for every device's context, not only this one's.
  check(cudaHostAlloc(&mem, std::max<size_t>(bytes, 1), cudaHostAllocPortable), name_, "cudaHostAlloc");
  return std::shared_ptr<void>(mem, [](void* p) { (void)cudaFreeHost(p); });
}

std::vector<cudaStream_t> CudaDevice::streams() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->streams;
}

std::shared_ptr<CudaEvent> CudaDevice::recordOn(cudaStream_t stream) {
  return std::make_shared<CudaEvent>(index_, name_, stream);
}

bool CudaDevice::waitsWithStreamMemOps() const { return shared_->waitValue64 != nullptr; }

}  // namespace smddp
