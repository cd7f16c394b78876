// What the device collectives (device_collectives.h) need from torch for
// one accelerator device, beyond the device seam (device/device.h): the
// caller's current device and stream, capture, the caching allocator, and
// c10d's device-aware futures. cuda_context.cc implements it for CUDA;
// sim_context.cc implements it on CPU tensors over the simulated device,
// which follows CUDA's rules, so CI runs the whole device path without a
// GPU. Both take the same code path in device_collectives.cc for completion
// and errors.
#pragma once

#include <ATen/core/ivalue.h>
#include <ATen/core/ivalue_inl.h>
#include <ATen/Tensor.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "device/device.h"

namespace c10d_smddp {

class DeviceContext {
 public:
  virtual ~DeviceContext() = default;

  // The device this context serves ("cuda:1"); tensors of a call must all
  // be on it.
  virtual c10::Device torchDevice() const = 0;
  // The seam the staging pipeline drives (the process's device).
  virtual std::shared_ptr<smddp::Device> device() = 0;

  // While the result lives, the calling thread's current device is this
  // context's (torch's device guard: the previous device is restored only
  // where it already has a context).
  virtual std::shared_ptr<void> enter() = 0;
  // True while the caller's current stream captures a graph (inside
  // enter()).
  virtual bool capturing() = 0;
  // An event on the caller's current stream, recorded now: a call's inputs
  // are ready when it completes (inside enter()).
  virtual smddp::DeviceEventPtr callerReady() = 0;
  // The caller's current stream waits for `done`; the host does not
  // (inside enter()).
  virtual void streamWaits(const smddp::DeviceEventPtr& done) = 0;
  // The host waits until the caller's current stream has run everything
  // queued on it (barrier's rule, as NCCL's); kTimeout past `timeout`
  // (inside enter()).
  virtual void synchronizeCaller(std::chrono::milliseconds timeout) = 0;
  // The caching allocator's recordStream: `t`'s memory is not handed out
  // again before `stream`'s work queued so far has run.
  virtual void protect(const at::Tensor& t, smddp::DeviceStream& stream) = 0;

  // A future over this device's tensors (c10d's device-aware future), and
  // its completion once the host part is done: whoever waits on the future,
  // or a then() callback, sees the tensors as they are after every `done`.
  virtual c10::intrusive_ptr<c10::ivalue::Future> newFuture() = 0;
  virtual void completeFuture(const c10::intrusive_ptr<c10::ivalue::Future>& future,
                              c10::IValue value,
                              const std::vector<smddp::DeviceEventPtr>& done) = 0;
};

// cuda_context.cc; only linked when built with SMDDP_WITH_CUDA.
std::shared_ptr<DeviceContext> makeCudaContext(c10::DeviceIndex index);
// True when this build has the CUDA path (and makeCudaContext exists).
bool builtWithCuda();
// CUDA devices this process sees (0 without the CUDA path), and the
// calling thread's current one.
int cudaDeviceCount();
c10::DeviceIndex currentCudaDevice();

}  // namespace c10d_smddp
