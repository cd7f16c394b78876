// A device call's completion as torch sees it, written once against c10's
// device-generic guard (VirtualGuardImpl) for every device the device path
// serves: CUDA (cuda_context.cc) and the stand-in's torch device
// (sim_torch_device.h). `handle` gives the c10 event handle of one of the
// device's smddp events (a cudaEvent_t for CUDA).
#pragma once

#include <ATen/core/ivalue.h>
#include <ATen/core/ivalue_inl.h>
#include <c10/core/Device.h>

#include <functional>
#include <vector>

#include "device/device.h"

namespace c10d_smddp {

using EventHandle = std::function<void*(const smddp::DeviceEventPtr&)>;

// The caller's current stream on `device` waits for `done`; the host does not.
void currentStreamWaits(c10::Device device, const smddp::DeviceEventPtr& done,
                        const EventHandle& handle);

// Completes `future` (made with `device` among its devices) with `value`:
// markCompleted records the future's events on a pool stream that first
// waits for every `done`, so whoever waits on the future, or a then()
// callback, sees the tensors as they are after them, and the caller's own
// stream is not held up by the wait.
void completeBehind(c10::Device device, const c10::intrusive_ptr<c10::ivalue::Future>& future,
                    c10::IValue value, const std::vector<smddp::DeviceEventPtr>& done,
                    const EventHandle& handle);

}  // namespace c10d_smddp
