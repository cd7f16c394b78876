// Call order through the fusion scheduler: allreduces whose buffers overlap
// must give what running them one after another gives (closed forms), on
// one host and across pretend hosts, even when only one rank overlaps.
// And f16/bf16 across pretend hosts: accumulated in f32 over every rank and
// rounded once, against an f32 oracle, on both allreduce paths.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/communicator.h"
#include "reduce_reference.h"
#include "world.h"

using namespace smddp;
using smddp::test::runWorld;
using smddp::test::ScopedEnv;
using smddp::test::fusesOnNetwork;
using smddp::test::usesHostPath;
using namespace reduce_ref;

namespace {

// Async calls whose completions are counted; the first error is kept.
struct Pending {
  std::atomic<int> issued{0};
  std::atomic<int> done{0};
  std::mutex mu;
  std::string error;  // guarded by mu
  Communicator::Done callback() {
    ++issued;
    return [this](std::exception_ptr e) {
      if (e) {
        std::lock_guard<std::mutex> lock(mu);
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& ex) {
          if (error.empty()) error = ex.what();
        }
      }
      ++done;
    };
  }
  std::string wait() {
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (done.load() < issued.load() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (done.load() < issued.load()) return "only " + std::to_string(done.load()) + " calls done";
    std::lock_guard<std::mutex> lock(mu);
    return error.empty() ? "" : "a call failed: " + error;
  }
};

std::string compare(const char* what, const std::vector<float>& got, size_t j, double want) {
  if (got[j] == static_cast<float>(want)) return "";
  return std::string(what) + "[" + std::to_string(j) + "] = " + std::to_string(got[j]) +
         ", sequential order gives " + std::to_string(want);
}

// Each round queues its calls behind a large allreduce, so the leader finds
// them all queued and would fuse them into one batch.
std::string overlappingCallsJob(Communicator& comm) {
  const int r = comm.rank();
  const int n = comm.size();
  const size_t N = 1000;
  for (int round = 0; round < 3; ++round) {
    Pending pending;
    std::vector<float> big(1 << 20, 1.0f);
    comm.allreduce({{big.data(), big.size()}}, DataType::kFloat32, ReduceOp::kSum,
                   pending.callback());
    // (a) One buffer, three calls: Σ, then n·Σ, then n²·Σ.
    std::vector<float> same(N);
    for (size_t j = 0; j < N; ++j) same[j] = static_cast<float>(j % 7 + r + 1);
    for (int k = 0; k < 3; ++k) {
      comm.allreduce({{same.data(), N}}, DataType::kFloat32, ReduceOp::kSum, pending.callback());
    }
    // (b) Two views of one storage, X[0:600) then X[400:1000): the overlap
    // [400, 600) is reduced twice (n·Σ), the rest once.
    std::vector<float> x(N);
    for (size_t j = 0; j < N; ++j) x[j] = static_cast<float>(j % 5 + r);
    comm.allreduce({{x.data(), 600}}, DataType::kFloat32, ReduceOp::kSum, pending.callback());
    comm.allreduce({{x.data() + 400, 600}}, DataType::kFloat32, ReduceOp::kSum,
                   pending.callback());
    // (c) Only rank 1 reuses its buffer; the others use three fresh ones.
    // Call k on rank 1 reads call k-1's result, so every rank's call k
    // gets Σ + (k-1)·Σ_{q≠1} v_q.
    std::vector<std::vector<float>> mine(3, std::vector<float>(N));
    for (int k = 0; k < 3; ++k) {
      std::vector<float>& buf = r == 1 ? mine[0] : mine[k];
      if (r != 1 || k == 0) {
        for (size_t j = 0; j < N; ++j) buf[j] = static_cast<float>(j % 3 + r + 1);
      }
      comm.allreduce({{buf.data(), N}}, DataType::kFloat32, ReduceOp::kSum, pending.callback());
    }
    std::string err = pending.wait();
    if (!err.empty()) return err;
    for (size_t j = 0; j < N; ++j) {
      double sigmaA = n * double(j % 7) + n * (n + 1) / 2.0;
      double sigmaB = n * double(j % 5) + n * (n - 1) / 2.0;
      double sigmaC = n * double(j % 3) + n * (n + 1) / 2.0;
      double othersC = sigmaC - double(j % 3 + 2);  // Σ over ranks q ≠ 1
      std::string e = compare("same", same, j, double(n) * n * sigmaA);
      if (e.empty()) e = compare("views", x, j, j >= 400 && j < 600 ? n * sigmaB : sigmaB);
      for (int k = 0; k < 3 && e.empty(); ++k) {
        if (r == 1 && k < 2) continue;
        e = compare("one rank reuses", mine[r == 1 ? 0 : k], j, sigmaC + k * othersC);
      }
      if (!e.empty()) return "rank " + std::to_string(r) + " round " + std::to_string(round) +
                             ": " + e;
    }
  }
  return "";
}

}  // namespace

TEST_CASE("allreduces whose buffers overlap keep call order when queued together",
          "[fusion][order]") {
  auto results = runWorld(2, overlappingCallsJob);
  for (const auto& r : results) CHECK(r == "");
}

TEST_CASE("overlapping allreduces keep call order across pretend hosts",
          "[fusion][order][hosts]") {
  auto results = runWorld(4, overlappingCallsJob, std::chrono::milliseconds(30000),
                          std::chrono::seconds(90), [](int r) {
                            setenv("SMDDP_HOST_ID", r < 2 ? "hostA" : "hostB", 1);
                          });
  for (const auto& r : results) CHECK(r == "");
}

namespace {

// Rank r's element j: a random f16 (exponent 2^-2..2^9) or bf16 (2^-3..2^7)
// of random sign. Sums of four such values are exact in f32, so the oracle
// does not depend on how the f32 additions are grouped.
uint16_t halfInput(DataType dt, int r, size_t j) {
  // A splitmix64 stream per (rank, element): cheap to start, unlike an
  // mt19937 seeded per element, which made this test take minutes under
  // ASan (the oracle asks for every input a dozen times).
  uint64_t state = j * 131 + static_cast<uint64_t>(r) * 7 + 1;
  auto rng = [&state]() -> uint32_t {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return static_cast<uint32_t>((z ^ (z >> 31)) >> 32);
  };
  const uint32_t sign = rng() & 1u;
  if (dt == DataType::kFloat16) {
    return static_cast<uint16_t>(sign << 15 | (13 + rng() % 12) << 10 | (rng() & 0x3ffu));
  }
  return static_cast<uint16_t>(sign << 15 | (124 + rng() % 11) << 7 | (rng() & 0x7fu));
}

float decodeHalf(DataType dt, uint16_t b) {
  return dt == DataType::kFloat16 ? refHalfToFloat(b) : refBf16ToFloat(b);
}
uint16_t encodeHalf(DataType dt, float f) {
  return dt == DataType::kFloat16 ? refFloatToHalf(f) : refFloatToBf16(f);
}

// The oracle: the f32 sum over ranks in rank order, divided for AVG, and
// rounded once.
uint16_t roundedOnce(DataType dt, ReduceOp op, int n, size_t j) {
  float sum = 0.0f;
  for (int r = 0; r < n; ++r) sum += decodeHalf(dt, halfInput(dt, r, j));
  if (op == ReduceOp::kAvg) sum /= static_cast<float>(n);
  return encodeHalf(dt, sum);
}

// What rounding each host's partial before the hosts combine would give
// (hosts of two consecutive ranks); the test only means something where
// this differs from the oracle.
uint16_t roundedPerHost(DataType dt, ReduceOp op, int n, size_t j) {
  float total = 0.0f;
  for (int h = 0; h < n / 2; ++h) {
    float part = decodeHalf(dt, halfInput(dt, 2 * h, j)) + decodeHalf(dt, halfInput(dt, 2 * h + 1, j));
    total += decodeHalf(dt, encodeHalf(dt, part));
  }
  if (op == ReduceOp::kAvg) total /= static_cast<float>(n);
  return encodeHalf(dt, total);
}

std::string halfAcrossHostsJob(Communicator& comm) {
  const size_t N = 50000;  // several pipeline steps and both shards
  const int n = comm.size();
  for (DataType dt : {DataType::kFloat16, DataType::kBFloat16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      std::vector<uint16_t> v(N);
      for (size_t j = 0; j < N; ++j) v[j] = halfInput(dt, comm.rank(), j);
      comm.allreduceSync({{v.data(), N}}, dt, op);
      size_t doubleRoundingDiffers = 0;
      for (size_t j = 0; j < N; ++j) {
        const uint16_t want = roundedOnce(dt, op, n, j);
        if (roundedPerHost(dt, op, n, j) != want) ++doubleRoundingDiffers;
        if (v[j] != want) {
          char text[160];
          std::snprintf(text, sizeof(text),
                        "%s %s element %zu = 0x%04x, rounded once: 0x%04x (rounding per host "
                        "gives 0x%04x)",
                        toString(dt), toString(op), j, v[j], want, roundedPerHost(dt, op, n, j));
          return text;
        }
      }
      if (doubleRoundingDiffers == 0) return "the inputs never tell the roundings apart";
    }
  }
  return "";
}

}  // namespace

TEST_CASE("f16/bf16 across pretend hosts accumulate in f32 and round once",
          "[fusion][hosts][half]") {
  for (bool hostPath : {true, false}) {
    ScopedEnv path("SMDDP_SHM_ALLREDUCE", hostPath ? "1" : "0");
    auto results = runWorld(4, [hostPath](Communicator& comm) -> std::string {
      if (usesHostPath(comm) != hostPath) return "wrong allreduce path";
      return halfAcrossHostsJob(comm);
    }, std::chrono::milliseconds(30000), std::chrono::seconds(90), [](int r) {
      setenv("SMDDP_HOST_ID", r < 2 ? "hostA" : "hostB", 1);
    });
    for (const auto& r : results) {
      INFO((hostPath ? "shared-memory path" : "network path"));
      CHECK(r == "");
    }
  }
}

TEST_CASE("overlapping allreduces keep call order on the network-only path",
          "[fusion][order][netfusion]") {
  // No segment: the cut is agreed from every rank's proposal, and a rank
  // whose calls overlap (only rank 1 reuses its buffer) ends it for all.
  ScopedEnv off("SMDDP_SHM_ALLREDUCE", "0");
  auto results = runWorld(3, [](Communicator& comm) {
    if (!fusesOnNetwork(comm)) return std::string("network fusion is off");
    return overlappingCallsJob(comm);
  });
  for (const auto& r : results) CHECK(r == "");
}
