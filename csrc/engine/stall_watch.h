// What every waiting collective checks while it waits, in one place: error
// frames from ranks that failed the same calls, stall probes that show a
// peer made a different call, this rank's own probe once the wait is long,
// the deadline (group timeout) and the liveness of peers on this host.
// Used by Exchange::run (network waits) and by the fusion scheduler's
// shared-memory waits, so both fail the same way with the same messages.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "transport/frame.h"

namespace smddp {

class EngineContext;

class StallWatch {
 public:
  // Messages name the call "<sig> at sequence <seq> in group '<name>'"
  // (callAt, call.h), spelled out only when a message needs it (a
  // small call has no time for the string).
  StallWatch(EngineContext& ctx, const CollectiveSignature& sig, uint64_t seq,
             std::chrono::milliseconds timeout);

  // Throws smddp::Error when the wait must end. The calls waited on are
  // sequences firstSeq .. firstSeq + count - 1 with signatures sigs[0..count).
  // `waitingOn` and `notSeen` build the timeout message ("rank(s) 1",
  // "not seen at this call: rank(s) 2"); they run only on timeout.
  void check(uint64_t firstSeq, const CollectiveSignature* sigs, size_t count,
             const std::function<std::string()>& waitingOn,
             const std::function<std::string()>& notSeen);
  // Send the stall probe at the next check rather than after 200 ms.
  void probeNow() { probeNow_ = true; }
  const std::string& what() const;
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  EngineContext& ctx_;
  mutable std::string what_;  // filled from sig_ and seq_ on first use
  CollectiveSignature sig_{};
  uint64_t seq_ = 0;
  std::chrono::milliseconds timeout_;
  std::chrono::steady_clock::time_point start_, deadline_, nextLiveness_;
  bool probed_ = false;
  bool probeNow_ = false;
};

}  // namespace smddp
