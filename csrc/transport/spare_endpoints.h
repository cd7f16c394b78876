// Endpoints opened ahead, for a process that forms group after group.
//
// torchft forms a new group every time its quorum changes. On tcp;ofi_rxm
// each formation opened an endpoint (8-10 ms in a training process), and
// the group's first send then paid for rxm's transmit pool: a 17 MB
// allocation at our eager limit whose first touch took ~9 ms. Gloo forms
// in 1-2 ms. A group formed for such a process (CommOptions::keepSpare)
// asks for a spare afterwards: a background thread opens one, after a
// pause that keeps it off the steps that follow the formation, and warms
// it (Endpoint::warmUp). The next formation of the process takes it
// instead of opening one (docs/notes/2026-11-26-spare-endpoint.md).
//
// Not for shm: its endpoint holds a region of /dev/shm. SMDDP_SPARE_ENDPOINT=0
// turns spares off.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "transport/endpoint.h"
#include "transport/fabric.h"

namespace smddp {

struct OpenedEndpoint {
  std::shared_ptr<Fabric> fabric;
  std::unique_ptr<Endpoint> endpoint;  // null: none was ready
};

// A spare for `provider` when one is ready, or being opened and ready
// within a second; else an empty one, and a spare still waiting for its
// pause is not opened (the caller asks again once formed).
OpenedEndpoint takeSpareEndpoint(const std::string& provider);

// A freshly opened endpoint on its own Fabric; throws what opening one
// throws.
OpenedEndpoint openFreshEndpoint(const std::string& provider);

// takeSpareEndpoint's spare if there is one, else openFreshEndpoint's.
OpenedEndpoint spareOrFreshEndpoint(const std::string& provider);

// Opens a spare for `provider` after `pause` on the background thread,
// unless spares are off, the provider is shm, or the process already holds
// or awaits kMaxSpares of them (a process that forms two groups at a time,
// its device group beside its own, takes two).
void prepareSpareEndpoint(const std::string& provider, std::chrono::milliseconds pause);

// Spares held, being opened, and waiting for their pause (for tests).
struct SpareCounts {
  int ready = 0;
  int opening = 0;
  int waiting = 0;
  int taken = 0;  // handed out since the process started
};
SpareCounts spareEndpointCounts();

// The pause a formation asks for: long enough that the first steps after
// it (a torchft recovery step) do not share the cores with the opening.
inline constexpr std::chrono::milliseconds kSparePause{1000};

}  // namespace smddp
