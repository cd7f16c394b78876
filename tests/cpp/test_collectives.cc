// Collectives between ranks that are threads of one process, over shm and
// tcp;ofi_rxm, each checked against a closed form.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <future>
#include <numeric>
#include <random>
#include <thread>

#include "common/error.h"
#include "algorithms/algorithms.h"
#include "algorithms/collective_calls.h"
#include "engine/communicator.h"
#include "world.h"

using namespace smddp;
using smddp::test::runWorld;
using smddp::test::ScopedEnv;
using smddp::test::usesHostPath;

namespace {

// Rank r's input element i; the sum over ranks has a closed form below.
float inputOf(int r, uint64_t i) { return static_cast<float>((i % 97) + 1000 * r); }
float sumOf(int n, uint64_t i) {
  return static_cast<float>(n * (i % 97)) + 1000.0f * (n * (n - 1) / 2);
}

// An allreduce SUM of `numel` float32 at world n, every rank's result
// against sumOf.
void checkSumAgainstClosedForm(int n, uint64_t numel) {
  auto results = runWorld(n, [&](Communicator& comm) -> std::string {
    std::vector<float> v(numel);
    for (uint64_t i = 0; i < numel; ++i) v[i] = inputOf(comm.rank(), i);
    comm.allreduceSync({{v.data(), numel}}, DataType::kFloat32, ReduceOp::kSum);
    for (uint64_t i = 0; i < numel; ++i) {
      if (v[i] != sumOf(comm.size(), i)) {
        return "rank " + std::to_string(comm.rank()) + " element " + std::to_string(i) + " = " +
               std::to_string(v[i]) + " expected " + std::to_string(sumOf(n, i));
      }
    }
    return "";
  });
  for (const auto& r : results) CHECK(r == "");
}

}  // namespace

TEST_CASE("allreduce SUM float32 matches the closed form", "[collectives]") {
  auto provider = GENERATE(std::string("shm"), std::string("tcp;ofi_rxm"));
  ScopedEnv env("SMDDP_FI_PROVIDER", provider);
  ScopedEnv chunk("SMDDP_CHUNK_BYTES", "8192");  // force multi-chunk pipelining
  for (int n : {1, 2, 3, 4}) {
    for (uint64_t numel : {0ull, 1ull, 7ull, 1000ull, 4097ull, 100000ull}) {
      INFO("provider " << provider << " n=" << n << " numel=" << numel);
      checkSumAgainstClosedForm(n, numel);
    }
  }
}

TEST_CASE("a short shard is cut into smaller chunks, down to the wire floor", "[collectives]") {
  // f32, 256 KiB chunks, 128 KiB floor: 16 chunks of the cap from a 4 MiB
  // shard up; below that a sixteenth of the shard, never under the floor.
  const uint64_t KiB = 1024;
  CHECK(shardChunkBytes(16 * 65536, 4, 4, 256 * KiB, 128 * KiB) == 256 * KiB);
  CHECK(shardChunkBytes(64 * 65536, 4, 4, 256 * KiB, 128 * KiB) == 256 * KiB);
  CHECK(shardChunkBytes(12 * 65536, 4, 4, 256 * KiB, 128 * KiB) == 192 * KiB);
  CHECK(shardChunkBytes(12 * 65536 + 1, 4, 4, 256 * KiB, 128 * KiB) == 192 * KiB + 4);
  CHECK(shardChunkBytes(1000, 4, 4, 256 * KiB, 128 * KiB) == 128 * KiB);
  // The floor is in wire bytes: f32 sent as bf16 keeps 64 Ki elements.
  CHECK(shardChunkBytes(1000, 4, 2, 256 * KiB, 128 * KiB) == 256 * KiB);
  CHECK(shardChunkBytes(12 * 65536, 4, 2, 256 * KiB, 128 * KiB) == 256 * KiB);
  // A floor above the cap is the cap: SMDDP_MIN_CHUNK_BYTES >=
  // SMDDP_CHUNK_BYTES gives every shard chunks of SMDDP_CHUNK_BYTES.
  CHECK(shardChunkBytes(1000, 4, 4, 8 * KiB, 128 * KiB) == 8 * KiB);
  CHECK(shardChunkBytes(1000, 4, 4, 256 * KiB, 256 * KiB) == 256 * KiB);
  CHECK(shardChunkBytes(0, 8, 8, 256 * KiB, 4 * KiB) == 4 * KiB);
}

TEST_CASE("allreduce with chunks sized to the shard matches the closed form", "[collectives]") {
  // Chunks of 64 KiB down to 4 KiB: shards of these sizes are cut into 16
  // chunks of odd sizes, or into chunks of the floor, or of the cap.
  auto provider = GENERATE(std::string("shm"), std::string("tcp;ofi_rxm"));
  ScopedEnv env("SMDDP_FI_PROVIDER", provider);
  ScopedEnv chunk("SMDDP_CHUNK_BYTES", "65536");
  ScopedEnv floor("SMDDP_MIN_CHUNK_BYTES", "4096");
  for (int n : {2, 3}) {
    for (uint64_t numel : {5000ull, 77777ull, 300001ull, 1000000ull}) {
      INFO("provider " << provider << " n=" << n << " numel=" << numel);
      checkSumAgainstClosedForm(n, numel);
    }
  }
}

TEST_CASE("coalesced allreduce, broadcast, allgather and barrier", "[collectives]") {
  ScopedEnv env("SMDDP_FI_PROVIDER", "shm");
  for (int n : {2, 3}) {
    auto results = runWorld(n, [&](Communicator& comm) -> std::string {
      const int r = comm.rank();
      // Coalesced: two tensors of different lengths, MAX.
      std::vector<int32_t> a(5, r), b(3, 10 * r);
      std::promise<void> p1;
      comm.allreduce({{a.data(), 5}, {b.data(), 3}}, DataType::kInt32, ReduceOp::kMax,
                     [&](std::exception_ptr e) { e ? p1.set_exception(e) : p1.set_value(); });
      p1.get_future().get();
      for (auto x : a) if (x != n - 1) return "coalesced a wrong";
      for (auto x : b) if (x != 10 * (n - 1)) return "coalesced b wrong";
      // Broadcast from every root.
      for (int root = 0; root < n; ++root) {
        std::vector<double> v(3000, r == root ? 1.5 * root : -1.0);
        std::promise<void> p;
        broadcast(comm, {{v.data(), v.size()}}, DataType::kFloat64, root,
                       [&](std::exception_ptr e) { e ? p.set_exception(e) : p.set_value(); });
        p.get_future().get();
        for (auto x : v) if (x != 1.5 * root) return "broadcast wrong";
      }
      // Allgather.
      std::vector<int64_t> in(11, r + 7);
      std::vector<std::vector<int64_t>> out(n, std::vector<int64_t>(11, -1));
      std::vector<Buffer> outs;
      for (auto& o : out) outs.push_back({o.data(), o.size()});
      std::promise<void> p2;
      allgather(comm, {in.data(), in.size()}, outs, DataType::kInt64,
                     [&](std::exception_ptr e) { e ? p2.set_exception(e) : p2.set_value(); });
      p2.get_future().get();
      for (int q = 0; q < n; ++q) for (auto x : out[q]) if (x != q + 7) return "allgather wrong";
      std::promise<void> p3;
      barrier(comm, [&](std::exception_ptr e) { e ? p3.set_exception(e) : p3.set_value(); });
      p3.get_future().get();
      return "";
    });
    for (const auto& r : results) CHECK(r == "");
  }
}

TEST_CASE("mismatched element counts fail on every rank with both sides named",
          "[collectives][errors]") {
  ScopedEnv env("SMDDP_FI_PROVIDER", "shm");
  auto results = runWorld(2, [](Communicator& comm) -> std::string {
    uint64_t numel = comm.rank() == 0 ? 100000 : 100001;
    std::vector<float> v(numel, 1.0f);
    try {
      comm.allreduceSync({{v.data(), numel}}, DataType::kFloat32, ReduceOp::kSum);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  }, std::chrono::milliseconds(10000));
  for (const auto& r : results) {
    INFO(r);
    CHECK(r.find("100000 elements") != std::string::npos);
    CHECK(r.find("100001 elements") != std::string::npos);
  }
}

TEST_CASE("a rank that never arrives produces a timeout naming it, the call and the group",
          "[collectives][errors]") {
  ScopedEnv env("SMDDP_FI_PROVIDER", "shm");
  // The group timeout also bounds forming the group: 2 s, not less, so a
  // loaded machine still forms it (CI saw 500 ms run out in the bootstrap).
  auto results = runWorld(2, [](Communicator& comm) -> std::string {
    if (comm.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(3500));
      return "";
    }
    std::vector<float> v(10, 1.0f);
    try {
      comm.allreduceSync({{v.data(), v.size()}}, DataType::kFloat32, ReduceOp::kSum);
    } catch (const Error& e) {
      return e.kind() == ErrorKind::kTimeout ? std::string(e.what()) : "wrong kind";
    }
    return "no error";
  }, std::chrono::milliseconds(2000));
  INFO(results[0]);
  CHECK(results[0].find("timed out") != std::string::npos);
  CHECK(results[0].find("rank(s) 1") != std::string::npos);
  // world.h names its groups "test"; the call is the group's first.
  CHECK(results[0].find("allreduce(SUM, float32, 10 elements) at sequence 0 in group 'test'") !=
        std::string::npos);
}

TEST_CASE("allreduce in pairwise rounds gives every rank the rank-ordered sum", "[collectives]") {
  // One rank per pretend host takes the network-only path; from
  // SMDDP_ROUNDS_MIN_HOSTS hosts a call of SMDDP_ROUNDS_MIN_BYTES and up
  // runs in pairwise rounds. Its servers must still combine in rank order:
  // every rank's result is the left fold x_0 + x_1 + ... in float32,
  // computed here from every rank's (seeded) input. Small chunks give
  // shards of many chunks; a cap of 8 posted receives makes the plan
  // enlarge them. Calls under the byte floor take the all-to-all pattern,
  // and the counter tells the two apart.
  ScopedEnv hosts("SMDDP_ROUNDS_MIN_HOSTS", "3");
  ScopedEnv floor("SMDDP_ROUNDS_MIN_BYTES", "200000");
  ScopedEnv chunk("SMDDP_CHUNK_BYTES", "8192");
  ScopedEnv minChunk("SMDDP_MIN_CHUNK_BYTES", "4096");
  auto cap = GENERATE(std::string("256"), std::string("8"));
  ScopedEnv recvs("SMDDP_MAX_POSTED_RECVS", cap);
  auto inputOf = [](int r, uint64_t numel, int call) {
    std::mt19937 rng(1000 * r + call);
    std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
    std::vector<float> v(numel);
    for (uint64_t i = 0; i < numel; ++i) {
      v[i] = std::ldexp(mant(rng), static_cast<int>(i % 23) - 11);
    }
    return v;
  };
  const std::vector<uint64_t> sizes = {10000, 77777, 300001, 9999, 1 << 20};
  for (int n : {3, 5}) {
    INFO("n=" << n << " SMDDP_MAX_POSTED_RECVS=" << cap);
    auto results = runWorld(
        n,
        [&](Communicator& comm) -> std::string {
          if (usesHostPath(comm)) return "the shared-memory path was used";
          uint64_t inRounds = 0;
          for (int call = 0; call < static_cast<int>(sizes.size()); ++call) {
            const uint64_t numel = sizes[call];
            if (numel * 4 >= 200000) ++inRounds;
            std::vector<float> v = inputOf(comm.rank(), numel, call);
            std::vector<float> want = inputOf(0, numel, call);
            for (int r = 1; r < comm.size(); ++r) {
              const std::vector<float> x = inputOf(r, numel, call);
              for (uint64_t i = 0; i < numel; ++i) want[i] += x[i];
            }
            comm.allreduceSync({{v.data(), numel}}, DataType::kFloat32, ReduceOp::kSum);
            if (std::memcmp(v.data(), want.data(), numel * 4) != 0) {
              for (uint64_t i = 0; i < numel; ++i) {
                if (v[i] != want[i]) {
                  return "call " + std::to_string(call) + " rank " +
                         std::to_string(comm.rank()) + " element " + std::to_string(i) +
                         " = " + std::to_string(v[i]) + " expected " + std::to_string(want[i]);
                }
              }
            }
          }
          // AVG and MAX in rounds too: closed forms.
          std::vector<double> d(50001);
          for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<double>(i) + comm.rank();
          comm.allreduceSync({{d.data(), d.size()}}, DataType::kFloat64, ReduceOp::kMax);
          for (size_t i = 0; i < d.size(); ++i) {
            if (d[i] != static_cast<double>(i) + comm.size() - 1) {
              return "MAX wrong at " + std::to_string(i);
            }
          }
          std::vector<double> a(50001, 2.0 * comm.rank());
          comm.allreduceSync({{a.data(), a.size()}}, DataType::kFloat64, ReduceOp::kAvg);
          for (double x : a) {
            if (x != static_cast<double>(comm.size() - 1)) return "AVG wrong: " + std::to_string(x);
          }
          inRounds += 2;
          const uint64_t got = comm.stats().roundsCalls;
          if (got != inRounds) {
            return "rounds_calls " + std::to_string(got) + ", expected " + std::to_string(inRounds);
          }
          return "";
        },
        std::chrono::milliseconds(30000), std::chrono::seconds(90),
        [](int r) { setenv("SMDDP_HOST_ID", ("roundshost" + std::to_string(r)).c_str(), 1); });
    for (const auto& r : results) CHECK(r == "");
  }
}

TEST_CASE("ranks that disagree on the pairwise rounds fail to form, naming the setting",
          "[collectives][errors]") {
  // A rank in rounds sends in another order than one that is not: the
  // group refuses to form rather than run the two patterns against each
  // other.
  const std::string var = GENERATE(std::string("SMDDP_ROUNDS_MIN_HOSTS"),
                                   std::string("SMDDP_ROUNDS_MIN_BYTES"));
  INFO(var);
  auto results = runWorld(3, [](Communicator&) { return std::string("formed"); },
                          std::chrono::milliseconds(10000), std::chrono::seconds(60),
                          [&var](int r) {
                            setenv("SMDDP_HOST_ID", ("disagree" + std::to_string(r)).c_str(), 1);
                            if (r == 2) setenv(var.c_str(), "5", 1);
                          });
  for (const auto& r : results) {
    INFO(r);
    CHECK(r.find(var + "=5") != std::string::npos);
    CHECK(r.find("must be the same on every rank") != std::string::npos);
  }
}
