// A device-path wait that failed gives the group's liveness a moment to
// name a lost rank before the wait's own error is raised: the liveness may
// see a death a moment after the transport does ("Connection reset by
// peer", a timeout). The rail's waits (device_collectives.cc) and the
// intra-host route's set-up (intra.cc) both take it.
#pragma once

#include <chrono>
#include <thread>

namespace c10d_smddp {

constexpr auto kLivenessGrace = std::chrono::milliseconds(200);

// Calls `check`, which throws naming a lost rank, every `poll` for
// kLivenessGrace; returns if it never threw.
template <typename Check>
void giveLivenessItsMoment(const Check& check, std::chrono::milliseconds poll) {
  const auto until = std::chrono::steady_clock::now() + kLivenessGrace;
  do {
    check();
    std::this_thread::sleep_for(poll);
  } while (std::chrono::steady_clock::now() < until);
}

}  // namespace c10d_smddp
