// Spare endpoints (transport/spare_endpoints.h): opened and warmed by the
// reserve's thread, handed out once, and then as good as a fresh endpoint.
// The reserve is one per process, so every case runs in forked children
// (runPair, or inChild below), never in the test runner itself.
#include <catch2/catch.hpp>

#include <cstdlib>

#include "transport_harness.h"

using namespace transport_test;

namespace {

const std::string kTcp = "tcp;ofi_rxm";

// Waits until the reserve holds `ready` spares; false after `limit`.
bool waitReady(int ready, milliseconds limit = milliseconds(10000)) {
  const auto deadline = Clock::now() + limit;
  while (spareEndpointCounts().ready != ready) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(2));
  }
  return true;
}

// Runs `fn` in a forked child under the hard deadline; its verdict. The
// child ends with exit(), not _exit(): the reserve's exit handler must stop
// its thread and close the spares without a crash (the status says).
std::string inChild(const std::function<std::string()>& fn) {
  return smddp::test::runChildren(
      1, [&](int, const std::string&) { return fn(); }, kHardDeadline,
      smddp::test::ChildExit::kExitHandlers)[0];
}

// Each side posts receives for the other's messages, then sends its own:
// 0 B to 8 MiB, a closed-form pattern per message.
std::string exchange(Side& s) {
  // A spare's AV is a fresh one's: its warm-up took its own address out
  // again, so the group's addresses get the indices they always did.
  if (s.peer != 0 || s.self != 1) {
    return "the AV gave the peer " + std::to_string(s.peer) + " and this side " +
           std::to_string(s.self) + ", not 0 and 1";
  }
  const std::vector<size_t> sizes = {0, 1, 72, 65537, 1 << 20, 8 << 20};
  const uint64_t seq = 5;
  std::vector<Op*> recvs;
  for (size_t m = 0; m < sizes.size(); ++m) {
    recvs.push_back(&s.newOp());
    s.recv(*recvs.back(), s.peer, makeTag(TagClass::kData, seq, 0, static_cast<uint32_t>(m)), 0,
           sizes[m]);
  }
  s.barrier("posted");
  std::vector<std::vector<uint8_t>> payloads;
  for (size_t m = 0; m < sizes.size(); ++m) payloads.push_back(patterned(m, sizes[m]));
  for (size_t m = 0; m < sizes.size(); ++m) {
    s.send(s.newOp(), makeTag(TagClass::kData, seq, 0, static_cast<uint32_t>(m)),
           payloads[m].data(), sizes[m], seq, static_cast<uint32_t>(m));
  }
  for (const auto& c : s.wait(2 * sizes.size())) {
    if (c.err != 0) return "a completion failed: " + c.errText;
    Op* op = s.opOf(c);
    size_t m = 0;
    while (m < recvs.size() && recvs[m] != op) ++m;
    if (m == recvs.size()) continue;  // one of our sends
    std::string bad = checkArrival(s, c, *op, m, seq);
    if (!bad.empty()) return bad;
  }
  return "";
}

}  // namespace

TEST_CASE("a spare endpoint from the reserve carries messages both ways like a fresh one",
          "[transport][spare]") {
  // Rank 0 on a spare and rank 1 on a fresh endpoint, or both on spares.
  const bool bothSpare = GENERATE(false, true);
  auto open = [bothSpare](const std::string& provider, int rank) {
    if (rank == 1 && !bothSpare) return openFreshEndpoint(provider);
    prepareSpareEndpoint(provider, milliseconds(0));
    if (!waitReady(1)) throw std::runtime_error("no spare within 10 s");
    OpenedEndpoint spare = takeSpareEndpoint(provider);
    if (!spare.endpoint) throw std::runtime_error("a ready spare was not handed out");
    if (spareEndpointCounts().ready != 0) throw std::runtime_error("the spare is still held");
    if (takeSpareEndpoint(provider).endpoint) throw std::runtime_error("handed out twice");
    return spare;
  };
  auto results = runPair(kTcp, exchange, exchange, open);
  INFO((bothSpare ? "both on spares" : "rank 0 on a spare, rank 1 fresh"));
  CHECK(results[0] == "");
  CHECK(results[1] == "");
}

TEST_CASE("the reserve: its pause, a take that cancels a pending spare, two at most, none "
          "for shm or when turned off",
          "[transport][spare]") {
  SECTION("a spare waits out its pause; a take during it gets none and cancels it") {
    CHECK(inChild([] {
            prepareSpareEndpoint(kTcp, milliseconds(300));
            auto c = spareEndpointCounts();
            if (c.waiting != 1 || c.ready != 0) return std::string("not waiting for its pause");
            if (waitReady(1, milliseconds(100))) return std::string("ready before its pause");
            if (takeSpareEndpoint(kTcp).endpoint) return std::string("handed out before ready");
            c = spareEndpointCounts();
            if (c.waiting != 0) return std::string("the take left the pending spare");
            std::this_thread::sleep_for(milliseconds(500));
            c = spareEndpointCounts();
            if (c.ready + c.opening + c.waiting != 0) return std::string("opened after all");
            return std::string();
          }) == "");
  }
  SECTION("at most two, ready after the pause, then handed out one by one") {
    CHECK(inChild([] {
            for (int i = 0; i < 4; ++i) prepareSpareEndpoint(kTcp, milliseconds(0));
            if (!waitReady(2)) return std::string("two spares were not ready");
            auto c = spareEndpointCounts();
            if (c.opening + c.waiting != 0) return std::string("more than two asked for");
            auto a = takeSpareEndpoint(kTcp), b = takeSpareEndpoint(kTcp);
            if (!a.endpoint || !b.endpoint) return std::string("not handed out");
            if (a.endpoint->name() == b.endpoint->name()) return std::string("one endpoint twice");
            if (takeSpareEndpoint(kTcp).endpoint) return std::string("a third");
            return std::string();  // the exit handler closes nothing: both were taken
          }) == "");
  }
  SECTION("held at exit: the exit handler closes it") {
    CHECK(inChild([] {
            prepareSpareEndpoint(kTcp, milliseconds(0));
            if (!waitReady(1)) return std::string("no spare");
            prepareSpareEndpoint(kTcp, milliseconds(0));  // exits while this one opens
            return std::string();
          }) == "");
  }
  SECTION("none for shm, and none with SMDDP_SPARE_ENDPOINT=0") {
    CHECK(inChild([] {
            prepareSpareEndpoint("shm", milliseconds(0));
            auto c = spareEndpointCounts();
            if (c.ready + c.opening + c.waiting != 0) return std::string("shm got a spare");
            setenv("SMDDP_SPARE_ENDPOINT", "0", 1);
            prepareSpareEndpoint(kTcp, milliseconds(0));
            std::this_thread::sleep_for(milliseconds(100));
            c = spareEndpointCounts();
            if (c.ready + c.opening + c.waiting != 0) return std::string("a spare while off");
            return std::string();
          }) == "");
  }
}
