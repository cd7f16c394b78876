// The device seam: what the GPU path asks of a device. Async copies, event
// record and query, and stream waits; streams that outlive process groups;
// page-locked host memory; and binding a thread to the device.
// cuda/cuda_device.cc implements it with CUDA streams and events;
// sim_device.h implements it on CPU threads under CUDA's rules, so that CI
// tests the staging pipeline (staging_pipeline.h) without a GPU. Nothing
// here includes CUDA headers. docs/design.md, "GPU path", gives the rules.
//
// No device queue ever waits for the host: every wait is on an event that
// was recorded before the wait was queued, so device work always drains.
#pragma once

#include <chrono>
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

// An in-order queue of device work (a cudaStream_t). Every call returns at
// once; the work runs later, in the order it was queued. The calling thread
// must be bound to the stream's device (Device::bindThread, or the torch
// side's device guard on a caller's thread).
class DeviceStream {
 public:
  virtual ~DeviceStream() = default;
  // Copies `bytes` from src to dst; either may be device memory or host
  // memory from Device::allocHost.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // An event that completes when the work queued so far has.
  virtual DeviceEventPtr record() = 0;
  // Work queued after this starts once `event` (of any stream of the same
  // device) completes.
  virtual void wait(const DeviceEventPtr& event) = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  // "cuda:0", "sim:1"; used in error messages.
  virtual std::string name() const = 0;
  virtual int index() const = 0;
  // Makes this device the calling thread's current device for good
  // (cudaSetDevice), and lets the thread query events while another thread
  // captures a CUDA graph (relaxed capture mode). Every thread the library
  // starts to drive the device calls it once, first.
  virtual void bindThread() = 0;
  // One of a few streams that live as long as the process, as
  // ProcessGroupNCCL's pool streams do: the caching allocator may record
  // a freed tensor's last use on them after every group is gone.
  // `which` < kPoolStreams.
  static constexpr int kPoolStreams = 4;
  virtual DeviceStream& poolStream(int which) = 0;
  // A stream of its own, for device work that waits on other devices (an
  // intra-host NCCL communicator's kernels): on a pool stream such work
  // would queue behind, or hold up, every other group's in an order each
  // rank picks for itself. No tensor's memory is recorded on it; the owner
  // must keep it until the work queued on it has completed (DeviceReaper).
  virtual std::unique_ptr<DeviceStream> newStream() = 0;
  // Page-locked host memory that copies can use at full speed
  // (cudaHostAlloc). The deleter frees it: the owner must keep it until
  // every copy that uses it has completed (DeviceReaper).
  virtual std::shared_ptr<void> allocHost(size_t bytes) = 0;
};

}  // namespace smddp
