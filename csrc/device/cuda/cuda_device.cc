#include "device/cuda/cuda_device.h"

#include <algorithm>
#include <map>

#include "common/error.h"
#include "common/logging.h"

namespace smddp {

namespace {

[[noreturn]] void throwCuda(const std::string& device, const char* call, cudaError_t err) {
  throwError(ErrorKind::kInternal, device + ": " + call + " failed: " + cudaGetErrorString(err) +
                                       " (" + cudaGetErrorName(err) + ")");
}

void check(cudaError_t err, const std::string& device, const char* call) {
  if (err != cudaSuccess) throwCuda(device, call, err);
}

// Every call that queues device work comes from a thread bound to the
// device (Device::bindThread, or torch's guard on a caller's thread). A
// thread that is not would make or use a context on another GPU, so this
// is an error, never a silent cudaSetDevice.
void checkBound(int index, const std::string& name, const char* what) {
  int current = -1;
  check(cudaGetDevice(&current), name, "cudaGetDevice");
  SMDDP_CHECK(current == index, kInternal,
              name + ": " + what + " from a thread whose current device is cuda:" +
                  std::to_string(current) + " (the thread was not bound to the device)");
}

// A function of the CUDA driver's API, through the runtime (nothing here
// links the driver library itself); null where it is missing.
void* driverEntry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  const cudaError_t err = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found);
#else
  const cudaError_t err = cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &found);
#endif
  if (err != cudaSuccess || found != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return fn;
}

// torch's MaybeSetDevice on the runtime API: makes `index` the calling
// thread's device only where this process already has a context on it.
// cudaSetDevice would make one (CUDA 12 and later), and a context on a GPU
// other than the rank's own costs every rank memory there (issue 53,
// defect 2).
void maybeSetDevice(int index) {
  // cuDeviceGet and cuDevicePrimaryCtxGetState (CUresult and CUdevice are ints).
  using DeviceGet = int (*)(int* device, int ordinal);
  using PrimaryCtxGetState = int (*)(int device, unsigned int* flags, int* active);
  static const auto deviceGet = reinterpret_cast<DeviceGet>(driverEntry("cuDeviceGet"));
  static const auto ctxState = reinterpret_cast<PrimaryCtxGetState>(driverEntry("cuDevicePrimaryCtxGetState"));
  if (!deviceGet || !ctxState) return;  // the thread stays where it is
  int device = 0, active = 0;
  unsigned int flags = 0;
  if (deviceGet(&device, index) != 0 || ctxState(device, &flags, &active) != 0 || !active) return;
  if (cudaSetDevice(index) != cudaSuccess) (void)cudaGetLastError();
}

// While it lives, device `index` (which has a context: the caller made
// something on it) is the calling thread's; then the thread's previous
// device comes back, where that has a context. For destructors, which may
// run on any thread: a thread never bound would otherwise make a context
// on device 0.
class OnDevice {
 public:
  explicit OnDevice(int index) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      (void)cudaGetLastError();
      return;
    }
    if (previous_ != index) switched_ = cudaSetDevice(index) == cudaSuccess;
  }
  ~OnDevice() {
    if (switched_) maybeSetDevice(previous_);
  }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;

 private:
  int previous_ = -1;
  bool switched_ = false;
};

class CudaStream : public DeviceStream {
 public:
  // `owned`: destroyed with this object (Device::newStream); pool streams
  // are not.
  CudaStream(int index, std::string name, bool owned = false)
      : index_(index), name_(std::move(name)), owned_(owned) {
    checkBound(index_, name_, "a stream was made");
    // Non-blocking: never synchronises with the legacy default stream that
    // other code in the process may use.
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), name_, "cudaStreamCreateWithFlags");
  }
  // Pool streams are never destroyed (CudaDevice lives as long as the
  // process): the caching allocator may record on them at any time. An
  // owned stream goes once its work has completed (its owner's reaper);
  // the reaper's thread is bound to the device.
  ~CudaStream() override {
    if (!owned_ || !stream_) return;
    OnDevice on(index_);
    (void)cudaStreamDestroy(stream_);
  }

  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    checkBound(index_, name_, "a copy was queued");
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_), name_, "cudaMemcpyAsync");
  }

  DeviceEventPtr record() override {
    checkBound(index_, name_, "an event was recorded");
    return std::make_shared<CudaEvent>(index_, name_, stream_);
  }

  void wait(const DeviceEventPtr& event) override {
    if (!event) return;
    auto* cudaEvent = dynamic_cast<CudaEvent*>(event.get());
    SMDDP_CHECK(cudaEvent, kInternal, name_ + ": a stream was asked to wait for an event of another kind of device");
    checkBound(index_, name_, "a stream wait was queued");
    check(cudaStreamWaitEvent(stream_, cudaEvent->native(), 0), name_, "cudaStreamWaitEvent");
  }

  cudaStream_t native() const { return stream_; }

 private:
  int index_;
  std::string name_;
  bool owned_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

// ---- events -----------------------------------------------------------------

CudaEvent::CudaEvent(int index, std::string deviceName, cudaStream_t stream)
    : index_(index), deviceName_(std::move(deviceName)) {
  check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), deviceName_, "cudaEventCreateWithFlags");
  cudaError_t err = cudaEventRecord(event_, stream);
  if (err != cudaSuccess) {
    (void)cudaEventDestroy(event_);
    throwCuda(deviceName_, "cudaEventRecord", err);
  }
}

CudaEvent::~CudaEvent() {
  // Any thread may let go of an event last (a completion pool's, the
  // caller's): on the event's own device, so none makes a context on
  // device 0. After the CUDA runtime has shut down (interpreter exit) this
  // fails; the event is gone with the context then anyway.
  OnDevice on(index_);
  (void)cudaEventDestroy(event_);
}

bool CudaEvent::query() {
  // cudaEventQuery needs no current device.
  cudaError_t err = cudaEventQuery(event_);
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();  // "not ready" is no error; do not leave it for the next check
    return false;
  }
  throwCuda(deviceName_, "cudaEventQuery", err);
}

// ---- the device ---------------------------------------------------------------

std::shared_ptr<CudaDevice> CudaDevice::at(int index) {
  // Never destroyed: pool streams outlive every group.
  static auto* devices = std::make_unique<std::map<int, std::shared_ptr<CudaDevice>>>().release();
  static std::mutex mu;
  std::lock_guard<std::mutex> lk(mu);
  auto& d = (*devices)[index];
  if (!d) d = std::make_shared<CudaDevice>(index);
  return d;
}

CudaDevice::CudaDevice(int index) : index_(index), name_("cuda:" + std::to_string(index)) {
  int count = 0;
  check(cudaGetDeviceCount(&count), name_, "cudaGetDeviceCount");
  SMDDP_CHECK(index >= 0 && index < count, kInvalidArgument,
              name_ + ": no such CUDA device (this process sees " + std::to_string(count) + ")");
}

void CudaDevice::bindThread() {
  check(cudaSetDevice(index_), name_, "cudaSetDevice");
  // This thread's event queries must not invalidate a graph another thread
  // captures (torch.cuda.graph's global mode), as NCCL's watchdog does.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  check(cudaThreadExchangeStreamCaptureMode(&mode), name_, "cudaThreadExchangeStreamCaptureMode");
}

DeviceStream& CudaDevice::poolStream(int which) {
  SMDDP_CHECK(which >= 0 && which < kPoolStreams, kInvalidArgument,
              name_ + ": no pool stream " + std::to_string(which));
  std::lock_guard<std::mutex> lk(mu_);
  if (!pool_[which]) pool_[which] = std::make_unique<CudaStream>(index_, name_);
  return *pool_[which];
}

std::unique_ptr<DeviceStream> CudaDevice::newStream() {
  return std::make_unique<CudaStream>(index_, name_, /*owned=*/true);
}

std::shared_ptr<void> CudaDevice::allocHost(size_t bytes) {
  checkBound(index_, name_, "page-locked memory was allocated");
  void* mem = nullptr;
  // Portable: page-locked for every device's context, not only this one's.
  check(cudaHostAlloc(&mem, std::max<size_t>(bytes, 1), cudaHostAllocPortable), name_, "cudaHostAlloc");
  return std::shared_ptr<void>(mem, [](void* p) { (void)cudaFreeHost(p); });
}

std::shared_ptr<CudaEvent> CudaDevice::recordOn(cudaStream_t stream) {
  return std::make_shared<CudaEvent>(index_, name_, stream);
}

cudaStream_t CudaDevice::native(DeviceStream& stream) {
  auto* s = dynamic_cast<CudaStream*>(&stream);
  SMDDP_CHECK(s, kInternal, "smddp: not a CUDA stream");
  return s->native();
}

bool CudaDevice::capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaError_t err = cudaStreamIsCapturing(stream, &status);
  if (err == cudaErrorStreamCaptureImplicit) {
    // The legacy default stream while another stream captures in global
    // mode: using it now would break that capture.
    (void)cudaGetLastError();
    return true;
  }
  check(err, name_, "cudaStreamIsCapturing");
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace smddp
