// Observability helpers: the latency histograms behind stats()' percentiles
// and the server reduction timer (observe/stats.h), and the SMDDP_TIMELINE
// file naming (observe/timeline.h).
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include "observe/stats.h"
#include "observe/timeline.h"
#include "observe/traffic_observer.h"

using smddp::LatencyHistograms;
using smddp::StatsCounters;
using smddp::TrafficObserver;

TEST_CASE("latency bins are half octaves and hold their values", "[stats]") {
  for (uint64_t ns : {0ull, 1ull, 999ull, 1000ull, 1414ull, 1415ull, 2000ull, 2829ull, 999999ull,
                      1000000ull, 123456789ull}) {
    const int b = LatencyHistograms::bin(ns);
    const double us = ns / 1000.0;
    CHECK(LatencyHistograms::binLowUs(b) <= us);
    CHECK(us < LatencyHistograms::binHighUs(b));
  }
  CHECK(LatencyHistograms::bin(1414) == 1);  // 1.414 us < sqrt(2) us
  CHECK(LatencyHistograms::bin(1415) == 2);
  CHECK(LatencyHistograms::sizeClass(0) == 0);
  CHECK(LatencyHistograms::sizeClass(3) == 0);
  CHECK(LatencyHistograms::sizeClass(4) == 1);
  CHECK(LatencyHistograms::sizeClass(4095) == 5);
  CHECK(LatencyHistograms::sizeClass(4096) == 6);
  CHECK(LatencyHistograms::sizeClass(~0ull) == LatencyHistograms::kSizeClasses - 1);
}

TEST_CASE("percentiles fall in the bin of the true percentile; reset zeroes", "[stats]") {
  LatencyHistograms h;
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> dist(std::log(50000.0), 1.0);  // ns, around 50 us
  std::vector<uint64_t> v;
  for (int i = 0; i < 1000; ++i) {
    v.push_back(static_cast<uint64_t>(dist(rng)));
    h.record(1, 4096, v.back());
  }
  h.record(2, 10, 5000);
  std::sort(v.begin(), v.end());
  auto cells = h.cells();
  REQUIRE(cells.size() == 2);
  const auto& c = cells[0];
  CHECK(c.collective == 1);
  CHECK(c.sizeClass == 6);
  CHECK(c.count == 1000);
  // The q-th value (1-based rank ceil(q n)) lies in the reported bin.
  for (auto [q, got] : {std::pair{0.5, c.p50Us}, std::pair{0.99, c.p99Us}}) {
    const uint64_t truth = v[static_cast<size_t>(std::ceil(q * v.size())) - 1];
    CHECK(LatencyHistograms::bin(truth) ==
          LatencyHistograms::bin(static_cast<uint64_t>(got * 1000)));
  }
  double sum = 0;
  for (uint64_t x : v) sum += x / 1000.0;
  CHECK(c.meanUs == Approx(sum / v.size()).epsilon(1e-9));
  CHECK(cells[1].collective == 2);
  CHECK(cells[1].count == 1);
  h.reset();
  CHECK(h.cells().empty());
}

TEST_CASE("SMDDP_TIMELINE names one file per rank", "[timeline]") {
  using smddp::timeline::pathFor;
  CHECK(pathFor("/tmp/t.json", 3) == "/tmp/t.rank3.json");
  CHECK(pathFor("/tmp/t-{rank}.trace", 1) == "/tmp/t-1.trace");
  CHECK(pathFor("/tmp/t", 0) == "/tmp/t.rank0");
  CHECK_FALSE(smddp::timeline::on());  // unset: nothing records
}

namespace {

// Spins until the steady clock has moved, and returns the nanoseconds it
// saw pass (at least 1): a reduction that surely took time, with no sleep.
uint64_t spinOneTick() {
  const auto a = std::chrono::steady_clock::now();
  auto b = a;
  while (b == a) b = std::chrono::steady_clock::now();
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count());
}

}  // namespace

TEST_CASE("serverReduce adds the reduction's time to serverReduceNs and returns its result",
          "[stats]") {
  StatsCounters c;
  const TrafficObserver t(c);
  uint64_t inner = 0;
  // Its interval holds the reduction's: it adds at least what that saw.
  const int got = t.serverReduce([&] {
    inner = spinOneTick();
    return 7;
  });
  CHECK(got == 7);
  CHECK(inner > 0);
  CHECK(c.serverReduceNs.load() >= inner);
  // A reduction that returns nothing counts too, on top.
  const uint64_t before = c.serverReduceNs.load();
  t.serverReduce([&] { inner = spinOneTick(); });
  CHECK(c.serverReduceNs.load() >= before + inner);
  // One that throws adds nothing, and the error goes through.
  const uint64_t after = c.serverReduceNs.load();
  CHECK_THROWS_WITH(t.serverReduce([]() -> int { throw std::runtime_error("bad scale"); }),
                    "bad scale");
  CHECK(c.serverReduceNs.load() == after);
  // stats() reads it.
  CHECK(c.snapshot().serverReduceNs == after);
}

TEST_CASE("the traffic observer's hooks reach stats() each in its own counter", "[stats]") {
  StatsCounters c;
  const TrafficObserver t(c);
  t.sent(100);
  t.sent(20);
  t.received(7);
  t.sealed(64);
  t.opened(32);
  t.refused();
  t.refused(3);
  t.sendAbandoned(/*held=*/false);
  t.sendAbandoned(/*held=*/true);
  t.sendHeld();
  t.abandonedSendsDone(2);
  t.pairwiseRounds();
  const smddp::Stats s = c.snapshot();
  CHECK(s.bytesSent == 120);
  CHECK(s.bytesReceived == 7);
  CHECK(s.bytesSealed == 64);
  CHECK(s.bytesOpened == 32);
  CHECK(s.framesRejected == 4);
  CHECK(s.abandonedSends == 2);
  CHECK(s.abandonedSendsHeld == 2);
  CHECK(s.abandonedSendsConfirmed == 2);
  CHECK(s.roundsCalls == 1);
  CHECK(s.collectives == 0);  // the call observer's, not touched here
  c.reset();
  CHECK(c.snapshot().bytesSent == 0);
}
