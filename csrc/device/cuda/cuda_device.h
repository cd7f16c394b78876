// The device seam (device/device.h) on one CUDA device, with the CUDA
// runtime API only: streams, events, async copies, page-locked host memory,
// and host flags that streams wait on without a host thread. The staging
// pipeline drives it; cuda_context.cc hands it out and reads streams() to
// protect callers' tensors from the caching allocator.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "device/device.h"

namespace smddp {

// An event recorded on some stream of one device.
class CudaEvent : public DeviceEvent {
 public:
  // Records a new event on `stream` (any stream of device `index`, also one
  // the device did not create, such as the caller's current stream).
  CudaEvent(int index, std::string deviceName, cudaStream_t stream);
  ~CudaEvent() override;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  bool query() override;
  cudaEvent_t native() const { return event_; }
  const std::string& deviceName() const { return deviceName_; }

 private:
  int index_;
  std::string deviceName_;
  cudaEvent_t event_ = nullptr;
};

// How streams wait for a host flag (DeviceStream::waitHost).
enum class HostWaitMethod {
  kAuto,        // cuStreamWaitValue64 where the driver offers it, else kSpinKernel
  kSpinKernel,  // a one-thread kernel that polls the flag's mapped word
};

class CudaDevice : public Device {
 public:
  explicit CudaDevice(int index, HostWaitMethod method = HostWaitMethod::kAuto);
  ~CudaDevice() override;

  std::string name() const override { return name_; }
  std::unique_ptr<DeviceStream> newStream() override;
  std::shared_ptr<HostFlag> newHostFlag() override;
  std::shared_ptr<void> allocHost(size_t bytes) override;

  int index() const { return index_; }
  // The native streams of every live stream newStream() made.
  std::vector<cudaStream_t> streams() const;
  // An event on a stream this device did not create (the caller's stream).
  std::shared_ptr<CudaEvent> recordOn(cudaStream_t stream);
  // True when streams wait on host flags with cuStreamWaitValue64, false
  // when with the polling kernel.
  bool waitsWithStreamMemOps() const;

  // State the device's streams share with it; cuda_device.cc defines it.
  struct Shared;

 private:
  int index_;
  std::string name_;
  std::shared_ptr<Shared> shared_;
};

}  // namespace smddp
