// Where a group's set-up time went, phase by phase, for its description:
// "formed in 3.4 ms (join 1.2, peers 0.8, ...)". The Communicator keeps
// one; the context's constructor (engine_context.cc) records its phases
// in it, the Communicator the ones after.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace smddp {

class FormationLaps {
 public:
  // Ends the phase that started at the previous lap (or at construction).
  void lap(const char* phase);
  // "formed in <total> ms (<phase> <ms>, ...)".
  std::string describe() const;

 private:
  std::chrono::steady_clock::time_point lapStart_ = std::chrono::steady_clock::now();
  std::vector<std::pair<const char*, double>> laps_;  // phase, ms
};

}  // namespace smddp
