// The fusion-buffer scheduler and the host (shared-memory) reduction
// servers, between forked ranks: results against closed forms while ranks
// are deliberately skewed in time, bitwise reproducibility across runs,
// SMDDP_SERVERS_PER_NODE, and the balance of the shard split.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "common/error.h"
#include "engine/communicator.h"
#include "reduce/shard_plan.h"
#include "world.h"

using namespace smddp;
using smddp::test::runWorld;
using smddp::test::ScopedEnv;
using smddp::test::fusesOnNetwork;
using smddp::test::usesHostPath;

namespace {

// Call i of the job: its size, dtype and op are the same on every rank.
struct CallShape {
  uint64_t numel;
  DataType dtype;
  ReduceOp op;
};

CallShape shapeOf(uint64_t i) {
  std::mt19937_64 rng(1000 + i);
  static const uint64_t sizes[] = {0, 1, 3, 17, 255, 1024, 4099, 40000, 150001};
  CallShape c;
  c.numel = sizes[rng() % 9];
  c.dtype = rng() % 2 ? DataType::kFloat32 : DataType::kInt32;
  static const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin};
  c.op = ops[rng() % 3];
  return c;
}

// Rank r's element j of call i, and the closed forms over n ranks.
int64_t inputOf(uint64_t i, uint64_t j, int r) { return static_cast<int64_t>((i * 7 + j) % 13) + r; }
int64_t expectedOf(const CallShape& c, uint64_t i, uint64_t j, int n) {
  int64_t base = static_cast<int64_t>((i * 7 + j) % 13);
  switch (c.op) {
    case ReduceOp::kSum: return n * base + n * (n - 1) / 2;
    case ReduceOp::kMax: return base + n - 1;
    default: return base;
  }
}

// Issues `calls` allreduces asynchronously, sleeping a random time between
// some of them (a different pattern on every rank), then checks each result.
std::string skewedJob(Communicator& comm, int calls, bool leaderBursts) {
  const int r = comm.rank();
  const int n = comm.size();
  std::mt19937 rng(77 + 13 * r);
  std::vector<std::vector<float>> f(calls);
  std::vector<std::vector<int32_t>> in(calls);
  std::atomic<int> done{0};
  std::mutex mu;
  std::string firstError;
  for (int i = 0; i < calls; ++i) {
    CallShape c = shapeOf(i);
    Buffer buf;
    if (c.dtype == DataType::kFloat32) {
      f[i].resize(c.numel);
      for (uint64_t j = 0; j < c.numel; ++j) f[i][j] = static_cast<float>(inputOf(i, j, r));
      buf = {f[i].data(), c.numel};
    } else {
      in[i].resize(c.numel);
      for (uint64_t j = 0; j < c.numel; ++j) in[i][j] = static_cast<int32_t>(inputOf(i, j, r));
      buf = {in[i].data(), c.numel};
    }
    comm.allreduce({buf}, c.dtype, c.op, [&](std::exception_ptr e) {
      if (e) {
        std::lock_guard<std::mutex> lock(mu);
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& ex) {
          if (firstError.empty()) firstError = ex.what();
        }
      }
      done++;
    });
    // Rank 0 (the leader) issues in bursts so calls queue up and fuse;
    // the others arrive at random moments, in a different rhythm each.
    // A batch only fuses calls issued on every rank, so with leaderBursts
    // the last 16 calls come in one burst on every rank.
    bool sleep = leaderBursts && r == 0 ? (i % 10 == 9) : (rng() % 3 == 0);
    if (leaderBursts && i >= calls - 17) sleep = false;
    if (sleep) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(40);
  while (done.load() < calls && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (done.load() < calls) return "only " + std::to_string(done.load()) + " calls completed";
  if (!firstError.empty()) return "a call failed: " + firstError;
  for (int i = 0; i < calls; ++i) {
    CallShape c = shapeOf(i);
    for (uint64_t j = 0; j < c.numel; ++j) {
      int64_t got = c.dtype == DataType::kFloat32 ? static_cast<int64_t>(f[i][j]) : in[i][j];
      if (got != expectedOf(c, i, j, n)) {
        return "rank " + std::to_string(r) + " call " + std::to_string(i) + " element " +
               std::to_string(j) + " = " + std::to_string(got) + ", expected " +
               std::to_string(expectedOf(c, i, j, n));
      }
    }
  }
  // Every rank follows rank 0's cut (on its host or, across hosts, as its
  // host's leader took it), so every rank must have fused.
  Stats s = comm.stats();
  if (leaderBursts && usesHostPath(comm) && s.fusedCalls <= s.fusionFlushes) {
    return "rank " + std::to_string(r) + ": no call was fused: " + std::to_string(s.fusedCalls) +
           " calls in " + std::to_string(s.fusionFlushes) + " buffers";
  }
  return "";
}

uint64_t fnv1a(const void* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(p)[i]) * 1099511628211ull;
  return h;
}

}  // namespace

TEST_CASE("skewed ranks fuse differently-timed calls without deadlock or wrong results",
          "[fusion]") {
  ScopedEnv slot("SMDDP_SHM_SLOT_BYTES", "16K");  // many pipeline steps per call
  for (int n : {2, 3, 4}) {
    auto results = runWorld(n, [](Communicator& comm) { return skewedJob(comm, 120, true); },
                            std::chrono::milliseconds(30000), std::chrono::seconds(90));
    for (const auto& r : results) {
      INFO("world " << n);
      CHECK(r == "");
    }
  }
}

TEST_CASE("a tiny fusion budget and the network path give the same results", "[fusion]") {
  SECTION("fusion buffer of one byte: every call alone") {
    ScopedEnv fb("SMDDP_FUSION_BUFFER_BYTES", "1");
    auto results = runWorld(3, [](Communicator& comm) { return skewedJob(comm, 40, false); });
    for (const auto& r : results) CHECK(r == "");
  }
  SECTION("streaming stores for every batch, odd alignments included") {
    ScopedEnv nt("SMDDP_STREAMING_STORE_BYTES", "0");
    // 120 calls, as in the skewed test above: whether a burst finds the
    // engine busy is up to the scheduler, and 40 calls once gave it no
    // chance on a loaded CI machine (40 calls in 40 buffers). It must fuse
    // somewhere, so that fused batches' odd offsets take the streaming
    // stores too.
    auto results = runWorld(3, [](Communicator& comm) { return skewedJob(comm, 120, true); });
    for (const auto& r : results) CHECK(r == "");
  }
  SECTION("SMDDP_SHM_ALLREDUCE=0: reduction servers over libfabric") {
    ScopedEnv off("SMDDP_SHM_ALLREDUCE", "0");
    auto results = runWorld(3, [](Communicator& comm) {
      if (usesHostPath(comm)) return std::string("host path used although disabled");
      return skewedJob(comm, 40, false);
    });
    for (const auto& r : results) CHECK(r == "");
  }
}

TEST_CASE("results are bitwise identical on every rank and across repeated runs", "[fusion]") {
  // Random floats: a different summation order would change the low bits.
  const uint64_t numel = 300001;
  auto job = [&](Communicator& comm) -> std::string {
    std::mt19937 rng(5 + comm.rank());
    std::uniform_real_distribution<float> d(-1e3f, 1e3f);
    std::vector<float> v(numel);
    for (auto& x : v) x = d(rng);
    comm.allreduceSync({{v.data(), numel}}, DataType::kFloat32, ReduceOp::kSum);
    return std::to_string(fnv1a(v.data(), v.size() * sizeof(float)));
  };
  std::vector<std::string> first;
  for (int run = 0; run < 3; ++run) {
    // Vary the pipelining between runs: the bytes must not change.
    ScopedEnv slot("SMDDP_SHM_SLOT_BYTES", run == 1 ? "8K" : "128K");
    auto results = runWorld(3, job);
    INFO("run " << run);
    for (const auto& r : results) CHECK(r == results[0]);
    REQUIRE(results[0].find("threw") == std::string::npos);
    if (run == 0) first = results;
    else CHECK(results == first);
  }
}

TEST_CASE("SMDDP_SERVERS_PER_NODE sets how many ranks reduce", "[fusion]") {
  for (int servers : {1, 2, 4}) {
    ScopedEnv sv("SMDDP_SERVERS_PER_NODE", std::to_string(servers));
    auto results = runWorld(4, [servers](Communicator& comm) -> std::string {
      if (comm.allreducePath().reductionServers() != servers) {
        return "reductionServers() = " + std::to_string(comm.allreducePath().reductionServers());
      }
      std::string err = skewedJob(comm, 30, false);
      if (!err.empty()) return err;
      // Only the server ranks (r * 4 / S for r < S) spent time reducing.
      bool isServer = false;
      for (int s = 0; s < servers; ++s) isServer |= (s * 4 / servers) == comm.rank();
      bool reduced = comm.stats().serverReduceNs > 0;
      if (reduced != isServer) {
        return "rank " + std::to_string(comm.rank()) + (reduced ? " reduced" : " did not reduce");
      }
      return "";
    });
    for (const auto& r : results) {
      INFO("servers " << servers);
      CHECK(r == "");
    }
  }
}

TEST_CASE("SMDDP_SERVERS_PER_NODE on the network path", "[fusion][hosts]") {
  // The libfabric reduction servers (no shared segment) take the setting
  // too: per host, that many ranks spread over its ranks serve.
  struct Layout {
    const char* shm;
    int servers;
    std::vector<int> hostOf;       // host of each rank
    std::vector<int> serverRanks;  // expected
  };
  for (const Layout& l : {Layout{"0", 1, {0, 0, 0, 0}, {0}},
                          Layout{"0", 2, {0, 0, 0, 0}, {0, 2}},
                          Layout{"1", 1, {0, 0, 1}, {0, 2}},    // uneven hosts
                          Layout{"1", 2, {0, 1, 0, 0}, {0, 1, 2}}}) {
    ScopedEnv sv("SMDDP_SERVERS_PER_NODE", std::to_string(l.servers));
    ScopedEnv shm("SMDDP_SHM_ALLREDUCE", l.shm);
    const int n = static_cast<int>(l.hostOf.size());
    auto results = runWorld(
        n,
        [&l](Communicator& comm) -> std::string {
          if (usesHostPath(comm)) return "the shared-memory path was used";
          if (comm.context().peers().networkServers() != l.serverRanks) {
            std::string got;
            for (int r : comm.context().peers().networkServers()) got += std::to_string(r) + " ";
            return "networkServers() = " + got;
          }
          std::string err = skewedJob(comm, 30, false);
          if (!err.empty()) return err;
          const bool isServer = std::count(l.serverRanks.begin(), l.serverRanks.end(),
                                           comm.rank()) > 0;
          const bool reduced = comm.stats().serverReduceNs > 0;
          if (reduced != isServer) {
            return "rank " + std::to_string(comm.rank()) +
                   (reduced ? " reduced" : " did not reduce");
          }
          return "";
        },
        std::chrono::milliseconds(30000), std::chrono::seconds(90),
        [&l](int r) {
          setenv("SMDDP_HOST_ID", ("nethost" + std::to_string(l.hostOf[r])).c_str(), 1);
        });
    for (const auto& r : results) {
      INFO("servers " << l.servers << ", SMDDP_SHM_ALLREDUCE=" << l.shm);
      CHECK(r == "");
    }
  }
}

TEST_CASE("across pretend hosts only the host servers count server time, in f32 and bf16",
          "[fusion][hosts]") {
  // 2 hosts x 2 ranks, one server per host (local rank 0): its host
  // segment's reduce step and its reduction across hosts are timed
  // (observe/stats.h, timeServerReduce), the other ranks reduce nothing.
  ScopedEnv sv("SMDDP_SERVERS_PER_NODE", "1");
  for (const char* wire : {"fp32", "bf16"}) {
    ScopedEnv dtype("SMDDP_CROSS_HOST_DTYPE", wire);
    auto results = runWorld(4, [](Communicator& comm) -> std::string {
      if (!usesHostPath(comm)) return "the shared-memory path was not used";
      std::vector<float> v(100003, static_cast<float>(comm.rank() + 1));
      comm.allreduceSync({{v.data(), v.size()}}, DataType::kFloat32, ReduceOp::kSum);
      if (v[0] != 10.0f || v.back() != 10.0f) return "wrong sum " + std::to_string(v[0]);
      const bool isServer = comm.rank() % 2 == 0;
      const bool reduced = comm.stats().serverReduceNs > 0;
      if (reduced != isServer) {
        return "rank " + std::to_string(comm.rank()) + (reduced ? " reduced" : " did not reduce");
      }
      return "";
    }, std::chrono::milliseconds(30000), std::chrono::seconds(90), [](int r) {
      setenv("SMDDP_HOST_ID", ("host" + std::to_string(r / 2)).c_str(), 1);
    });
    for (const auto& r : results) {
      INFO(wire);
      CHECK(r == "");
    }
  }
}

TEST_CASE("fusion-buffer shards keep every server's bytes within one shard", "[fusion]") {
  // Property over random call sequences: each batch's split is exact and
  // contiguous, and the servers' running totals never drift apart by more
  // than one element (the leftovers rotate with the batch index).
  std::mt19937_64 rng(0xf00d);
  for (int trial = 0; trial < 500; ++trial) {
    const int S = 1 + static_cast<int>(rng() % 9);
    std::vector<uint64_t> total(S, 0);
    const int batches = 1 + static_cast<int>(rng() % 50);
    const uint64_t repeat = rng() % 2 ? 1 + rng() % 100000 : 0;  // training loops repeat sizes
    for (int b = 0; b < batches; ++b) {
      uint64_t numel = repeat ? repeat : rng() % 100000;
      uint64_t off = 0;
      for (int s = 0; s < S; ++s) {
        Range r = balancedShard(numel, S, s, static_cast<uint64_t>(b));
        REQUIRE(r.offset == off);
        REQUIRE((r.count == numel / S || r.count == numel / S + 1));
        off += r.count;
        total[s] += r.count;
      }
      REQUIRE(off == numel);
      if (repeat) {
        auto [lo, hi] = std::minmax_element(total.begin(), total.end());
        INFO("S=" << S << " batch " << b << " numel " << numel);
        REQUIRE(*hi - *lo <= 1);
      }
    }
  }
}

TEST_CASE("pretend hosts reduce through their segments, then between hosts", "[fusion][hosts]") {
  // SMDDP_HOST_ID splits the ranks into hosts: each host reduces through its
  // own segment and the hosts' servers combine the partials over tcp.
  struct Layout {
    int world;
    int perHost;  // 0: uneven; 0 and 1 take the network path (one rank per
                  // host gains nothing from a segment: host_path.cc)
  };
  for (Layout l : {Layout{4, 2}, Layout{6, 2}, Layout{3, 1}, Layout{3, 0}}) {
    auto hostOf = [l](int r) { return l.perHost ? r / l.perHost : (r == 2 ? 1 : 0); };
    auto results = runWorld(
        l.world,
        [l](Communicator& comm) -> std::string {
          if (usesHostPath(comm) != (l.perHost > 1)) {
            return std::string("usesHostPath() = ") + (usesHostPath(comm) ? "true" : "false");
          }
          // Rank 0 issues in bursts: its cut holds several calls, and
          // every other host's leader must take the same cut.
          std::string err = skewedJob(comm, 60, true);
          if (!err.empty()) return err;
          // AVG across hosts divides once, by the world size.
          std::vector<double> v(1001);
          for (size_t j = 0; j < v.size(); ++j) v[j] = static_cast<double>(j + comm.rank());
          comm.allreduceSync({{v.data(), v.size()}}, DataType::kFloat64, ReduceOp::kAvg);
          for (size_t j = 0; j < v.size(); ++j) {
            double want = static_cast<double>(j) + (comm.size() - 1) / 2.0;
            if (std::abs(v[j] - want) > 1e-9) {
              return "AVG element " + std::to_string(j) + " = " + std::to_string(v[j]);
            }
          }
          return "";
        },
        std::chrono::milliseconds(30000), std::chrono::seconds(90),
        [hostOf](int r) { setenv("SMDDP_HOST_ID", ("host" + std::to_string(hostOf(r))).c_str(), 1); });
    for (const auto& r : results) {
      INFO("world " << l.world << ", " << l.perHost << " ranks per host");
      CHECK(r == "");
    }
  }
}

namespace {

// Every rank issues 8 allreduces at once; the ranks in `odd` give call 3 a
// different size. Whatever the batches are, they are the same on every
// rank, so every rank must fail the same calls (call 3 among them) with
// both sizes named, get the right sums for the rest, and keep a usable
// group: no rank may be left waiting for the timeout. Returns
// "failed <indices>" on success, else what went wrong.
std::string mismatchInBatchJob(Communicator& comm, bool odd) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::vector<float>> v(8);
  std::vector<std::string> err(8);
  std::atomic<int> done{0};
  for (int i = 0; i < 8; ++i) {
    uint64_t numel = (i == 3 && odd) ? 5001 : 5000;
    v[i].assign(numel, 1.0f);
    comm.allreduce({{v[i].data(), numel}}, DataType::kFloat32, ReduceOp::kSum,
                   [&err, &done, i](std::exception_ptr e) {
                     if (e) {
                       try {
                         std::rethrow_exception(e);
                       } catch (const std::exception& ex) {
                         err[i] = ex.what();
                       }
                     }
                     done++;
                   });
  }
  while (done.load() < 8 && std::chrono::steady_clock::now() - start < std::chrono::seconds(20)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (done.load() < 8) return "only " + std::to_string(done.load()) + " calls completed";
  std::string failed;
  for (int i = 0; i < 8; ++i) {
    if (!err[i].empty()) {
      if (err[i].find("5000 elements") == std::string::npos ||
          err[i].find("5001 elements") == std::string::npos) {
        return "call " + std::to_string(i) + " failed without both sizes: " + err[i];
      }
      failed += " " + std::to_string(i);
    } else if (v[i] != std::vector<float>(v[i].size(), static_cast<float>(comm.size()))) {
      return "call " + std::to_string(i) + " gave a wrong sum";
    }
  }
  if (err[3].empty()) return "call 3 did not fail";
  // The group is still usable, in step on every rank.
  std::vector<float> after(100, 2.0f);
  try {
    comm.allreduceSync({{after.data(), after.size()}}, DataType::kFloat32, ReduceOp::kSum);
  } catch (const Error& e) {
    return std::string("the call after the mismatch failed: ") + e.what();
  }
  if (after[0] != 2.0f * comm.size()) return "the call after the mismatch gave a wrong sum";
  if (std::chrono::steady_clock::now() - start > std::chrono::seconds(4)) {
    return "took longer than 4 s (someone waited for a timeout)";
  }
  return "failed" + failed;
}

void checkMismatchInBatch(const std::vector<std::string>& results) {
  for (const auto& r : results) {
    INFO(r);
    CHECK(r.rfind("failed ", 0) == 0);
    CHECK(r == results[0]);  // the same calls failed on every rank
  }
}

}  // namespace

TEST_CASE("a call that differs inside a fused batch fails the same calls on every rank",
          "[fusion][errors]") {
  SECTION("one host, world 3: a follower finds it") {
    checkMismatchInBatch(runWorld(
        3, [](Communicator& comm) { return mismatchInBatchJob(comm, comm.rank() == 2); },
        std::chrono::milliseconds(8000), std::chrono::seconds(60)));
  }
  SECTION("two pretend hosts: the other host's leader finds it in rank 0's cut") {
    checkMismatchInBatch(runWorld(
        4, [](Communicator& comm) { return mismatchInBatchJob(comm, comm.rank() >= 2); },
        std::chrono::milliseconds(8000), std::chrono::seconds(60),
        [](int r) { setenv("SMDDP_HOST_ID", r < 2 ? "hostA" : "hostB", 1); }));
  }
}

namespace {

// Rank 0 issues every call at once and waits at the end; the other ranks
// wait for each call before issuing the next. A batch that fused calls the
// waiting ranks have not issued yet could never finish (a deadlock until
// the timeout): the cut must hold only calls issued everywhere.
std::string syncAgainstAsyncJob(Communicator& comm, int calls) {
  const int r = comm.rank();
  const int n = comm.size();
  std::vector<std::vector<float>> v(calls);
  for (int i = 0; i < calls; ++i) v[i].assign(1000 + 37 * i, static_cast<float>(i + r));
  const auto start = std::chrono::steady_clock::now();
  if (r == 0) {
    std::atomic<int> done{0};
    std::atomic<int> failed{0};
    for (int i = 0; i < calls; ++i) {
      comm.allreduce({{v[i].data(), v[i].size()}}, DataType::kFloat32, ReduceOp::kSum,
                     [&](std::exception_ptr e) {
                       if (e) failed++;
                       done++;
                     });
    }
    while (done.load() < calls &&
           std::chrono::steady_clock::now() - start < std::chrono::seconds(20)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (done.load() < calls) return "only " + std::to_string(done.load()) + " calls completed";
    if (failed.load()) return std::to_string(failed.load()) + " calls failed";
  } else {
    for (int i = 0; i < calls; ++i) {
      try {
        comm.allreduceSync({{v[i].data(), v[i].size()}}, DataType::kFloat32, ReduceOp::kSum);
      } catch (const Error& e) {
        return "call " + std::to_string(i) + ": " + e.what();
      }
    }
  }
  for (int i = 0; i < calls; ++i) {
    const float want = static_cast<float>(n * i + n * (n - 1) / 2);
    for (float x : v[i]) {
      if (x != want) return "call " + std::to_string(i) + ": " + std::to_string(x);
    }
  }
  // Far below the 5 s timeout: nobody waited for a call not yet issued.
  auto took = std::chrono::steady_clock::now() - start;
  if (took > std::chrono::seconds(3)) {
    return "took " + std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()) + " ms";
  }
  return "";
}

}  // namespace

TEST_CASE("a rank that waits on each call while rank 0 queues them all never deadlocks",
          "[fusion]") {
  SECTION("one host, world 3") {
    auto results = runWorld(3, [](Communicator& comm) { return syncAgainstAsyncJob(comm, 30); },
                            std::chrono::milliseconds(5000), std::chrono::seconds(60));
    for (const auto& r : results) CHECK(r == "");
  }
  SECTION("two pretend hosts of two ranks") {
    auto results = runWorld(
        4, [](Communicator& comm) { return syncAgainstAsyncJob(comm, 30); },
        std::chrono::milliseconds(5000), std::chrono::seconds(60),
        [](int r) { setenv("SMDDP_HOST_ID", r < 2 ? "hostA" : "hostB", 1); });
    for (const auto& r : results) CHECK(r == "");
  }
}
