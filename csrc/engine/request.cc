// The request pool (request.h): every posted operation's Request, from
// acquire() until its completion releases it; up to 256 released ones are
// kept for reuse, and a few staging buffers of sealed sends per peer.
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
  // Released means the provider is done with it: its staging buffer may
  // serve the next sealed send to the same peer.
  if (r->staging.capacity() > 0) {
    auto& kept = staging_[r->peer];
    if (kept.size() < kStagingKept) kept.push_back(std::move(r->staging));
    r->staging = {};
  }
  if (free_.size() < 256) free_.push_back(std::move(it->second));
  live_.erase(it);
}

std::vector<uint8_t> RequestPool::staging(int peer, size_t bytes) {
  std::vector<uint8_t> out;
  auto it = staging_.find(peer);
  if (it != staging_.end() && !it->second.empty()) {
    out = std::move(it->second.back());
    it->second.pop_back();
  }
  // Grown only: a buffer keeps the size of its largest send, so reusing
  // it never writes zeros over what the seal overwrites anyway.
  if (out.size() < bytes) out.resize(bytes);
  return out;
}

}  // namespace smddp
