// The intra-host communicator (device/nccl_host.h), the code that drives
// NCCL on a GPU, on the simulated NCCL (device/sim_nccl.h): ranks are
// threads, each with a simulated device of its own, and the host's
// exchange is in memory. Results are checked against the closed form;
// NCCL's rules (a collective answered ncclInProgress, a call before the
// previous one returned ncclSuccess, a hung kernel and abort) against
// what NCCL's documentation says they do.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <thread>
#include <vector>

#include "device/nccl_host.h"
#include "device/sim_device.h"
#include "sim_waits.h"
#include "sim_nccl_host.h"

using namespace smddp;
using sim_waits::completes;
using namespace sim_nccl_test;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

std::string messageOf(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
}

ErrorKind kindOf(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& x) {
    return x.kind();
  } catch (...) {
    return ErrorKind::kInternal;
  }
}

// Runs body(rank) on one thread per rank, each bound to its device, and
// returns what each threw (null for none).
std::vector<std::exception_ptr> onRanks(const std::vector<std::shared_ptr<Device>>& devices,
                                        const std::function<void(int)>& body) {
  std::vector<std::exception_ptr> errors(devices.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < devices.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        devices[r]->bindThread();
        body(static_cast<int>(r));
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

std::vector<std::shared_ptr<Device>> simDevices(int n, bool launchBlocking = false) {
  std::vector<std::shared_ptr<Device>> out;
  for (int r = 0; r < n; ++r) {
    SimDeviceOptions o;
    o.index = r;
    o.maxDelay = std::chrono::microseconds(200);
    o.seed = 17 + static_cast<uint64_t>(r);
    o.launchBlocking = launchBlocking;
    out.push_back(makeSimDevice(o));
  }
  return out;
}

// Two ranks on launch-blocking simulated devices, their communicators
// formed (each rank's error, if any, in `formed`). Its end aborts what a
// failing run left hung before the communicators go.
struct TwoFormedRanks : SimNcclFixture {
  TwoFormedRanks(const SimNcclOptions& options, milliseconds timeout)
      : SimNcclFixture(options), devices(simDevices(2, /*launchBlocking=*/true)), comms(2) {
    const std::string id = api->uniqueId();
    formed = onRanks(devices, [&](int r) {
      comms[r] = newNcclIntraHost(api, devices[r]->name(), r, 2, id, timeout);
    });
  }
  ~TwoFormedRanks() { cleanUp(); }

  std::vector<std::shared_ptr<Device>> devices;
  std::vector<std::unique_ptr<IntraHost>> comms;
  std::vector<std::exception_ptr> formed;
};

}  // namespace

TEST_CASE("a collective NCCL answers ncclInProgress is queued before the work queued after it, "
          "and the next call is accepted",
          "[nccl]") {
  // The staging pipeline's use: reduce-scatter into a shard, copy the shard
  // to the host on the same stream, wait for that copy, then all-gather.
  constexpr int kRanks = 2, kRounds = 6;
  constexpr size_t kCount = 1000;
  for (int percent : {100, 50}) {
    INFO(percent << "% of calls answer ncclInProgress");
    SimNcclOptions o;
    o.inProgressPercent = percent;
    o.minDeferral = milliseconds(2);
    o.maxDeferral = milliseconds(10);
    o.seed = static_cast<uint64_t>(percent);
    SimNcclFixture nccl(o);
    auto& api = nccl.api;
    const std::string id = api->uniqueId();
    auto devices = simDevices(kRanks);
    std::atomic<int> wrongShards{0}, wrongGathers{0};
    auto value = [](int r, int round, size_t i) {
      return static_cast<float>(r * 100000 + round * 1000 + static_cast<int>(i % 997));
    };
    auto errors = onRanks(devices, [&](int r) {
      Device& dev = *devices[r];
      auto comm = newNcclIntraHost(api, dev.name(), r, kRanks, id, milliseconds(5000));
      DeviceStream& in = dev.poolStream(0);
      DeviceStream& out = dev.poolStream(1);
      for (int round = 0; round < kRounds; ++round) {
        std::vector<float> send(kRanks * kCount), shard(kCount, -1.0f), slot(kCount, -1.0f);
        std::vector<float> gathered(kRanks * kCount, -1.0f);
        for (size_t i = 0; i < send.size(); ++i) send[i] = value(r, round, i);
        comm->reduceScatter(in, send.data(), shard.data(), kCount, DataType::kFloat32, ReduceOp::kSum);
        in.copy(slot.data(), shard.data(), kCount * sizeof(float));
        DeviceEventPtr landed = in.record();
        if (!completes(landed, milliseconds(5000))) throw std::runtime_error("the shard never landed");
        for (size_t i = 0; i < kCount; ++i) {
          float want = 0;
          for (int p = 0; p < kRanks; ++p) want += value(p, round, r * kCount + i);
          if (slot[i] != want) {
            ++wrongShards;
            break;
          }
        }
        out.wait(landed);
        comm->allGather(out, shard.data(), gathered.data(), kCount, DataType::kFloat32);
        sim::synchronize(dev, milliseconds(5000));
        for (size_t j = 0; j < gathered.size(); ++j) {
          float want = 0;
          for (int p = 0; p < kRanks; ++p) want += value(p, round, j);
          if (gathered[j] != want) {
            ++wrongGathers;
            break;
          }
        }
      }
      comm->abort();
    });
    for (int r = 0; r < kRanks; ++r) {
      INFO("rank " << r << ": " << (errors[r] ? messageOf(errors[r]) : "no error"));
      CHECK_FALSE(errors[r]);
    }
    CHECK(wrongShards == 0);
    CHECK(wrongGathers == 0);
    CHECK(sim::violations().empty());
  }
}

TEST_CASE("a collective still in progress at the timeout aborts the communicator and fails "
          "naming the call",
          "[nccl]") {
  // Under CUDA_LAUNCH_BLOCKING NCCL's deferred launch waits for its kernel,
  // which waits for a peer that never issues its part: the call stays
  // ncclInProgress for good.
  SimNcclOptions o;
  o.inProgressPercent = 100;
  o.maxDeferral = milliseconds(2);
  TwoFormedRanks two(o, milliseconds(1000));
  auto& devices = two.devices;
  auto& comms = two.comms;
  auto& api = two.api;
  REQUIRE_FALSE(two.formed[0]);
  REQUIRE_FALSE(two.formed[1]);
  std::vector<float> send(8, 1.0f), shard(4, 0.0f);
  std::exception_ptr failed;
  double tookMs = 0;
  DeviceEventPtr behind;
  // Rank 0 alone issues its reduce-scatter; rank 1 is dead to it.
  auto errors = onRanks({devices[0]}, [&](int) {
    const auto start = Clock::now();
    try {
      comms[0]->reduceScatter(devices[0]->poolStream(0), send.data(), shard.data(), 4,
                              DataType::kFloat32, ReduceOp::kSum);
    } catch (...) {
      failed = std::current_exception();
    }
    tookMs = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  });
  REQUIRE_FALSE(errors[0]);
  REQUIRE(failed);
  INFO(messageOf(failed));
  CHECK(kindOf(failed) == ErrorKind::kTimeout);
  CHECK(messageOf(failed).find("ncclReduceScatter") != std::string::npos);
  CHECK(messageOf(failed).find("1000 ms") != std::string::npos);
  CHECK(tookMs >= 1000);
  CHECK(tookMs < 4000);
  // Aborted on the way out: the hung kernel is gone, the stream drains.
  auto drained = onRanks({devices[0]}, [&](int) {
    behind = devices[0]->poolStream(0).record();
    if (!completes(behind, milliseconds(2000))) throw std::runtime_error("the stream did not drain");
    comms[0]->checkHealthy();
  });
  REQUIRE(drained[0]);
  CHECK(kindOf(drained[0]) == ErrorKind::kAborted);
  comms[1]->abort();
  CHECK(sim::violations().empty());
}

TEST_CASE("abort returns at once while a launch under CUDA_LAUNCH_BLOCKING waits for a dead "
          "peer, and the launch then fails",
          "[nccl]") {
  SimNcclOptions o;
  o.inProgressPercent = 0;
  TwoFormedRanks two(o, milliseconds(5000));
  auto& devices = two.devices;
  auto& comms = two.comms;
  auto& api = two.api;
  REQUIRE_FALSE(two.formed[0]);
  REQUIRE_FALSE(two.formed[1]);
  // Rank 0's launch blocks: its kernel waits for rank 1, which never comes.
  std::vector<float> send(8, 1.0f), shard(4, 0.0f);
  std::promise<std::exception_ptr> launched;
  auto result = launched.get_future();
  std::thread launcher([&] {
    devices[0]->bindThread();
    try {
      comms[0]->reduceScatter(devices[0]->poolStream(0), send.data(), shard.data(), 4,
                              DataType::kFloat32, ReduceOp::kSum);
      launched.set_value(nullptr);
    } catch (...) {
      launched.set_value(std::current_exception());
    }
  });
  REQUIRE(result.wait_for(milliseconds(300)) == std::future_status::timeout);  // it blocks
  // Shutdown's abort, from another thread, must not wait for the launch.
  auto aborted = std::async(std::launch::async, [&] { comms[0]->abort(); });
  const bool abortReturned = aborted.wait_for(milliseconds(2000)) == std::future_status::ready;
  CHECK(abortReturned);
  if (!abortReturned) api->abortAll();  // end the hang the code under test left
  REQUIRE(result.wait_for(milliseconds(2000)) == std::future_status::ready);
  std::exception_ptr e = result.get();
  launcher.join();
  aborted.wait();
  REQUIRE(e);
  INFO(messageOf(e));
  CHECK(kindOf(e) == ErrorKind::kAborted);
  CHECK(messageOf(e).find("abort") != std::string::npos);
  comms[1]->abort();
  CHECK(sim::violations().empty());
}

TEST_CASE("an asynchronous NCCL error fails the health check naming it", "[nccl]") {
  SimNcclOptions o;
  o.inProgressPercent = 0;
  o.failCollective = 0;
  SimNcclFixture nccl(o);
  auto& api = nccl.api;
  auto devices = simDevices(1);
  std::vector<float> send(4, 1.0f), recv(4, 0.0f);
  std::exception_ptr seen;
  auto errors = onRanks(devices, [&](int) {
    auto comm = newNcclIntraHost(api, devices[0]->name(), 0, 1, api->uniqueId(), milliseconds(5000));
    comm->allGather(devices[0]->poolStream(0), send.data(), recv.data(), 4, DataType::kFloat32);
    const auto deadline = Clock::now() + milliseconds(3000);
    while (!seen && Clock::now() < deadline) {
      try {
        comm->checkHealthy();
        std::this_thread::sleep_for(milliseconds(1));
      } catch (...) {
        seen = std::current_exception();
      }
    }
    comm->abort();
  });
  REQUIRE_FALSE(errors[0]);
  REQUIRE(seen);
  INFO(messageOf(seen));
  CHECK(messageOf(seen).find("ncclSystemError") != std::string::npos);
  CHECK(sim::violations().empty());
}

TEST_CASE("a communicator whose peer never comes times out within the timeout", "[nccl]") {
  SimNcclOptions o;
  o.inProgressPercent = 100;
  SimNcclFixture nccl(o);
  auto& api = nccl.api;
  auto devices = simDevices(1);
  std::exception_ptr failed;
  double tookMs = 0;
  (void)onRanks(devices, [&](int) {
    const auto start = Clock::now();
    try {
      (void)newNcclIntraHost(api, devices[0]->name(), 0, 2, api->uniqueId(), milliseconds(300));
    } catch (...) {
      failed = std::current_exception();
    }
    tookMs = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  });
  REQUIRE(failed);
  INFO(messageOf(failed));
  CHECK(kindOf(failed) == ErrorKind::kTimeout);
  CHECK(messageOf(failed).find("300 ms") != std::string::npos);
  CHECK(tookMs >= 300);
  CHECK(tookMs < 3000);
  CHECK(api->abortAll() == 0);  // aborted on the way out
  CHECK(sim::violations().empty());
}
