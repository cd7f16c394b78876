// Calls that cannot complete: shutdown must not wait them out, an Exchange
// that gives up must leave no receive that can still write the caller's
// memory (its tensors, the communicator's scratch: released or reused as
// soon as the call fails), and the group timeout may change under a
// running worker.
//
// The abandon case runs an Exchange on the test's thread while the
// Communicator's worker is parked (nothing is queued on it), so the test
// owns the endpoint then.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

#include "common/error.h"
#include "engine/communicator.h"
#include "engine/exchange.h"
#include "world.h"

using namespace smddp;
using smddp::test::runWorld;
using smddp::test::ScopedEnv;

namespace {

constexpr uint64_t kSeq = 1000;  // far from the queue's own sequence numbers
constexpr size_t kChunk = 4 << 20;
constexpr uint32_t kChunks = 16;
constexpr uint8_t kGuard = 0xa5;

std::string barrierSync(Communicator& comm) {
  std::promise<std::exception_ptr> p;
  comm.barrier([&](std::exception_ptr e) { p.set_value(e); });
  auto e = p.get_future().get();
  if (!e) return "";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  }
}

}  // namespace

TEST_CASE("an exchange that gives up leaves no receive that can still write its memory",
          "[stuck]") {
  // Rank 1 streams 16 chunks of 4 MiB; rank 0 gives up on the first chunk
  // that arrives, while the others are in flight (already matched: shm
  // copies through bounce buffers when CMA is off, rxm reads rendezvous
  // data). Right after run() throws, rank 0 fills the memory with a guard
  // pattern, as a reused buffer would be, keeps progressing the endpoint,
  // and checks that nothing wrote there.
  const std::string provider = GENERATE(std::string("shm"), std::string("tcp;ofi_rxm"));
  ScopedEnv prov("SMDDP_FI_PROVIDER", provider);
  ScopedEnv noShmPath("SMDDP_SHM_ALLREDUCE", "0");
  ScopedEnv noCma("FI_SHM_DISABLE_CMA", "1");
  const CollectiveSignature sig{CollectiveType::kBroadcast, DataType::kUInt8, ReduceOp::kSum,
                                kChunk * kChunks, 1};
  auto results = runWorld(2, [&](Communicator& comm) -> std::string {
    std::vector<uint8_t> mem(kChunk * kChunks, 0);
    if (comm.rank() == 1) {
      for (size_t i = 0; i < mem.size(); ++i) mem[i] = static_cast<uint8_t>(i * 7 + 1);
      // Sends whose receives were cancelled never complete: this run ends
      // in its (short) timeout, which is expected.
      Exchange ex(comm, kSeq, sig, std::chrono::milliseconds(4000));
      for (uint32_t k = 0; k < kChunks; ++k) {
        ex.send(0, 0, k, k * kChunk, mem.data() + k * kChunk, kChunk);
      }
      try {
        ex.run();
      } catch (const Error&) {
      }
      return "";
    }
    bool threw = false;
    {
      Exchange ex(comm, kSeq, sig);
      bool first = true;
      for (uint32_t k = 0; k < kChunks; ++k) {
        ex.recv(1, 0, k, mem.data() + k * kChunk, kChunk, [&] {
          if (first) {
            first = false;
            throwError(ErrorKind::kInternal, "test: giving up on this call");
          }
        });
      }
      try {
        ex.run();
      } catch (const Error& e) {
        threw = std::string(e.what()).find("test: giving up") != std::string::npos;
      }
    }
    if (!threw) return "run() did not fail with the test's error";
    std::memset(mem.data(), kGuard, mem.size());
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
    while (std::chrono::steady_clock::now() < until) {
      if (comm.progress() == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    for (size_t i = 0; i < mem.size(); ++i) {
      if (mem[i] != kGuard) {
        size_t n = 0;
        for (size_t j = i; j < mem.size(); ++j) n += mem[j] != kGuard;
        return "a cancelled receive wrote " + std::to_string(n) + " bytes from chunk " +
               std::to_string(i / kChunk) + " on after run() had returned";
      }
    }
    return "";
  }, std::chrono::milliseconds(20000), std::chrono::seconds(60));
  INFO("provider " << provider);
  CHECK(results[0] == "");
  CHECK(results[1] == "");
}

TEST_CASE("shutdown does not wait out a collective stuck on a silent peer", "[stuck]") {
  // Rank 1 never joins the allreduce; rank 0 shuts down while its worker
  // waits for it. The group timeout (20 s) must not be what ends the wait.
  const std::string path = GENERATE(std::string("network"), std::string("shared-memory"));
  ScopedEnv shmPath("SMDDP_SHM_ALLREDUCE", path == "network" ? "0" : "1");
  auto results = runWorld(2, [&](Communicator& comm) -> std::string {
    if (comm.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(3));
      return "";
    }
    std::vector<float> v(1 << 20, 1.0f);
    std::promise<std::exception_ptr> p;
    comm.allreduce({{v.data(), v.size()}}, DataType::kFloat32, ReduceOp::kSum,
                   [&](std::exception_ptr e) { p.set_value(e); });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const auto t0 = std::chrono::steady_clock::now();
    comm.shutdown();
    const auto took = std::chrono::steady_clock::now() - t0;
    auto f = p.get_future();
    if (f.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      return "the allreduce was not completed by shutdown";
    }
    auto e = f.get();
    if (!e) return "the allreduce succeeded without rank 1";
    try {
      std::rethrow_exception(e);
    } catch (const Error& err) {
      if (err.kind() != ErrorKind::kAborted) return std::string("not aborted: ") + err.what();
    }
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(took).count();
    if (ms > 1000) return "shutdown took " + std::to_string(ms) + " ms";
    return "";
  }, std::chrono::milliseconds(20000), std::chrono::seconds(60));
  INFO("path " << path);
  CHECK(results[0] == "");
  CHECK(results[1] == "");
}

TEST_CASE("setTimeout while the worker runs collectives, and the new timeout holds",
          "[stuck]") {
  // Under TSan (make test-tsan) the first half is the race check: another
  // thread changes the timeout while the worker reads it. The second half
  // checks the value is used: rank 1 skips a barrier, and rank 0 must time
  // out after the new 300 ms, not the group's 20 s.
  ScopedEnv shmPath("SMDDP_SHM_ALLREDUCE", "0");
  auto results = runWorld(2, [&](Communicator& comm) -> std::string {
    std::atomic<bool> done{false};
    std::thread setter([&] {
      int64_t ms = 20000;
      while (!done.load()) comm.setTimeout(std::chrono::milliseconds(ms++));
    });
    std::vector<float> v(4096);
    for (int i = 0; i < 50; ++i) {
      std::fill(v.begin(), v.end(), 1.0f);
      comm.allreduceSync({{v.data(), v.size()}}, DataType::kFloat32, ReduceOp::kSum);
      if (v[0] != 2.0f) return "wrong allreduce result " + std::to_string(v[0]);
    }
    done = true;
    setter.join();
    comm.setTimeout(std::chrono::milliseconds(300));
    if (comm.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(3));
      return "";
    }
    const auto t0 = std::chrono::steady_clock::now();
    std::string err = barrierSync(comm);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - t0).count();
    if (err.find("timeout of 300 ms") == std::string::npos) return "barrier: " + err;
    if (ms > 5000) return "the barrier took " + std::to_string(ms) + " ms to time out";
    return "";
  }, std::chrono::milliseconds(20000), std::chrono::seconds(60));
  CHECK(results[0] == "");
  CHECK(results[1] == "");
}

TEST_CASE("shutdown gives up on an engine thread stuck in a call it cannot interrupt",
          "[stuck]") {
  // A provider call cannot be interrupted (libfabric's shm send spins on
  // the region lock of a peer stopped while it holds it). The prepare hook
  // stands in for it: it ignores stop and holds the engine thread for 3 s.
  // shutdown() must return long before that, with the stuck call and a
  // call queued behind it failed as aborted, each exactly once; destroying
  // the Communicator afterwards waits for the thread to come back.
  auto results = runWorld(1, [&](Communicator& comm) -> std::string {
    std::atomic<bool> entered{false};
    float a = 1.0f, b = 2.0f;
    std::atomic<int> doneA{0}, doneB{0};
    std::string whyA, whyB;
    CallHooks hooks;
    hooks.prepare = [&] {
      entered = true;
      std::this_thread::sleep_for(std::chrono::seconds(3));
    };
    auto reason = [](std::exception_ptr e) -> std::string {
      if (!e) return "ok";
      try {
        std::rethrow_exception(e);
      } catch (const Error& ex) {
        return ex.kind() == ErrorKind::kAborted ? "aborted" : ex.what();
      } catch (...) {
        return "other";
      }
    };
    comm.allreduce({Buffer{&a, 1}}, DataType::kFloat32, ReduceOp::kSum,
                   [&](std::exception_ptr e) { whyA = reason(e); doneA++; }, hooks);
    comm.allreduce({Buffer{&b, 1}}, DataType::kFloat32, ReduceOp::kSum,
                   [&](std::exception_ptr e) { whyB = reason(e); doneB++; });
    while (!entered) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    auto t0 = std::chrono::steady_clock::now();
    comm.shutdown();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    // Let the thread come back and try to complete the call a second time.
    std::this_thread::sleep_for(std::chrono::milliseconds(3500));
    std::string out;
    if (ms > 1500) out += "shutdown took " + std::to_string(ms) + " ms; ";
    if (!comm.stuck()) out += "not reported stuck; ";
    if (doneA != 1 || whyA != "aborted") out += "stuck call: " + std::to_string(doneA.load()) + " completions, " + whyA + "; ";
    if (doneB != 1 || whyB != "aborted") out += "queued call: " + std::to_string(doneB.load()) + " completions, " + whyB + "; ";
    return out;
  });
  CHECK(results[0] == "");
}
