// What the stand-in's torch device shares between its guard
// (sim_torch_device.cc) and its memory and ops (sim_torch_ops.cc).
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <torch/library.h>

#include <chrono>
#include <memory>

#include "common/error.h"
#include "device/sim_device.h"

namespace c10d_smddp::simtorch {

constexpr auto kType = c10::DeviceType::PrivateUse1;
// The stand-in's torch devices: a host of eight GPUs.
constexpr c10::DeviceIndex kDevices = 8;
// Host waits of the stand-in's ops (a test's whole run is bounded below this).
constexpr std::chrono::seconds kHostWaitBound{300};

inline std::shared_ptr<smddp::Device> simDevice(c10::DeviceIndex index) {
  TORCH_CHECK_INDEX(index >= 0 && index < kDevices, "smddp stand-in: no device privateuseone:",
                    static_cast<int>(index), " (it has ", static_cast<int>(kDevices), ")");
  return smddp::sim::deviceAt(index);
}

// The calling thread's current device is `index` while this lives (a
// simulated queue takes work only from a thread on its device).
using OnDevice = smddp::sim::ScopedDevice;

// The host waits for `event` of device `index`, as torch's ops and guard
// report errors.
inline void hostWait(c10::DeviceIndex index, const smddp::DeviceEventPtr& event, const char* what) {
  try {
    smddp::sim::hostWait(*simDevice(index), event, kHostWaitBound, what);
  } catch (const smddp::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

// The allocator of the stand-in's memory (sim_torch_ops.cc).
c10::Allocator* allocator();
// Storage::resize_ on the stand-in's memory (behind the current stream).
void resizeBytes(const c10::Storage& storage, size_t bytes);
// Registers the stand-in's kernels on `aten` and its fallback for every
// other op on `others` (sim_torch_ops.cc).
void registerOps(torch::Library& aten, torch::Library& others);
// The calling thread's current simulated device.
inline c10::DeviceIndex currentDevice() {
  return static_cast<c10::DeviceIndex>(smddp::sim::currentDevice());
}

}  // namespace c10d_smddp::simtorch
