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
#include "sim_nccl_host.h"

using namespace smddp;
using namespace sim_nccl_test;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

bool completes(const DeviceEventPtr& e, milliseconds within) {
  const auto deadline = Clock::now() + within;
  while (!e->query()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return true;
}

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

}  // namespace

TEST_CASE("an asynchronous NCCL error fails the health check naming it", "[nccl]") {
  sim::clearViolations();
  InMemoryHost host;
  SimNcclOptions o;
  o.inProgressPercent = 0;
  o.failCollective = 0;
  auto api = std::make_shared<RecordingNccl>(makeSimNccl(o, host.connect()));
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
  api->abortAll();
  host.release();
}

TEST_CASE("a communicator whose peer never comes times out within the timeout", "[nccl]") {
  sim::clearViolations();
  InMemoryHost host;
  SimNcclOptions o;
  o.inProgressPercent = 100;
  auto api = std::make_shared<RecordingNccl>(makeSimNccl(o, host.connect()));
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
  host.release();
}
