// One posted libfabric operation, and the pool that owns it. The fi_context2
// comes first so the context pointer libfabric hands back is the Request
// itself. Requests are owned by the engine context's pool, never by an
// Exchange, so a completion that arrives after its collective failed still
// finds live memory.
#pragma once

#include <rdma/fabric.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "transport/endpoint.h"
#include "transport/frame.h"
#include "transport/peer_seal.h"

namespace smddp {

class Exchange;

// Memory that a send still posted after its call failed may read: the
// call's completions (which own its buffers, in the backend) and the
// communicator's scratch as that call left it. Every such send holds it;
// it is freed when the last of them completes, or when shutdown has closed
// the endpoint. A send that never completes (a dead peer, a receive the
// peer cancelled) keeps it until then: a leak, never a use after free.
struct HeldMemory {
  std::vector<std::function<void()>> owners;  // each captures what it keeps
  std::vector<uint8_t> scratch;
  std::vector<uint8_t> fusion;
};

struct Request {
  fi_context2 ctx;  // must stay the first member
  enum class Type { kSend, kRecv, kErrorRecv, kErrorSend, kLeaveSend } type = Type::kSend;
  Exchange* owner = nullptr;  // null for communicator-level or orphaned requests
  int peer = -1;
  uint32_t phase = 0;
  uint32_t chunk = 0;
  uint64_t tag = 0;
  bool posted = false;
  FrameHeader header{};  // outgoing header, or where an incoming one lands
  ControlHead control{};  // the same, with its MAC, for control frames
  void* payload = nullptr;
  size_t payloadBytes = 0;
  // SMDDP_WIRE_ENCRYPT, to a peer on another host (engine/sealed_frames.h):
  // the trailer after the payload (sent, or where an incoming one lands),
  // and a send's ciphertext, which the provider reads in place of
  // `payload`. The buffer lives as long as the request: a send abandoned
  // by its call keeps it until its completion, or until shutdown.
  SealTrailer trailer{};
  bool sealed = false;            // a send's payload is sealed into `staging`
  std::vector<uint8_t> staging;   // from the pool's buffers for `peer`
  std::string text;                 // error-frame text (send or receive buffer)
  std::function<void()> onArrive;   // receives: runs after validation; sends: once complete
  // Group-level operations (point-to-point): called with the raw
  // completion; the request is released afterwards.
  std::function<void(Request*, const Completion&)> onComplete;
  std::chrono::steady_clock::time_point deadline{};
  // A send abandoned by its failed call: what it may still read.
  std::shared_ptr<HeldMemory> held;
};

// Every posted Request lives here until its completion (or until shutdown
// has closed the endpoint); released ones are reused. Worker thread only
// (or a caller running its own call: Communicator::runOnCaller).
class RequestPool {
 public:
  // A fresh Request, owned by the pool until release().
  Request* acquire();
  // Back to the pool; a pointer the pool does not hold is ignored.
  void release(Request* r);
  // Whether `r` is a live Request of this pool (a completion's context).
  bool owns(Request* r) const { return live_.find(r) != live_.end(); }
  // The live Requests (point-to-point supervision walks them).
  const std::unordered_map<Request*, std::unique_ptr<Request>>& live() const { return live_; }
  // Frees every Request: only once the endpoint is closed.
  void clear() {
    live_.clear();
    free_.clear();
    staging_.clear();
  }
  // A buffer of at least `bytes` for a sealed send to `peer`: one that
  // release() gave back for that peer when there is one (a ring reuses
  // the same few, so no send maps and faults in fresh pages), else new.
  std::vector<uint8_t> staging(int peer, size_t bytes);
  // Buffers kept per peer once their sends completed: the ring depth
  // across hosts (2) times both directions of a step, with room to spare.
  static constexpr size_t kStagingKept = 4;

 private:
  std::unordered_map<Request*, std::unique_ptr<Request>> live_;
  std::vector<std::unique_ptr<Request>> free_;
  std::unordered_map<int, std::vector<std::vector<uint8_t>>> staging_;  // free buffers by peer
};

}  // namespace smddp
