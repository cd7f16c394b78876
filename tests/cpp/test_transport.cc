// The Endpoint (transport/endpoint.h) used directly between two forked
// processes, over shm and tcp;ofi_rxm, posting exactly as the engine does
// (exchange.cc): a header iov plus a payload iov, and on receives a third
// overflow-sink iov. Payloads are a closed-form byte pattern, so a frame
// that lands shifted, short or in the wrong buffer is caught.
//
// Each child owns its Fabric and Endpoint; the parent only forks, waits
// with a hard deadline and reads the children's verdicts ("" = fine).
// Endpoints are never created in the parent or in threads of one process:
// libfabric's shm provider does not support several endpoints tearing down
// inside one address space. Truncation (a receive smaller than its message)
// is not exercised: libfabric 1.17's shm spins forever on a truncated CMA
// transfer, which is why the engine always appends the overflow sink.
#include <catch2/catch.hpp>

#include "transport_harness.h"

using namespace transport_test;

TEST_CASE("two-iov messages from 0 bytes to 8 MiB land in place", "[transport]") {
  const std::string provider = GENERATE(from_range(std::begin(kProviders), std::end(kProviders)));
  // Receives posted first (expected path), or sends first (unexpected
  // messages, and rendezvous for the large ones).
  const bool sendsFirst = GENERATE(false, true);
  const std::vector<size_t> sizes = {0, 1, 7, 72, 4096, 65537, 1 << 20, 8 << 20};
  const uint64_t seq = 11;
  auto sender = [&](Side& s) -> std::string {
    std::vector<std::vector<uint8_t>> payloads;
    for (size_t m = 0; m < sizes.size(); ++m) payloads.push_back(patterned(m, sizes[m]));
    if (!sendsFirst) s.waitFlag("posted");
    for (size_t m = 0; m < sizes.size(); ++m) {
      s.send(s.newOp(), makeTag(TagClass::kData, seq, 0, static_cast<uint32_t>(m)),
             payloads[m].data(), sizes[m], seq, static_cast<uint32_t>(m));
    }
    s.setFlag("sent");
    for (const auto& c : s.wait(sizes.size())) {
      if (c.err != 0) return "send failed: " + c.errText;
    }
    return "";
  };
  auto receiver = [&](Side& s) -> std::string {
    if (sendsFirst) s.waitFlag("sent");
    std::vector<Op*> ops;
    for (size_t m = 0; m < sizes.size(); ++m) {
      ops.push_back(&s.newOp());
      s.recv(*ops.back(), s.peer, makeTag(TagClass::kData, seq, 0, static_cast<uint32_t>(m)), 0,
             sizes[m]);
    }
    s.setFlag("posted");
    for (const auto& c : s.wait(sizes.size())) {
      Op* op = s.opOf(c);
      if (!op || op->done) return "completion for an unknown or finished receive";
      op->done = true;
      size_t m = 0;
      while (m < ops.size() && ops[m] != op) ++m;
      std::string bad = checkArrival(s, c, *op, m, seq);
      if (!bad.empty()) return bad;
    }
    return "";
  };
  auto results = runPair(provider, sender, receiver);
  INFO("provider " << provider << (sendsFirst ? ", sends first" : ", receives first"));
  CHECK(results[0] == "");
  CHECK(results[1] == "");
}

TEST_CASE("receives match by tag and source when messages arrive in reverse order",
          "[transport]") {
  const std::string provider = GENERATE(from_range(std::begin(kProviders), std::end(kProviders)));
  const bool sendsFirst = GENERATE(false, true);
  const uint64_t seq = 7;
  const uint32_t kChunks = 10;
  auto bytesOf = [](uint32_t c) { return size_t{100} * (c + 1) + c; };
  const std::string errorText = "rank 0 gave up";
  auto sender = [&](Side& s) -> std::string {
    std::vector<std::vector<uint8_t>> payloads;
    for (uint32_t c = 0; c < kChunks; ++c) payloads.push_back(patterned(c, bytesOf(c)));
    s.waitFlag(sendsFirst ? "error-posted" : "posted");
    // Opposite order of the receiver's posting, phase 1.
    for (uint32_t c = kChunks; c-- > 0;) {
      s.send(s.newOp(), makeTag(TagClass::kData, seq, 1, c), payloads[c].data(), bytesOf(c), seq,
             c);
    }
    // An error frame for some other sequence, phase and chunk.
    s.send(s.newOp(), makeTag(TagClass::kError, seq + 3, 2, 5), errorText.data(),
           errorText.size(), seq + 3, 0, FrameKind::kError);
    s.setFlag("sent");
    for (const auto& c : s.wait(kChunks + 1)) {
      if (c.err != 0) return "send failed: " + c.errText;
    }
    return "";
  };
  auto receiver = [&](Side& s) -> std::string {
    // The engine's wildcard for error frames, from any source, posted before
    // any traffic as the Communicator does. (libfabric 1.17's shm now and
    // then fails to match a receive with ignore bits against a message that
    // arrived before it was posted, so the test does not rely on that.)
    Op& errorRecv = s.newOp();
    s.recv(errorRecv, FI_ADDR_UNSPEC, makeTag(TagClass::kError, 0, 0, 0), kErrorTagIgnore, 4096);
    s.setFlag("error-posted");
    if (sendsFirst) s.waitFlag("sent");
    // Posted first, for chunk 0's tag, but directed at this process itself:
    // the peer's chunk 0 must not land here.
    Op& selfDirected = s.newOp();
    s.recv(selfDirected, s.self, makeTag(TagClass::kData, seq, 1, 0), 0, bytesOf(0));
    std::vector<Op*> ops;
    for (uint32_t c = 0; c < kChunks; ++c) {
      ops.push_back(&s.newOp());
      s.recv(*ops.back(), s.peer, makeTag(TagClass::kData, seq, 1, c), 0, bytesOf(c));
    }
    s.setFlag("posted");
    for (const auto& c : s.wait(kChunks + 1)) {
      Op* op = s.opOf(c);
      if (!op || op->done) return "completion for an unknown or finished receive";
      if (op == &selfDirected) return "a message from the peer matched a receive directed at self";
      op->done = true;
      if (op == &errorRecv) {
        if (c.err != 0) return "error frame: " + c.errText;
        if (c.tag != makeTag(TagClass::kError, seq + 3, 2, 5)) return "error frame tag wrong";
        if (c.len != kHdr + errorText.size()) return "error frame length wrong";
        if (op->header.kind != static_cast<uint8_t>(FrameKind::kError)) return "not an error frame";
        if (std::string(op->payload.begin(), op->payload.begin() + errorText.size()) != errorText) {
          return "error text garbled";
        }
        continue;
      }
      uint32_t m = 0;
      while (m < kChunks && ops[m] != op) ++m;
      std::string bad = checkArrival(s, c, *op, m, seq);
      if (!bad.empty()) return bad;
    }
    // The self-directed receive is still posted: cancel it.
    s.cancel(selfDirected);
    auto rest = s.wait(1);
    if (s.opOf(rest[0]) != &selfDirected) return "cancel completed another operation";
    if (rest[0].err != FI_ECANCELED) {
      return "cancelled receive completed with err " + std::to_string(rest[0].err);
    }
    if (selfDirected.payload[0] != kUntouched) return "the self-directed buffer was written";
    return "";
  };
  auto results = runPair(provider, sender, receiver);
  INFO("provider " << provider << (sendsFirst ? ", sends first" : ", receives first"));
  CHECK(results[0] == "");
  CHECK(results[1] == "");
}
