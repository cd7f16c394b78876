// One fusion batch as the scheduler's two halves see it: the plan (who
// fuses what, fusion_plan.cc) and the data steps (fusion_steps.cc).
// Private to the fusion scheduler.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hostpath/fusion_scheduler.h"
#include "engine/stall_watch.h"

namespace smddp {

struct FusionBufferScheduler::Batch {
  uint64_t index = 0;
  FusionPlan* plan = nullptr;
  uint64_t firstSeq = 0;
  uint64_t firstStep = 0;
  uint64_t steps = 0;
  uint64_t totalNumel = 0;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  std::vector<CollectiveSignature> sigs;  // what this rank called, by position
  bool joined = false;                    // this rank published arrived
  std::optional<StallWatch> watch;        // errors, probes, deadline, liveness
  // For messages: the first call and its sequence number.
  const std::string& what() const { return watch->what(); }
  std::chrono::steady_clock::time_point idleSince;
  bool streaming = false;  // in the data steps: every peer is in this call too
  bool small = false;      // the plan's small flag: see FusionBufferScheduler::streamSmall
  bool onCaller = false;   // run on the thread of the caller that waits for it
  std::chrono::steady_clock::time_point nextNetworkCheck{};
};

// "rank(s) 1, 3" for messages.
inline std::string rankList(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return "rank(s) " + s;
}

}  // namespace smddp
