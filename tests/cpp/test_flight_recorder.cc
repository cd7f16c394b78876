// The flight recorder and the desync report: the ring's contents and each
// rank's position against what was called, the report's text against a
// closed form, the store exchange among threads, and a real timeout whose
// error names the rank that is behind.
#include <catch2/catch.hpp>

#include <thread>

#include "common/error.h"
#include "observe/desync.h"
#include "observe/flight_recorder.h"
#include "world.h"

using namespace smddp;
using namespace smddp::test;

namespace {

std::chrono::steady_clock::time_point now() { return std::chrono::steady_clock::now(); }

CollectiveSignature allreduceOf(uint64_t numel) {
  return CollectiveSignature{CollectiveType::kAllreduce, DataType::kFloat32, ReduceOp::kSum, numel,
                             -1};
}

}  // namespace

TEST_CASE("flight recorder keeps the last calls in order with their states", "[flight]") {
  FlightRecorder rec("g", 0, 2, 4);
  const auto sig = allreduceOf(100);
  for (uint64_t s = 0; s < 10; ++s) rec.queued(s, &sig, now());
  for (uint64_t s = 0; s < 7; ++s) {
    rec.started(s, CallPath::kSharedMemory, s - s % 2, false, now());
    std::string err = "boom\nsecond line";
    rec.ended(s, s == 6 ? &err : nullptr, 2, now());
  }
  rec.started(7, CallPath::kNetwork, 7, true, now());
  auto es = rec.entries();
  REQUIRE(es.size() == 4);  // the ring holds 4: sequences 6..9
  CHECK(es[0].seq == 6);
  CHECK(es[0].state == CallState::kFailed);
  CHECK(es[0].error == "boom");  // first line only
  CHECK(es[0].batch == 6);
  CHECK(es[0].batchCalls == 2);
  CHECK(es[1].seq == 7);
  CHECK(es[1].state == CallState::kStarted);
  CHECK(es[1].onCaller);
  CHECK(es[1].path == CallPath::kNetwork);
  CHECK(es[2].state == CallState::kQueued);
  CHECK(es[3].seq == 9);
  CHECK(es[3].bytes() == 400);
  CHECK(es[3].describe() == "allreduce(SUM, float32, 100 elements)");
  // Timestamps never go backwards within an entry.
  CHECK(es[0].queuedNs <= es[0].startedNs);
  CHECK(es[0].startedNs <= es[0].endedNs);

  RankPosition p = rec.position();  // the oldest unfinished call
  CHECK(p.kind == RankPosition::Kind::kKnown);
  CHECK(!p.idle);
  CHECK(p.seq == 7);
  CHECK(p.state == "started");
  for (uint64_t s = 7; s < 10; ++s) rec.ended(s, nullptr, 1, now());
  p = rec.position();  // every call done: the last one
  CHECK(p.idle);
  CHECK(p.seq == 9);
  CHECK(p.state == "completed");

  FlightRecorder empty("g", 1, 2, 4);
  CHECK(!empty.position().any);
}

TEST_CASE("a position survives the store", "[flight]") {
  RankPosition p;
  p.rank = 3;
  p.kind = RankPosition::Kind::kKnown;
  p.any = true;
  p.seq = 41;
  p.bytes = 2100000;
  p.state = "issued, not started";
  p.call = "allreduce(SUM, float32, 525000 elements)";
  RankPosition q = RankPosition::parse(3, p.serialize());
  CHECK(q.kind == p.kind);
  CHECK(q.seq == 41);
  CHECK(q.bytes == p.bytes);
  CHECK(q.state == p.state);
  CHECK(q.call == p.call);
  CHECK(RankPosition::parse(2, "garbage").kind == RankPosition::Kind::kUnreachable);
  CHECK(RankPosition::parse(2, "v1\nx\n0\n0\n0\n0\n\n").kind == RankPosition::Kind::kUnreachable);
}

TEST_CASE("the desync report names who is behind, on which call", "[flight]") {
  auto at = [](int rank, uint64_t seq, const char* state, const char* call, uint64_t bytes) {
    RankPosition p;
    p.rank = rank;
    p.kind = RankPosition::Kind::kKnown;
    p.any = true;
    p.seq = seq;
    p.state = state;
    p.call = call;
    p.bytes = bytes;
    return p;
  };
  std::vector<RankPosition> ps;
  for (int r = 0; r < 3; ++r) ps.push_back(at(r, 42, "started", "broadcast(float32, 1 elements, root 0)", 4));
  ps.push_back(at(3, 41, "issued, not started", "allreduce(SUM, float32, 525000 elements)", 2100000));
  RankPosition idle = at(4, 40, "completed", "barrier", 0);
  idle.idle = true;
  ps.push_back(idle);
  RankPosition lost;
  lost.rank = 5;
  lost.kind = RankPosition::Kind::kLost;
  ps.push_back(lost);
  RankPosition gone;
  gone.rank = 6;
  gone.kind = RankPosition::Kind::kUnreachable;
  ps.push_back(gone);
  CHECK(formatDesyncReport(ps) ==
        "rank 4 has finished sequence 40 (barrier, 0 B, completed) and issued nothing after it; "
        "rank 3 is at sequence 41 (allreduce(SUM, float32, 525000 elements), 2.1 MB, issued, not "
        "started); ranks 0-2 wait at sequence 42 (broadcast(float32, 1 elements, root 0), 4 B, "
        "started); rank 6 could not be reached; rank 5 is lost (process died or host silent)");
  CHECK(humanBytes(999) == "999 B");
  CHECK(humanBytes(1500) == "1.5 kB");
}

TEST_CASE("ranks answer a desync request through the store", "[flight]") {
  InMemoryBootstrap store;
  const auto sig = allreduceOf(10);
  std::vector<std::shared_ptr<FlightRecorder>> recs;
  for (int r = 0; r < 4; ++r) recs.push_back(std::make_shared<FlightRecorder>("g", r, 4, 8));
  // Ranks 0 and 1 wait in call 1; rank 2 finished call 0 and called nothing
  // since; rank 3 keeps no responder (a process that hangs: unreachable).
  for (int r = 0; r < 3; ++r) {
    recs[r]->queued(0, &sig, now());
    recs[r]->started(0, CallPath::kSharedMemory, 0, false, now());
    recs[r]->ended(0, nullptr, 1, now());
  }
  for (int r = 0; r < 2; ++r) {
    recs[r]->queued(1, &sig, now());
    recs[r]->started(1, CallPath::kSharedMemory, 1, false, now());
  }
  std::vector<std::unique_ptr<DesyncResponder>> rs;
  for (int r = 0; r < 3; ++r) {
    rs.push_back(std::make_unique<DesyncResponder>(store.clone(), store.clone(), "p/", recs[r]));
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::string report = rs[0]->collect(std::chrono::milliseconds(600),
                                      [](int r) { return false; }, "test");
  const auto took = std::chrono::steady_clock::now() - t0;
  CHECK(report ==
        "rank 2 has finished sequence 0 (allreduce(SUM, float32, 10 elements), 40 B, completed) "
        "and issued nothing after it; ranks 0-1 wait at sequence 1 (allreduce(SUM, float32, 10 "
        "elements), 40 B, started); rank 3 could not be reached");
  CHECK(took < std::chrono::milliseconds(1500));
  // A rank known to be lost is not asked.
  report = rs[1]->collect(std::chrono::milliseconds(300), [](int r) { return r == 3; }, "again");
  CHECK(report.find("rank 3 is lost") != std::string::npos);
  rs.clear();  // responders stop promptly
}

TEST_CASE("a timeout's error carries the desync report", "[flight][errors]") {
  ScopedEnv env("SMDDP_FI_PROVIDER", "shm");
  auto results = runWorld(3, [](Communicator& comm) -> std::string {
    std::vector<float> v(10, 1.0f);
    comm.allreduceSync({{v.data(), v.size()}}, DataType::kFloat32, ReduceOp::kSum);  // seq 0
    if (comm.rank() == 2) {
      // Never makes call 1, but stays alive to answer.
      std::this_thread::sleep_for(std::chrono::milliseconds(5000));
      return "";
    }
    try {
      comm.allreduceSync({{v.data(), v.size()}}, DataType::kFloat32, ReduceOp::kSum);  // seq 1
    } catch (const Error& e) {
      return e.what();  // its own timeout, or the first rank's that reached it
    }
    return "no error";
  }, std::chrono::milliseconds(1000));
  for (int r = 0; r < 2; ++r) {
    INFO(results[r]);
    CHECK(results[r].find("timed out") != std::string::npos);
    CHECK(results[r].find("Desync report: rank 2 has finished sequence 0 (allreduce(SUM, "
                          "float32, 10 elements), 40 B, completed) and issued nothing after "
                          "it") != std::string::npos);
    CHECK(results[r].find("at sequence 1 (allreduce(SUM, float32, 10 elements)") !=
          std::string::npos);
  }
  CHECK(results[2] == "");
}
