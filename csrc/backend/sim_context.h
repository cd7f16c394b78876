// The device path on CPU tensors over the simulated device (sim_context.cc).
#pragma once

#include <memory>

#include "backend/device_context.h"

namespace c10d_smddp {

// SMDDP_DEVICE_SIM: CPU collectives of a group take the device path.
bool deviceSimRequested();
std::unique_ptr<DeviceContext> makeSimContext(int rank);

}  // namespace c10d_smddp
