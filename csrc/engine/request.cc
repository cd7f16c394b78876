// The request pool (request.h): every posted operation's Request, from
// acquire() until its completion releases it; up to 256 released ones are
// kept for reuse.
#include "engine/request.h"

namespace smddp {

Request* RequestPool::acquire() {
  std::unique_ptr<Request> r;
  if (!free_.empty()) {
    r = std::move(free_.back());
    free_.pop_back();
    *r = Request{};
  } else {
    r = std::make_unique<Request>();
  }
  Request* raw = r.get();
  live_.emplace(raw, std::move(r));
  return raw;
}

void RequestPool::release(Request* r) {
  auto it = live_.find(r);
  if (it == live_.end()) return;
  r->onArrive = nullptr;
  r->held.reset();  // the last send holding it frees a failed call's memory
  if (free_.size() < 256) free_.push_back(std::move(it->second));
  live_.erase(it);
}

}  // namespace smddp
