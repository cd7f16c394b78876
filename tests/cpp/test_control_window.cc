// Error reports from a member of the group, correctly MACed under its pair
// key, about calls far ahead of the receiver's (engine/control_frames.h:
// kControlSequenceWindow), or about more calls than the receiver holds
// (kMaxHeldControlSequences). A holder of the group's keys could otherwise
// grow the receiver's held reports without bound. Oracle: the receiver's
// own count of refused frames (stats' frames_rejected), which the sender's
// script fixes exactly: the far report, and the reports past the held
// bound (the farthest go), and the nearest report still held.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <future>
#include <string>
#include <thread>

#include "algorithms/collective_calls.h"
#include "engine/communicator.h"
#include "transport/frame.h"
#include "world.h"

namespace {

using namespace smddp;
using smddp::test::barrierSync;
using smddp::test::runWorld;

// Past the barriers (sequences 0 to 2), inside the window.
constexpr uint64_t kFirstNear = 10;
constexpr uint64_t kNear = kMaxHeldControlSequences + 200;
constexpr uint64_t kFar = kFirstNear + kControlSequenceWindow + 100;

}  // namespace

TEST_CASE("a member's MACed error reports far ahead are dropped, and held ones stay bounded",
          "[control]") {
  auto results = runWorld(2, [](Communicator& comm) -> std::string {
    // This thread drives the endpoint itself: the idle engine keeps off it.
    const Communicator::EndpointHold hold(comm);
    ControlPlane& control = comm.context().control();
    if (comm.rank() == 1) {
      // Nothing is queued here, so this thread may use the endpoint.
      control.broadcastError(kFar, "test: far ahead", 1, false);
      std::string err = barrierSync(comm);       // sequence 0
      if (err.empty()) err = barrierSync(comm);  // 1: rank 0 has counted the far one
      if (!err.empty()) return err;
      for (uint64_t s = 0; s < kNear; ++s) {
        control.broadcastError(kFirstNear + s, "test: near", 1, false);
      }
      return barrierSync(comm);  // 2: rank 0 has counted the rest
    }
    // Polls until frames_rejected reaches `want` (15 s at most), then a
    // little longer for anything still on its way; returns "" or why not.
    auto countReaches = [&comm](uint64_t want, const std::string& what) -> std::string {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
      while (comm.stats().framesRejected < want && std::chrono::steady_clock::now() < until) {
        if (comm.context().progress() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      for (int i = 0; i < 200; ++i) {
        if (comm.context().progress() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      const uint64_t got = comm.stats().framesRejected;
      if (got == want) return "";
      return "frames_rejected is " + std::to_string(got) + ", want " + std::to_string(want) +
             " (" + what + ")";
    };
    std::string err = barrierSync(comm);
    if (!err.empty()) return "first barrier: " + err;
    err = countReaches(1, "the far report");
    if (!err.empty()) return err;
    err = barrierSync(comm);
    if (!err.empty()) return "second barrier: " + err;
    err = countReaches(1 + (kNear - kMaxHeldControlSequences),
                       "the far report and the " +
                           std::to_string(kNear - kMaxHeldControlSequences) +
                           " past the held bound");
    if (!err.empty()) return err;
    std::string text;
    ErrorKind kind = ErrorKind::kInternal;
    if (!control.remoteErrorFor(kFirstNear, &text, &kind) ||
        text.find("test: near") == std::string::npos) {
      return "the nearest report is not held: '" + text + "'";
    }
    err = barrierSync(comm);
    return err.empty() ? "" : "third barrier: " + err;
  });
  for (size_t r = 0; r < results.size(); ++r) {
    INFO("rank " << r);
    CHECK(results[r] == "");
  }
}
