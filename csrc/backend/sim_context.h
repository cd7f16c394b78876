// The device path on CPU tensors over the simulated device (sim_context.cc).
#pragma once

#include <chrono>
#include <memory>

#include "backend/device_context.h"

namespace c10d_smddp {

// SMDDP_DEVICE_SIM: CPU collectives of a group take the device path.
bool deviceSimRequested();
// The simulated devices' options from SMDDP_DEVICE_SIM_* (once per process).
void configureSimOnce();
// A context on a simulated device. For CPU tensors: the calling thread's
// current one (torch_smddp.testing.sim_set_device), as ProcessGroupNCCL
// takes the current CUDA device; for the stand-in's torch device
// (sim_torch_device.h, "privateuseone:N"): device N. `timeout` bounds the
// future's wait for its copies.
std::shared_ptr<DeviceContext> makeSimContext(std::chrono::milliseconds timeout, c10::Device torch);

}  // namespace c10d_smddp
