// What the device collectives (device_collectives.h) need from torch for
// one accelerator device, beyond the device seam (device/device.h): the
// caller's current stream, the caching allocator, and c10d's device-aware
// futures. csrc/backend/cuda_context.cc implements it for CUDA (the only code
// that includes CUDA headers); sim_context.cc implements it on CPU tensors
// with the simulated device, so CI runs the whole device path without a GPU.
#pragma once

#include <ATen/core/ivalue.h>
#include <ATen/core/ivalue_inl.h>
#include <ATen/Tensor.h>

#include <chrono>
#include <memory>
#include <string>

#include "device/device.h"

namespace c10d_smddp {

class DeviceContext {
 public:
  virtual ~DeviceContext() = default;

  // The device this context serves ("cuda:1"); tensors of a call must all
  // be on it.
  virtual c10::Device torchDevice() const = 0;
  // The seam the staging pipeline drives (one per context, created once).
  virtual std::shared_ptr<smddp::Device> device() = 0;

  // An event on the caller's current stream, recorded now: a call's inputs
  // are ready when it completes. Null where inputs are always ready.
  virtual smddp::DeviceEventPtr callerReady() = 0;
  // Keeps `t`'s memory from being handed out again while the device
  // device()'s streams still use it (recordStream on each of them).
  virtual void protect(const at::Tensor& t) = 0;
  // Work::wait(): the caller's current stream waits for `done` (CUDA: no
  // host blocking). The simulation blocks the host instead, bounded by
  // `timeout`, and throws kTimeout past it.
  virtual void callerWaits(const smddp::DeviceEventPtr& done, std::chrono::milliseconds timeout) = 0;
  // True where callerWaits blocks the host (the simulation): Work::wait()
  // then also waits for the host part and raises its error.
  virtual bool blocksHost() const { return false; }

  // A future over this device's tensors (c10d's device-aware future), and
  // its completion: the future's own events must come after `done`, so a
  // caller that waits on the future, or a then() callback, sees finished
  // tensors.
  virtual c10::intrusive_ptr<c10::ivalue::Future> newFuture() = 0;
  virtual void completeFuture(const c10::intrusive_ptr<c10::ivalue::Future>& future,
                              c10::IValue value, const smddp::DeviceEventPtr& done) = 0;

  // Page-locked host tensor (for staging whole tensors of calls other than
  // allreduce) of `bytes` bytes, from torch's host allocator where it has one.
  virtual at::Tensor hostBuffer(size_t bytes) = 0;
};

// csrc/backend/cuda_context.cc; only linked when built with SMDDP_WITH_CUDA.
std::unique_ptr<DeviceContext> makeCudaContext(c10::DeviceIndex index);
// True when this build has the CUDA path (and makeCudaContext exists).
bool builtWithCuda();

}  // namespace c10d_smddp
