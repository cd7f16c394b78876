// One posted libfabric operation. The fi_context2 comes first so the
// context pointer libfabric hands back is the Request itself. Requests are
// owned by the Communicator's pool, never by an Exchange, so a completion
// that arrives after its collective failed still finds live memory.
#pragma once

#include <rdma/fabric.h>

#include <chrono>
#include <functional>
#include <string>

#include "transport/endpoint.h"
#include "transport/frame.h"

namespace smddp {

class Exchange;

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
};

}  // namespace smddp
