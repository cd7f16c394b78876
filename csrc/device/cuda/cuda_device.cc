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
    if (owned_ && stream_) (void)cudaStreamDestroy(stream_);
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
    : deviceName_(std::move(deviceName)) {
  (void)index;
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
