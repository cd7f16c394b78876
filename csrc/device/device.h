// The device seam: the four things the GPU path asks of a device (async
// copy, event record, event query, stream wait), plus the host-raised flag
// a stream can wait on. csrc/device/cuda/cuda_device.cc implements it with CUDA
// streams and events; sim_device.h implements it on CPU threads with
// artificial delays, so CI tests the staging pipeline (staging_pipeline.h)
// without a GPU. Nothing here includes CUDA headers. docs/design.md, "GPU
// path", explains how the pipeline uses it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace smddp {

// Marks a point in a stream's queue.
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
  // True once all work the stream had queued before record() has
  // completed. Never blocks. Throws an Error (kInternal) that names the
  // device when the device reported a failure.
  virtual bool query() = 0;
};
using DeviceEventPtr = std::shared_ptr<DeviceEvent>;

// A word in host memory that the host raises and device streams can wait
// on (cuStreamWaitValue64 on CUDA). Raising is monotonic: raise(v) with v
// below the current value changes nothing.
class HostFlag {
 public:
  virtual ~HostFlag() = default;
  virtual void raise(uint64_t value) = 0;
  virtual uint64_t value() const = 0;
};

// An in-order queue of device work (a cudaStream_t). Every call returns at
// once; the work runs later, in the order it was queued.
class DeviceStream {
 public:
  virtual ~DeviceStream() = default;
  // Copies `bytes` from src to dst; either may be device memory or host
  // memory from Device::allocHost.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // An event that completes when the work queued so far has.
  virtual DeviceEventPtr record() = 0;
  // Work queued after this starts once `event` (of any stream) completes.
  virtual void wait(const DeviceEventPtr& event) = 0;
  // Work queued after this starts once flag.value() >= value.
  virtual void waitHost(const HostFlag& flag, uint64_t value) = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  // "cuda:0", "sim"; used in error messages.
  virtual std::string name() const = 0;
  virtual std::unique_ptr<DeviceStream> newStream() = 0;
  virtual std::shared_ptr<HostFlag> newHostFlag() = 0;
  // Page-locked host memory that copies can use at full speed
  // (cudaHostAlloc). The deleter frees it.
  virtual std::shared_ptr<void> allocHost(size_t bytes) = 0;
};

}  // namespace smddp
