// The point-to-point operations in flight (p2p_state.h).
#include "engine/p2p_state.h"

#include <rdma/fi_errno.h>

#include <memory>
#include <utility>
#include <vector>

namespace smddp {

void P2PState::complete(Request* r, const Completion& c) {
  auto onComplete = std::move(r->onComplete);
  r->onComplete = nullptr;
  --inFlight_;
  onComplete(r, c);
  requests_.release(r);
}

void P2PState::fail(const std::string& why, bool timedOut) {
  std::vector<Request*> p2p;
  for (auto& [raw, owned] : requests_.live()) {
    if (raw->onComplete) p2p.push_back(raw);
  }
  for (Request* r : p2p) {
    Completion c;
    c.err = FI_ECANCELED;
    c.errText = why;
    if (timedOut) r->text = "timed out";
    auto onComplete = std::move(r->onComplete);
    r->onComplete = nullptr;
    if (r->posted && inFlight_ > 0) --inFlight_;
    try {
      onComplete(r, c);
    } catch (...) {
    }
    if (r->posted) {
      // The provider still holds the operation, and may still read (a send)
      // or write (a receive) its buffer: the completion, which owns that
      // buffer in the backend, stays with the request until the provider
      // completes it or shutdown closes the endpoint.
      r->held = std::make_shared<HeldMemory>();
      r->held->owners.push_back([keep = std::move(onComplete)] {});
      if (r->type == Request::Type::kSend) {
        traffic_.sendAbandoned(/*held=*/true);
      }
    }
  }
}

}  // namespace smddp
