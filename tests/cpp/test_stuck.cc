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

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "common/error.h"
#include "algorithms/collective_calls.h"
#include "engine/communicator.h"
#include "engine/exchange.h"
#include "world.h"

using namespace smddp;
using smddp::test::barrierSync;
using smddp::test::runWorld;
using smddp::test::ScopedEnv;

namespace {

constexpr uint64_t kSeq = 1000;  // far from the queue's own sequence numbers
constexpr size_t kChunk = 4 << 20;
constexpr uint32_t kChunks = 16;
constexpr uint8_t kGuard = 0xa5;

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
    // This thread drives the endpoint itself: the idle engine keeps off it.
    const Communicator::EndpointHold hold(comm);
    std::vector<uint8_t> mem(kChunk * kChunks, 0);
    if (comm.rank() == 1) {
      for (size_t i = 0; i < mem.size(); ++i) mem[i] = static_cast<uint8_t>(i * 7 + 1);
      // Sends whose receives were cancelled never complete: this run ends
      // in its (short) timeout, which is expected.
      Exchange ex(comm.context(), kSeq, sig, std::chrono::milliseconds(4000));
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
      Exchange ex(comm.context(), kSeq, sig);
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
      if (comm.context().progress() == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
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

TEST_CASE("a failed call's memory outlives the sends it left posted", "[stuck][held]") {
  // Rank 0 broadcasts 16 MiB from a buffer that only the call's completion
  // owns, as the torch backend's staging does. Rank 1 reports a failure of
  // that call before receiving anything, so rank 0's call fails with its
  // sends posted: rxm waits for rank 1's rendezvous read, shm for rank 1
  // to pull the data (CMA). Rank 1 then runs
  // the same broadcast after all and reads every byte, while rank 0's
  // engine serves it from the memory of the call that failed.
  //
  // Without the hold, rank 0 frees the buffer (16 MiB: unmapped) when the
  // completion is destroyed: rank 1 then reads bytes that are not the
  // pattern, or fails, or rank 0's provider faults (ASan: use after free).
  // With it, the completion stays alive until the sends complete, and the
  // counters say how each abandoned send was accounted for. What this
  // cannot see: a provider that reads the buffer from inside fi_close.
  //
  // shm without CMA (bounce buffers, FI_SHM_DISABLE_CMA=1) is left out: with
  // libfabric 1.17 the transfer of a send whose call failed before the
  // receiver matched it never resumes once the receiver posts (rank 1's
  // broadcast then times out), so there is nothing to read late; the
  // memory stays held until shutdown there.
  const std::string provider = GENERATE(std::string("shm"), std::string("tcp;ofi_rxm"));
  ScopedEnv prov("SMDDP_FI_PROVIDER", provider);
  ScopedEnv noShmPath("SMDDP_SHM_ALLREDUCE", "0");
  constexpr size_t kBytes = 16 << 20;
  auto pattern = [](size_t i) { return static_cast<uint8_t>((i * 131) ^ (i >> 11)); };
  char tmpl[] = "/tmp/smddp-held-XXXXXX";
  const std::string flags = mkdtemp(tmpl);
  auto setFlag = [&](const std::string& f) { std::ofstream(flags + "/" + f) << "1"; };
  auto waitFlag = [&](const std::string& f) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (access((flags + "/" + f).c_str(), F_OK) != 0) {
      if (std::chrono::steady_clock::now() > until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  };
  auto results = runWorld(2, [&](Communicator& comm) -> std::string {
    if (comm.rank() == 1) {
      // Rank 0's sends are posted by now; nothing is queued here, so this
      // thread may use the endpoint, the idle engine kept off it.
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      {
        const Communicator::EndpointHold hold(comm);
        comm.context().control().broadcastError(0, "test: rank 1 gives up on this call", 1, false);
      }
      if (!waitFlag("failed")) return "rank 0 never reported its failed call";
      std::vector<uint8_t> got(kBytes, 0);
      std::promise<std::exception_ptr> p;
      broadcast(comm, {{got.data(), kBytes}}, DataType::kUInt8, 0,
                     [&](std::exception_ptr e) { p.set_value(e); });
      if (auto e = p.get_future().get()) {
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& ex) {
          return std::string("rank 1's broadcast failed: ") + ex.what();
        }
      }
      for (size_t i = 0; i < kBytes; ++i) {
        if (got[i] != pattern(i)) {
          return "byte " + std::to_string(i) + " of what rank 0's failed call sent is not the "
                 "pattern: its memory was released while the send was posted";
        }
      }
      for (int i = 0; i < 5; ++i) {
        std::string err = barrierSync(comm);
        if (!err.empty()) return "barrier: " + err;
      }
      return "";
    }
    auto mem = std::make_shared<std::vector<uint8_t>>(kBytes);
    for (size_t i = 0; i < kBytes; ++i) (*mem)[i] = pattern(i);
    std::weak_ptr<std::vector<uint8_t>> watch = mem;
    std::promise<std::exception_ptr> p;
    uint8_t* data = mem->data();
    broadcast(comm, {{data, kBytes}}, DataType::kUInt8, 0,
                   [&p, keep = std::move(mem)](std::exception_ptr e) { p.set_value(e); });
    auto e = p.get_future().get();
    if (!e) return "rank 0's broadcast succeeded although rank 1 reported a failure";
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the worker moves on
    const Stats s = comm.stats();
    std::string why;
    if (s.abandonedSends == 0) why = "no send was counted as abandoned";
    else if (s.abandonedSendsConfirmed + s.abandonedSendsHeld != s.abandonedSends)
      why = "abandoned sends " + std::to_string(s.abandonedSends) + " != confirmed " +
            std::to_string(s.abandonedSendsConfirmed) + " + held " +
            std::to_string(s.abandonedSendsHeld);
    else if (s.abandonedSendsHeld == 0)
      why = "every send was confirmed although rank 1 had not read anything";
    else if (watch.expired())
      why = "the failed call's memory was released while " +
            std::to_string(s.abandonedSendsHeld) + " of its sends were posted";
    setFlag("failed");
    // Rank 1 reads everything now; the barriers keep this engine polling
    // (rank 1 joins them only once its broadcast is complete), so the held
    // sends complete and release the memory: held, not leaked for good.
    // Even when the memory was released, this goes on serving rank 1's
    // reads, so that ASan sees the provider read freed memory here.
    for (int i = 0; i < 5; ++i) {
      std::string err = barrierSync(comm);
      if (!err.empty()) return why.empty() ? "barrier: " + err : why;
    }
    if (!why.empty()) return why;
    if (!watch.expired()) return "the memory was still held after its sends completed";
    return "";
  }, std::chrono::milliseconds(20000), std::chrono::seconds(90));
  std::string cmd = "rm -rf '" + flags + "'";
  if (std::system(cmd.c_str()) != 0) {
  }
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
