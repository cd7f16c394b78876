// The device seam (device.h) on CPU threads: each stream is a thread that
// runs its queue in order, and each queued operation first sleeps a random
// delay, so events of different streams complete out of order as they do on
// a GPU. "Device memory" is host memory. The GPU path's tests (Catch2, and
// the Python tests through SMDDP_DEVICE_SIM) run the staging pipeline on it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "device/device.h"

namespace smddp {

struct SimDeviceOptions {
  // Each queued operation waits a random delay in [0, maxDelay] before it runs.
  std::chrono::microseconds maxDelay{0};
  uint64_t seed = 1;
  // Test hook: the copy with this index (0-based, counted over all streams
  // of the device in the order they were queued) never completes, and
  // stalls its stream; -1 for none.
  int64_t hangCopy = -1;
  // Test hook: called on the stream's thread after each copy, so a test can
  // see the order in which copies of different streams landed.
  std::function<void(void* dst, const void* src, size_t bytes)> afterCopy;
};

std::shared_ptr<Device> makeSimDevice(SimDeviceOptions opts = {});

}  // namespace smddp
