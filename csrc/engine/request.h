// One posted libfabric operation. The fi_context2 comes first so the
// context pointer libfabric hands back is the Request itself. Requests are
// owned by the Communicator's pool, never by an Exchange, so a completion
// that arrives after its collective failed still finds live memory.
#pragma once

#include <rdma/fabric.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "transport/endpoint.h"
#include "transport/frame.h"

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
  enum class Type { kSend, kRecv, kErrorRecv, kErrorSend } type = Type::kSend;
  Exchange* owner = nullptr;  // null for communicator-level or orphaned requests
  int peer = -1;
  uint32_t phase = 0;
  uint32_t chunk = 0;
  uint64_t tag = 0;
  bool posted = false;
  FrameHeader header{};  // outgoing header, or where an incoming one lands
  void* payload = nullptr;
  size_t payloadBytes = 0;
  std::string text;                 // error-frame text (send or receive buffer)
  std::function<void()> onArrive;   // receives: runs after validation
  // Communicator-level operations (point-to-point): called with the raw
  // completion; the request is released afterwards.
  std::function<void(Request*, const Completion&)> onComplete;
  std::chrono::steady_clock::time_point deadline{};
  // A send abandoned by its failed call: what it may still read.
  std::shared_ptr<HeldMemory> held;
};

}  // namespace smddp
