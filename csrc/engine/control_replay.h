// Which control frames a rank has already taken from each peer. A control
// frame's MAC (transport/frame.h) proves its pair, direction, kind and
// call, not when it was sent, so whoever writes into the wire can send a
// captured one again on its own link. The control plane asks this guard
// before it acts on a frame whose MAC verified, and refuses a copy.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "transport/frame.h"

namespace smddp {

// Worker thread only, like the control plane that owns it.
class ControlReplayGuard {
 public:
  // Senders are ranks 0 .. world - 1 (the MAC proved h.srcRank is one).
  void resize(int world) { senders_.assign(static_cast<size_t>(world), Sender{}); }

  // Whether to act on `h` (its MAC verified) now that every call before
  // `ended` has ended here (ControlPlane::noteSignature). False, with *why,
  // for:
  //   - an error frame already taken from that sender (same call, same
  //     "broken" flag): a copy;
  //   - an error frame about calls that have all ended here (its "broken"
  //     flag unset): a copy of an old report, or one too late to fail
  //     anything, which would otherwise sit among the held reports and,
  //     with enough such copies, push out a real one
  //     (kMaxHeldControlSequences). A "broken" report is idempotent (the
  //     first one breaks the group) and is never refused as old;
  //   - a second greeting (a leave notice for no call) from one rank, which
  //     would count that rank twice towards greetHost's quorum.
  // A probe is always taken: a copy earns at most one reply, and a copy of
  // a leave notice changes nothing (the first one holds the slot).
  bool take(const FrameHeader& h, uint64_t ended, std::string* why);

 private:
  struct Sender {
    std::set<std::pair<uint64_t, uint32_t>> errors;  // (seq, chunk) taken
    bool greeted = false;
  };
  std::vector<Sender> senders_;

  bool takeError(Sender& s, const FrameHeader& h, uint64_t ended, std::string* why);
};

}  // namespace smddp
