// Refusing copies of control frames already taken (control_replay.h).
#include "engine/control_replay.h"

#include <algorithm>
#include <iterator>

#include "engine/allreduce_path.h"  // kMaxFusedCalls

namespace smddp {

namespace {

// A leave notice with this sequence is a greeting (ControlPlane::greetHost).
constexpr uint64_t kGreeting = UINT64_MAX;

}  // namespace

bool ControlReplayGuard::take(const FrameHeader& h, uint64_t ended, std::string* why) {
  if (h.srcRank >= senders_.size()) return true;  // the MAC check refuses these first
  Sender& s = senders_[h.srcRank];
  const auto kind = static_cast<FrameKind>(h.kind);
  if (kind == FrameKind::kError) return takeError(s, h, ended, why);
  if (kind == FrameKind::kLeave && h.seq == kGreeting) {
    if (s.greeted) {
      *why = "a second greeting from rank " + std::to_string(h.srcRank) + ": a replayed copy";
      return false;
    }
    s.greeted = true;
  }
  return true;
}

bool ControlReplayGuard::takeError(Sender& s, const FrameHeader& h, uint64_t ended,
                                   std::string* why) {
  const bool broken = h.chunk == kErrorBroken;
  // The calls a report covers (a fused batch fails as a whole): at most
  // kMaxFusedCalls from its sequence on. A report that starts that far
  // before `ended` is about ended calls only: the rule below refuses its
  // copies, so it need not be remembered.
  const uint64_t count = std::clamp<uint64_t>(h.offset, 1, kMaxFusedCalls);
  while (!s.errors.empty() && s.errors.begin()->first + kMaxFusedCalls <= ended) {
    s.errors.erase(s.errors.begin());
  }
  if (!broken && h.seq + count - 1 < ended) {
    *why = "an error report from rank " + std::to_string(h.srcRank) + " about call " +
           std::to_string(h.seq) + ", which has ended here (every call before " +
           std::to_string(ended) + " has): a replayed copy or a stale report";
    return false;
  }
  if (!s.errors.emplace(h.seq, h.chunk).second) {
    *why = "a second copy of rank " + std::to_string(h.srcRank) + "'s error report about call " +
           std::to_string(h.seq) + ": a replay";
    return false;
  }
  // Bounded like the held reports: the farthest go first (a real report
  // is about this rank's current call, the nearest).
  while (s.errors.size() > kMaxHeldControlSequences) s.errors.erase(std::prev(s.errors.end()));
  return true;
}

}  // namespace smddp
