// The simulated NCCL's own rules (device/sim_nccl.h): it is only worth the
// tests of the code that drives NCCL if it breaks where NCCL would. Each
// case calls the API directly and checks what NCCL's documentation says:
// ncclInProgress and the call refused before the previous one returned
// ncclSuccess, a kernel that hangs on a dead peer until the abort, issue
// order across streams, communicators sharing hardware queues, asynchronous
// errors, and no use after abort.
#include <catch2/catch.hpp>

#include <chrono>
#include <thread>
#include <vector>

#include "device/sim_device.h"
#include "sim_waits.h"
#include "sim_nccl_host.h"

using namespace smddp;
using sim_waits::completes;
using sim_waits::mentions;
using namespace sim_nccl_test;
using std::chrono::milliseconds;

namespace {

// Polls the communicator's state until it leaves kInProgress.
NcclResult settled(NcclApi& api, NcclComm comm, milliseconds within) {
  const auto deadline = std::chrono::steady_clock::now() + within;
  NcclResult state = NcclResult::kInProgress;
  while (std::chrono::steady_clock::now() < deadline) {
    REQUIRE(api.commGetAsyncError(comm, &state) == NcclResult::kSuccess);
    if (state != NcclResult::kInProgress) break;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return state;
}

}  // namespace

TEST_CASE("the simulated NCCL answers ncclInProgress and refuses a call before the previous "
          "one returned ncclSuccess",
          "[sim]") {
  SimNcclOptions o;
  o.inProgressPercent = 100;
  o.minDeferral = std::chrono::milliseconds(100);
  o.maxDeferral = std::chrono::milliseconds(150);
  SimNcclFixture nccl(o);
  auto& api = nccl.api;
  auto dev = makeSimDevice({});
  sim::setDevice(0);
  DeviceStream& stream = dev->poolStream(0);

  NcclComm comm = nullptr;
  REQUIRE(api->commInitRankNonBlocking(&comm, 1, api->uniqueId(), 0) == NcclResult::kInProgress);
  std::vector<float> send(8, 3.0f), recv(8, 0.0f);
  // Too early: NCCL's "use of communicator before the previous operation
  // returned ncclSuccess".
  CHECK(api->reduceScatter(send.data(), recv.data(), 8, DataType::kFloat32, ReduceOp::kSum, comm,
                           stream) == NcclResult::kInvalidArgument);
  CHECK(api->lastError(comm).find("previous operation") != std::string::npos);
  CHECK(mentions(sim::violations(), "before the previous operation returned ncclSuccess"));
  REQUIRE(settled(*api, comm, milliseconds(2000)) == NcclResult::kSuccess);

  // A collective answered kInProgress is not queued yet: what the caller
  // queues behind it on the same stream runs first.
  REQUIRE(api->reduceScatter(send.data(), recv.data(), 8, DataType::kFloat32, ReduceOp::kSum, comm,
                             stream) == NcclResult::kInProgress);
  DeviceEventPtr behind = stream.record();
  REQUIRE(completes(behind, milliseconds(2000)));
  CHECK(recv[0] == 0.0f);  // the kernel has not run
  REQUIRE(settled(*api, comm, milliseconds(2000)) == NcclResult::kSuccess);
  DeviceEventPtr after = stream.record();
  REQUIRE(completes(after, milliseconds(2000)));
  CHECK(recv == send);  // one rank: its own data
  CHECK(api->commDestroy(comm) == NcclResult::kSuccess);
  sim::clearViolations();
}

TEST_CASE("a simulated collective with a dead peer holds its hardware queue until the "
          "communicator is aborted",
          "[sim]") {
  SimNcclOptions o;
  o.inProgressPercent = 0;
  o.abortGrace = milliseconds(200);
  SimNcclFixture nccl(o);
  auto& api = nccl.api;
  SimDeviceOptions d;
  d.queues = 1;
  auto dev = makeSimDevice(d);
  sim::setDevice(0);
  const std::string id = api->uniqueId();
  NcclComm comm = nullptr, peer = nullptr;
  // Both ranks join (the peer from another thread: init blocks until all have).
  NcclResult joined = NcclResult::kInternalError;
  std::thread joiner([&] {
    sim::setDevice(0);
    joined = api->commInitRankNonBlocking(&peer, 2, id, 1);
  });
  REQUIRE(api->commInitRankNonBlocking(&comm, 2, id, 0) == NcclResult::kSuccess);
  joiner.join();
  REQUIRE(joined == NcclResult::kSuccess);
  // Rank 1 dies: it never issues its collective.
  std::vector<float> send(8, 1.0f), recv(4, 0.0f);
  REQUIRE(api->reduceScatter(send.data(), recv.data(), 4, DataType::kFloat32, ReduceOp::kSum, comm,
                             dev->poolStream(0)) == NcclResult::kSuccess);
  DeviceEventPtr other = dev->poolStream(1).record();  // another stream, the same queue
  CHECK_FALSE(completes(other, milliseconds(300)));
  NcclResult state = NcclResult::kInternalError;
  REQUIRE(api->commGetAsyncError(comm, &state) == NcclResult::kSuccess);
  CHECK(state == NcclResult::kSuccess);  // nobody tells: NVLink has no one to ask
  const auto start = std::chrono::steady_clock::now();
  CHECK(api->commAbort(comm) == NcclResult::kSuccess);
  CHECK(std::chrono::steady_clock::now() - start < milliseconds(1000));
  CHECK(completes(other, milliseconds(2000)));
  CHECK(recv[0] == 0.0f);  // an aborted kernel leaves garbage, never a result
  // A call that raced the abort is refused; past the grace, using the
  // communicator after the abort is a broken rule.
  CHECK(api->commGetAsyncError(comm, &state) == NcclResult::kInvalidUsage);
  CHECK_FALSE(mentions(sim::violations(), "aborted, destroyed or never made"));
  std::this_thread::sleep_for(milliseconds(250));
  CHECK(api->commGetAsyncError(comm, &state) == NcclResult::kInvalidArgument);
  CHECK(mentions(sim::violations(), "aborted, destroyed or never made"));
  CHECK(api->commAbort(peer) == NcclResult::kSuccess);
  sim::clearViolations();
}

TEST_CASE("simulated communicators order their kernels across streams and share the hardware "
          "queues, so two issued in different orders deadlock until aborted",
          "[sim]") {
  SimNcclOptions o;
  o.inProgressPercent = 0;
  SimNcclFixture nccl(o);
  auto& api = nccl.api;
  SimDeviceOptions d;
  d.queues = 1;
  d.index = 0;
  auto dev0 = makeSimDevice(d);
  d.index = 1;
  auto dev1 = makeSimDevice(d);
  const std::string a = api->uniqueId(), b = api->uniqueId();
  NcclComm a0 = nullptr, a1 = nullptr, b0 = nullptr, b1 = nullptr;
  // Rank 1's side, on a thread bound to its device; its answers in `r1`.
  std::vector<NcclResult> r1;
  auto onRank1 = [&](auto body) {
    std::thread t([&] {
      sim::setDevice(1);
      body();
    });
    t.join();
  };
  // Init blocks until both ranks have come: rank 1 joins from its thread.
  std::thread init1([&] {
    sim::setDevice(1);
    r1.push_back(api->commInitRankNonBlocking(&a1, 2, a, 1));
    r1.push_back(api->commInitRankNonBlocking(&b1, 2, b, 1));
  });
  sim::setDevice(0);
  REQUIRE(api->commInitRankNonBlocking(&a0, 2, a, 0) == NcclResult::kSuccess);
  REQUIRE(api->commInitRankNonBlocking(&b0, 2, b, 0) == NcclResult::kSuccess);
  init1.join();
  std::vector<float> s0(4, 1.0f), s1(4, 2.0f), ra0(4), rb0(4), ra1(4), rb1(4);
  // Rank 0 issues A then B, rank 1 B then A, each on a stream of its own
  // per communicator: with one hardware queue each device's head waits for
  // the other's.
  REQUIRE(api->allGather(s0.data(), ra0.data(), 2, DataType::kFloat32, a0, dev0->poolStream(0)) ==
          NcclResult::kSuccess);
  REQUIRE(api->allGather(s0.data(), rb0.data(), 2, DataType::kFloat32, b0, dev0->poolStream(1)) ==
          NcclResult::kSuccess);
  DeviceEventPtr done0 = dev0->poolStream(1).record();
  DeviceEventPtr done1;
  onRank1([&] {
    r1.push_back(api->allGather(s1.data(), rb1.data(), 2, DataType::kFloat32, b1, dev1->poolStream(1)));
    r1.push_back(api->allGather(s1.data(), ra1.data(), 2, DataType::kFloat32, a1, dev1->poolStream(0)));
    done1 = dev1->poolStream(0).record();
  });
  CHECK_FALSE(completes(done0, milliseconds(400)));
  CHECK_FALSE(completes(done1, milliseconds(10)));
  for (NcclComm c : {a0, b0, a1, b1}) CHECK(api->commAbort(c) == NcclResult::kSuccess);
  CHECK(completes(done0, milliseconds(2000)));
  CHECK(completes(done1, milliseconds(2000)));

  // One communicator, its calls issued in the same order on both ranks but
  // on different streams: they complete.
  NcclComm c0 = nullptr, c1 = nullptr;
  const std::string c = api->uniqueId();
  std::thread r1c([&] {
    sim::setDevice(1);
    r1.push_back(api->commInitRankNonBlocking(&c1, 2, c, 1));
    r1.push_back(api->allGather(s1.data(), ra1.data(), 2, DataType::kFloat32, c1, dev1->poolStream(0)));
    r1.push_back(api->allGather(s1.data(), rb1.data(), 2, DataType::kFloat32, c1, dev1->poolStream(1)));
    sim::synchronize(*dev1, milliseconds(5000));
  });
  REQUIRE(api->commInitRankNonBlocking(&c0, 2, c, 0) == NcclResult::kSuccess);
  REQUIRE(api->allGather(s0.data(), ra0.data(), 2, DataType::kFloat32, c0, dev0->poolStream(1)) ==
          NcclResult::kSuccess);
  REQUIRE(api->allGather(s0.data(), rb0.data(), 2, DataType::kFloat32, c0, dev0->poolStream(0)) ==
          NcclResult::kSuccess);
  sim::synchronize(*dev0, milliseconds(5000));
  r1c.join();
  CHECK(r1 == std::vector<NcclResult>(7, NcclResult::kSuccess));
  const std::vector<float> want{1, 1, 2, 2};
  CHECK(ra0 == want);
  CHECK(rb0 == want);
  CHECK(ra1 == want);
  CHECK(rb1 == want);
  CHECK(api->commDestroy(c0) == NcclResult::kSuccess);
  CHECK(api->commDestroy(c1) == NcclResult::kSuccess);
  sim::clearViolations();
}

TEST_CASE("a simulated asynchronous error shows through ncclCommGetAsyncError, and its kernel "
          "hangs until the abort",
          "[sim]") {
  SimNcclOptions o;
  o.inProgressPercent = 0;
  o.failCollective = 1;
  SimNcclFixture nccl(o);
  auto& api = nccl.api;
  auto dev = makeSimDevice({});
  sim::setDevice(0);
  NcclComm comm = nullptr;
  REQUIRE(api->commInitRankNonBlocking(&comm, 1, api->uniqueId(), 0) == NcclResult::kSuccess);
  std::vector<float> send(4, 5.0f), recv(4, 0.0f), again(4, 0.0f);
  DeviceStream& stream = dev->poolStream(0);
  REQUIRE(api->allGather(send.data(), recv.data(), 4, DataType::kFloat32, comm, stream) ==
          NcclResult::kSuccess);
  REQUIRE(api->allGather(send.data(), again.data(), 4, DataType::kFloat32, comm, stream) ==
          NcclResult::kSuccess);
  DeviceEventPtr behind = stream.record();
  CHECK_FALSE(completes(behind, milliseconds(300)));
  CHECK(recv == send);  // the first ran
  NcclResult state = NcclResult::kSuccess;
  REQUIRE(api->commGetAsyncError(comm, &state) == NcclResult::kSuccess);
  CHECK(state == NcclResult::kSystemError);
  CHECK(api->lastError(comm).find("simulated failure of collective 1") != std::string::npos);
  // Every later call answers the error, as NCCL's do.
  CHECK(api->allGather(send.data(), again.data(), 4, DataType::kFloat32, comm, stream) ==
        NcclResult::kSystemError);
  CHECK(api->commAbort(comm) == NcclResult::kSuccess);
  CHECK(completes(behind, milliseconds(2000)));
  sim::clearViolations();
}
