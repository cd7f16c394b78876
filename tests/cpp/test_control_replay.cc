// Copies of control frames sent again on their own link (engine/
// control_replay.h): the MAC of a copy verifies, so only the receiver's
// memory of what it took can refuse it. Oracle: each real frame is taken
// exactly once; every copy is refused, naming the sender and the call.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>

#include "engine/control_replay.h"
#include "transport/frame.h"

namespace {

using namespace smddp;

constexpr uint64_t kSecret = 0x5eed;

FrameHeader errorFrame(uint64_t seq, uint32_t from, uint64_t count, bool broken = false) {
  return makeHeader(FrameKind::kError, kSecret, seq, from, broken ? kErrorBroken : 0, count, 16,
                    CollectiveSignature{});
}

FrameHeader greeting(uint32_t from) {
  return makeHeader(FrameKind::kLeave, kSecret, UINT64_MAX, from, 0, 0, 0, CollectiveSignature{});
}

}  // namespace

TEST_CASE("an error frame is taken once; its copy on the same link is refused") {
  ControlReplayGuard guard;
  guard.resize(4);
  std::string why;
  const FrameHeader e = errorFrame(7, 2, 1);
  CHECK(guard.take(e, 7, &why));  // this rank is in call 7: the real report
  CHECK_FALSE(guard.take(e, 7, &why));
  CHECK(why.find("rank 2") != std::string::npos);
  CHECK(why.find("call 7") != std::string::npos);
  // The same call reported by another rank, or as "broken" by the same
  // rank, is another frame.
  CHECK(guard.take(errorFrame(7, 1, 1), 7, &why));
  CHECK(guard.take(errorFrame(7, 2, 0, true), 7, &why));
  CHECK_FALSE(guard.take(errorFrame(7, 2, 0, true), 7, &why));
}

TEST_CASE("an error report about calls that have all ended is refused; a batch's is not") {
  ControlReplayGuard guard;
  guard.resize(2);
  std::string why;
  // A copy captured at call 7 and sent again once call 7 has ended here.
  CHECK_FALSE(guard.take(errorFrame(7, 1, 1), 8, &why));
  CHECK(why.find("call 7") != std::string::npos);
  // A fused batch's report (calls 5..9) still covers unfinished call 8.
  CHECK(guard.take(errorFrame(5, 1, 5), 8, &why));
  CHECK_FALSE(guard.take(errorFrame(5, 1, 5), 8, &why));
  // "Broken" is never refused as old (the first one breaks the group).
  CHECK(guard.take(errorFrame(3, 1, 0, true), 8, &why));
}

TEST_CASE("a copy of an old report is refused long after it was forgotten") {
  ControlReplayGuard guard;
  guard.resize(2);
  std::string why;
  CHECK(guard.take(errorFrame(10, 1, 1), 10, &why));
  // Many calls later the guard no longer remembers it, and needs not to.
  CHECK(guard.take(errorFrame(5000, 1, 1), 5000, &why));
  CHECK_FALSE(guard.take(errorFrame(10, 1, 1), 5000, &why));
}

TEST_CASE("a greeting counts once per rank") {
  ControlReplayGuard guard;
  guard.resize(3);
  std::string why;
  CHECK(guard.take(greeting(1), 0, &why));
  CHECK_FALSE(guard.take(greeting(1), 0, &why));
  CHECK(why.find("rank 1") != std::string::npos);
  CHECK(guard.take(greeting(2), 0, &why));
  // A leave notice for a call and a probe are not refused here: a copy of
  // either changes nothing the first one did not.
  const FrameHeader leave = makeHeader(FrameKind::kLeave, kSecret, 9, 1, 0, 0, 0,
                                       CollectiveSignature{});
  CHECK(guard.take(leave, 0, &why));
  CHECK(guard.take(leave, 0, &why));
}
