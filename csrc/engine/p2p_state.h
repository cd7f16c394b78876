// The point-to-point operations in flight (EngineContext::p2p()): how many
// are posted and not yet completed, their completions, and failing them
// all. The operations themselves are posted by engine/p2p.cc. Worker
// thread only.
#pragma once

#include <cstddef>
#include <string>

#include "engine/request.h"
#include "observe/traffic_observer.h"
#include "transport/endpoint.h"

namespace smddp {

class P2PState {
 public:
  // `requests`: the group's pool, which holds every point-to-point
  // Request; `traffic` counts the sends that stay posted after a failure.
  P2PState(RequestPool& requests, const TrafficObserver& traffic)
      : requests_(requests), traffic_(traffic) {}
  P2PState(const P2PState&) = delete;
  P2PState& operator=(const P2PState&) = delete;

  // Point-to-point operations posted and not yet completed.
  size_t inFlight() const { return inFlight_; }
  void posted() { ++inFlight_; }
  // The endpoint completed `r`, a point-to-point operation (its
  // onComplete is set): runs its completion, then the pool takes it back.
  void complete(Request* r, const Completion& c);
  // Completes every point-to-point operation in flight with `why`; their
  // requests stay pooled until the endpoint's completion or close.
  void fail(const std::string& why, bool timedOut);

 private:
  RequestPool& requests_;
  const TrafficObserver& traffic_;
  size_t inFlight_ = 0;
};

}  // namespace smddp
