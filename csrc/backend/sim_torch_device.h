// The stand-in as a torch device (sim_torch_device.cc): tensors on
// "privateuseone:N" whose memory is host memory, whose streams and events
// are the simulated device's (device/sim_device.h), and whose ops are
// stream-ordered as CUDA kernels are. c10's futures then carry the
// stand-in's events, and the device path's completion code
// (device_future.h) runs on it as it does for CUDA. Test-only; registered
// by torch_smddp.testing.sim_torch_device(), never at import.
#pragma once

#include <ATen/Tensor.h>

#include "device/device.h"

namespace c10d_smddp {

// Registers the PrivateUse1 device guard, allocator and kernels (once;
// refuses when another extension owns PrivateUse1).
void enableSimTorchDevice();
bool simTorchDeviceEnabled();
// The calling thread's current simulated device (sim_set_device).
c10::DeviceIndex currentSimTorchDevice();

// The caching allocator's recordStream for the stand-in's tensors: `t`'s
// memory is freed only once `stream`'s work queued so far has run.
void simTorchRecordStream(const at::Tensor& t, smddp::DeviceStream& stream);

// The c10 event handle of a stand-in event (what the guard's block() and
// queryEvent() take).
void* simTorchEventHandle(const smddp::DeviceEventPtr& event);

}  // namespace c10d_smddp
