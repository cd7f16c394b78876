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
// A context on the calling thread's current simulated device
// (torch_smddp.testing.sim_set_device), as ProcessGroupNCCL takes the
// current CUDA device. `timeout` bounds the future's wait for its copies.
std::shared_ptr<DeviceContext> makeSimContext(std::chrono::milliseconds timeout);

}  // namespace c10d_smddp
