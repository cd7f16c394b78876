// The device seam (device/device.h) on one CUDA device, with the CUDA
// runtime API only: events, async copies, page-locked host memory, and the
// pool streams that outlive process groups. The staging pipeline drives it
// from threads bound to the device; the torch side (backend/cuda_context.cc)
// calls it from callers' threads under torch's device guard.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <string>

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

 private:
  int index_;
  std::string deviceName_;
  cudaEvent_t event_ = nullptr;
};

class CudaDevice : public Device {
 public:
  // The process's device `index` (made on first use, never destroyed:
  // its pool streams live as long as the process).
  static std::shared_ptr<CudaDevice> at(int index);
  explicit CudaDevice(int index);

  std::string name() const override { return name_; }
  int index() const override { return index_; }
  void bindThread() override;
  DeviceStream& poolStream(int which) override;
  std::unique_ptr<DeviceStream> newStream() override;
  std::shared_ptr<void> allocHost(size_t bytes) override;

  // An event on a stream this device did not create (the caller's stream).
  std::shared_ptr<CudaEvent> recordOn(cudaStream_t stream);
  // The native stream of one of this device's streams.
  static cudaStream_t native(DeviceStream& stream);
  // True while `stream` captures a CUDA graph.
  bool capturing(cudaStream_t stream);

 private:
  int index_;
  std::string name_;
  std::mutex mu_;
  std::unique_ptr<DeviceStream> pool_[kPoolStreams];  // guarded by mu_: made on first use
};

}  // namespace smddp
