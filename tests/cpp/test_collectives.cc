// Collectives between ranks that are threads of one process, over shm and
// tcp;ofi_rxm, each checked against a closed form.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <future>
#include <numeric>
#include <thread>

#include "common/error.h"
#include "algorithms/algorithms.h"
#include "algorithms/collective_calls.h"
#include "engine/communicator.h"
#include "world.h"

using namespace smddp;
using smddp::test::runWorld;
using smddp::test::ScopedEnv;

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
  auto results = runWorld(2, [](Communicator& comm) -> std::string {
    if (comm.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      return "";
    }
    std::vector<float> v(10, 1.0f);
    try {
      comm.allreduceSync({{v.data(), v.size()}}, DataType::kFloat32, ReduceOp::kSum);
    } catch (const Error& e) {
      return e.kind() == ErrorKind::kTimeout ? std::string(e.what()) : "wrong kind";
    }
    return "no error";
  }, std::chrono::milliseconds(500));
  INFO(results[0]);
  CHECK(results[0].find("timed out") != std::string::npos);
  CHECK(results[0].find("rank(s) 1") != std::string::npos);
  // world.h names its groups "test"; the call is the group's first.
  CHECK(results[0].find("allreduce(SUM, float32, 10 elements) at sequence 0 in group 'test'") !=
        std::string::npos);
}
