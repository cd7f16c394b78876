// Waits the Catch2 tests on the simulated device share (test_sim_device,
// test_sim_nccl, test_nccl_host, staging_harness.h).
#pragma once

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "device/device.h"

namespace sim_waits {

// Polls the event until it completes or `within` passes.
inline bool completes(const smddp::DeviceEventPtr& event, std::chrono::milliseconds within) {
  const auto deadline = std::chrono::steady_clock::now() + within;
  while (!event->query()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return true;
}

// Whether one of the stand-in's recorded rule violations mentions `what`.
inline bool mentions(const std::vector<std::string>& violations, const std::string& what) {
  for (const auto& v : violations) {
    if (v.find(what) != std::string::npos) return true;
  }
  return false;
}

}  // namespace sim_waits
