// Fusion on the network-only path: the cut rule alone (every rank computes
// it from the same proposals), then forked ranks with SMDDP_SHM_ALLREDUCE=0
// whose queued calls must fuse and match closed forms.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "engine/communicator.h"
#include "algorithms/network_fusion.h"
#include "world.h"

using namespace smddp;
using smddp::test::runWorld;
using smddp::test::ScopedEnv;
using smddp::test::fusesOnNetwork;
using smddp::test::usesHostPath;

namespace {

CutProposal proposal(std::vector<uint64_t> numels, DataType dt = DataType::kFloat32,
                     ReduceOp op = ReduceOp::kSum) {
  CutProposal p;
  p.count = static_cast<uint32_t>(numels.size());
  p.dtype = static_cast<uint8_t>(dt);
  p.op = static_cast<uint8_t>(op);
  for (size_t i = 0; i < numels.size(); ++i) p.numel[i] = numels[i];
  return p;
}

// Issues `big`, then every buffer of `small`, as asynchronous SUM
// allreduces (the small ones queue behind the large one on every rank, so
// they fuse), and waits for all of them; their sequence numbers go to
// `seqs`. Returns what went wrong, or "".
std::string queueBehindLarge(Communicator& comm, std::vector<float>& big,
                             std::vector<std::vector<float>>& small,
                             std::vector<uint64_t>* seqs = nullptr) {
  std::atomic<size_t> done{0};
  std::atomic<int> failed{0};
  auto onDone = [&](std::exception_ptr e) {
    if (e) failed++;
    done++;
  };
  comm.allreduce({{big.data(), big.size()}}, DataType::kFloat32, ReduceOp::kSum, onDone);
  for (auto& v : small) {
    const uint64_t seq =
        comm.allreduce({{v.data(), v.size()}}, DataType::kFloat32, ReduceOp::kSum, onDone);
    if (seqs) seqs->push_back(seq);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(40);
  while (done.load() < small.size() + 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (done.load() < small.size() + 1 || failed.load()) return "calls failed or hung";
  return "";
}

// Runs `body` on worlds of 2 and 3 ranks with SMDDP_SHM_ALLREDUCE=0 (the
// network-only path, fusing), after checking that path; every rank must
// return "".
void onFusingNetworkWorlds(const std::function<std::string(Communicator&)>& body) {
  ScopedEnv off("SMDDP_SHM_ALLREDUCE", "0");
  for (int n : {2, 3}) {
    auto results = runWorld(n, [&body](Communicator& comm) -> std::string {
      if (usesHostPath(comm) || !fusesOnNetwork(comm)) return "wrong allreduce path";
      return body(comm);
    });
    for (const auto& res : results) {
      INFO("world " << n);
      CHECK(res == "");
    }
  }
}

}  // namespace

TEST_CASE("the network fusion cut is the longest prefix every rank agrees on",
          "[netfusion]") {
  SECTION("the least count: only calls every rank has queued") {
    CHECK(agreedCut({proposal({5, 6, 7, 8}), proposal({5, 6}), proposal({5, 6, 7})}) == 2);
    CHECK(agreedCut({proposal({5}), proposal({5, 6, 7})}) == 1);
    CHECK(agreedCut({proposal({1, 2, 3}), proposal({1, 2, 3})}) == 3);
  }
  SECTION("one proposal, as on every rank") {
    CHECK(agreedCut({proposal({9, 9})}) == 2);
  }
  SECTION("a call whose size differs on some rank ends the batch before it") {
    CHECK(agreedCut({proposal({5, 6, 7, 8}), proposal({5, 6, 70, 8})}) == 2);
    CHECK(agreedCut({proposal({5, 6, 7}), proposal({5, 6, 7}), proposal({5, 60, 7})}) == 1);
  }
  SECTION("a different dtype or op: the first call runs alone") {
    CHECK(agreedCut({proposal({5, 6}), proposal({5, 6}, DataType::kFloat64)}) == 1);
    CHECK(agreedCut({proposal({5, 6}), proposal({5, 6}, DataType::kFloat32, ReduceOp::kMax)}) ==
          1);
  }
  SECTION("the cut is the same whichever rank computes it") {
    std::vector<CutProposal> all = {proposal({4, 4, 4, 1}), proposal({4, 4, 4}),
                                    proposal({4, 4, 4, 1, 2})};
    const uint32_t cut = agreedCut(all);
    std::swap(all[0], all[2]);
    CHECK(agreedCut(all) == cut);
    CHECK(cut == 3);
  }
  SECTION("an unreadable proposal names its rank") {
    CutProposal zero = proposal({5});
    zero.count = 0;
    CHECK_THROWS_WITH(agreedCut({proposal({5}), zero}), Catch::Contains("rank 1"));
    CutProposal huge = proposal({5});
    huge.count = static_cast<uint32_t>(kMaxFusedCalls) + 1;
    CHECK_THROWS_AS(agreedCut({huge}), Error);
    CutProposal badType = proposal({5});
    badType.dtype = 200;
    CHECK_THROWS_AS(agreedCut({proposal({5}), badType}), Error);
  }
}

TEST_CASE("queued allreduces fuse on the network-only path", "[netfusion]") {
  onFusingNetworkWorlds([](Communicator& comm) -> std::string {
    const int r = comm.rank();
    const int size = comm.size();
    // A large call first, so the small ones queue behind it on every rank.
    std::vector<float> big(1 << 22, 1.0f);
    const int calls = 64;
    std::vector<std::vector<float>> small(calls);
    for (int i = 0; i < calls; ++i) small[i].assign(1000 + 37 * i, static_cast<float>(i + r));
    const std::string err = queueBehindLarge(comm, big, small);
    if (!err.empty()) return err;
    for (float x : big) {
      if (x != static_cast<float>(size)) return "large call wrong";
    }
    for (int i = 0; i < calls; ++i) {
      const float want = static_cast<float>(size * i + size * (size - 1) / 2);
      for (float x : small[i]) {
        if (x != want) return "call " + std::to_string(i) + " wrong";
      }
    }
    Stats s = comm.stats();
    if (s.fusedCalls != static_cast<uint64_t>(calls + 1) || s.fusionFlushes >= s.fusedCalls) {
      return "not fused: " + std::to_string(s.fusedCalls) + " calls in " +
             std::to_string(s.fusionFlushes) + " batches";
    }
    return "";
  });
}

TEST_CASE("a fused batch's rest is recorded with the signature its exchange carried",
          "[netfusion]") {
  // The rest of a cut runs as one exchange under its first call's sequence
  // number, with the fused signature; a peer stalled 200 ms in that
  // exchange probes with it. A rank past the batch answers from its
  // record (ControlPlane::noteSignature): recording the rest's first call
  // there told such a peer "this rank called something else", and it
  // failed (DDP at 4 hosts x 1 rank). Every record must be the call's own
  // signature, or the sum of the calls from it on: what a rest carried.
  onFusingNetworkWorlds([](Communicator& comm) -> std::string {
    std::vector<float> big(1 << 22, 1.0f);
    const int calls = 48;
    std::vector<std::vector<float>> small(calls);
    std::vector<uint64_t> seqs, numels;
    for (int i = 0; i < calls; ++i) {
      small[i].assign(1000 + 37 * i, 1.0f);
      numels.push_back(small[i].size());
    }
    const std::string err = queueBehindLarge(comm, big, small, &seqs);
    if (!err.empty()) return err;
    // Every call completed here, so this rank's engine recorded them.
    Stats s = comm.stats();
    if (s.fusedCalls < 3 || s.fusionFlushes >= s.fusedCalls) return "nothing fused";
    int fusedRecords = 0;
    // The control plane is the engine's: its idle progress keeps off it.
    const Communicator::EndpointHold hold(comm);
    for (int i = 0; i < calls; ++i) {
      CollectiveSignature sig;
      if (!comm.context().control().calledAt(seqs[i], &sig)) {
        return "no record at sequence " + std::to_string(seqs[i]);
      }
      uint64_t sum = 0;
      bool ok = false;
      for (int j = i; j < calls && !ok; ++j) {
        sum += numels[j];
        ok = sig.numel == sum;
        if (ok && j > i) fusedRecords++;
      }
      if (!ok) {
        return "sequence " + std::to_string(seqs[i]) + " recorded " + sig.describe() +
               ", which no call or rest from it carried";
      }
    }
    // 48 calls queued behind a large one fuse, so some rest holds two or
    // more calls and its first sequence number records their sum.
    if (fusedRecords == 0) {
      return "no sequence records a rest of two or more calls (" +
             std::to_string(s.fusedCalls) + " calls fused in " +
             std::to_string(s.fusionFlushes) + " batches)";
    }
    return "";
  });
}

TEST_CASE("a call bigger than a chunk runs alone instead of joining a fused batch",
          "[netfusion]") {
  // A fused batch is copied into the fusion buffer and back; a call of a
  // chunk or more fills the pipeline alone, and copied it only cost time
  // (4 hosts x 1 rank, DDP's 4 MB buckets: 542 ms fused, 513 alone). Eight
  // groups of four small calls and one of 80 kB, with 64 KiB chunks,
  // queued behind a large call: each 80 kB call ends the batch before it
  // and starts its own, so there are at least 1 + 8 batches, while the
  // small calls still fuse. Sums against the closed form.
  ScopedEnv chunk("SMDDP_CHUNK_BYTES", "65536");
  onFusingNetworkWorlds([](Communicator& comm) -> std::string {
    const int r = comm.rank();
    const int size = comm.size();
    std::vector<float> big(1 << 22, 1.0f);
    const int groups = 8;
    std::vector<std::vector<float>> calls;
    for (int g = 0; g < groups; ++g) {
      for (int i = 0; i < 4; ++i) calls.emplace_back(1000 + i, static_cast<float>(g + r));
      calls.emplace_back(20000, static_cast<float>(g - r));  // 80 kB
    }
    const std::string err = queueBehindLarge(comm, big, calls);
    if (!err.empty()) return err;
    for (size_t i = 0; i < calls.size(); ++i) {
      const int g = static_cast<int>(i) / 5;
      const bool large = i % 5 == 4;
      const float want = large ? static_cast<float>(size * g - size * (size - 1) / 2)
                               : static_cast<float>(size * g + size * (size - 1) / 2);
      for (float x : calls[i]) {
        if (x != want) return "call " + std::to_string(i) + " wrong";
      }
    }
    Stats s = comm.stats();
    const std::string counts = std::to_string(s.fusedCalls) + " calls in " +
                               std::to_string(s.fusionFlushes) + " batches";
    if (s.fusedCalls != calls.size() + 1) return "calls not counted: " + counts;
    if (s.fusionFlushes < 1 + groups) return "an 80 kB call was fused: " + counts;
    if (s.fusionFlushes >= s.fusedCalls) return "nothing fused: " + counts;
    return "";
  });
}
