// A group's set-up time, phase by phase (formation_laps.h).
#include "engine/formation_laps.h"

#include <cstdio>

namespace smddp {

void FormationLaps::lap(const char* phase) {
  const auto now = std::chrono::steady_clock::now();
  laps_.emplace_back(phase, std::chrono::duration<double, std::milli>(now - lapStart_).count());
  lapStart_ = now;
}

std::string FormationLaps::describe() const {
  double total = 0;
  std::string parts;
  char buf[64];
  for (const auto& [phase, ms] : laps_) {
    total += ms;
    std::snprintf(buf, sizeof(buf), "%s%s %.1f", parts.empty() ? "" : ", ", phase, ms);
    parts += buf;
  }
  std::snprintf(buf, sizeof(buf), "formed in %.1f ms (", total);
  return buf + parts + ")";
}

}  // namespace smddp
