#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include <cstdio>

#include "device/sim_device.h"

namespace {

// Every test that drives the simulated device must keep CUDA's rules: a
// rule broken anywhere (a destructor, a queue thread) is reported after the
// test as SMDDP_SIM_VIOLATION, which ctest counts as a failure. Tests
// tagged [sim] break rules on purpose and check them themselves.
struct SimRulesListener : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseEnded(const Catch::TestCaseStats& stats) override {
    const auto& tags = stats.testInfo.tags;
    if (std::find(tags.begin(), tags.end(), "sim") != tags.end()) return;
    for (const auto& v : smddp::sim::violations()) {
      std::fprintf(stderr, "SMDDP_SIM_VIOLATION: %s: %s\n", stats.testInfo.name.c_str(), v.c_str());
    }
  }
};

}  // namespace

CATCH_REGISTER_LISTENER(SimRulesListener)
