// The simulated device's own rules (sim_device.h): the stand-in is only
// worth its tests if it breaks where CUDA would. Each case sets up a
// situation a GPU rejects or serializes, and checks the stand-in does too:
// hardware queues, thread binding, capture, lifetimes, launch blocking.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <thread>

#include "common/error.h"
#include "device/sim_device.h"
#include "sim_waits.h"

using namespace smddp;
using sim_waits::completes;
using sim_waits::mentions;
using std::chrono::milliseconds;

namespace {

}  // namespace

TEST_CASE("a kernel blocking the head of a hardware queue holds back every stream behind it",
          "[sim]") {
  for (int queues : {1, 2}) {
    INFO(queues << " hardware queues");
    SimDeviceOptions o;
    o.queues = queues;
    auto dev = makeSimDevice(o);
    auto a = sim::newStream(*dev);  // stream ids follow the pool's: a and b
    auto b = sim::newStream(*dev);  // land on different queues when there are 2
    std::promise<void> release;
    auto released = release.get_future().share();
    sim::hostKernel(*a, [released] { released.wait(); });
    DeviceEventPtr behind = b->record();
    const bool ran = completes(behind, milliseconds(300));
    CHECK(ran == (queues > 1));
    release.set_value();
    CHECK(completes(behind, milliseconds(2000)));
  }
}

TEST_CASE("a thread that touches a device other than its current one breaks the rules", "[sim]") {
  sim::clearViolations();
  SimDeviceOptions o;
  o.index = 3;
  auto dev = makeSimDevice(o);
  std::thread([&] {
    // A new thread's current device is 0, as with CUDA.
    CHECK_THROWS_WITH(dev->poolStream(0).record(), Catch::Contains("sim:3"));
    CHECK(mentions(sim::violations(), "current device is sim:0"));
    sim::clearViolations();
    dev->bindThread();
    CHECK(sim::currentDevice() == 3);
    CHECK(completes(dev->poolStream(0).record(), milliseconds(1000)));
  }).join();
  CHECK(sim::violations().empty());
}

TEST_CASE("restoring a device makes no context where there was none (MaybeSetDevice)", "[sim]") {
  std::thread([] {
    const int previous = sim::exchangeDevice(7);
    CHECK(previous == 0);
    sim::maybeSetDevice(9);  // never used by this process: skipped
    CHECK(sim::currentDevice() == 7);
    const auto contexts = sim::contexts();
    CHECK(std::count(contexts.begin(), contexts.end(), 7) == 1);
    CHECK(std::count(contexts.begin(), contexts.end(), 9) == 0);
  }).join();
}

TEST_CASE("while a stream captures, an event query or host wait from a thread not relaxed breaks the rules",
          "[sim]") {
  sim::clearViolations();
  auto dev = makeSimDevice();
  DeviceEventPtr before = dev->poolStream(0).record();
  REQUIRE(completes(before, milliseconds(1000)));
  sim::beginCapture(*dev);
  CHECK(sim::isCapturing(*dev, sim::currentStream(*dev)));
  std::thread([&] {
    CHECK_THROWS_WITH(before->query(), Catch::Contains("captures a graph"));
    CHECK_THROWS_WITH(sim::synchronize(*dev, milliseconds(100)), Catch::Contains("captures a graph"));
  }).join();
  CHECK(mentions(sim::violations(), "an event query"));
  sim::clearViolations();
  std::thread([&] {
    dev->bindThread();  // relaxed, as the library's own threads are
    CHECK(before->query());
  }).join();
  sim::endCapture(*dev);
  CHECK_FALSE(sim::isCapturing(*dev, sim::currentStream(*dev)));
  CHECK(before->query());
  CHECK(sim::violations().empty());
}

TEST_CASE("destroying streams and events with work pending, or a recorded stream, breaks the rules",
          "[sim]") {
  sim::clearViolations();
  auto dev = makeSimDevice();
  std::promise<void> release;
  auto released = release.get_future().share();
  {
    auto s = sim::newStream(*dev);
    sim::hostKernel(*s, [released] { released.wait(); });
    DeviceEventPtr pending = s->record();
    pending.reset();
    CHECK(mentions(sim::violations(), "event of sim:0 was destroyed with its work still pending"));
  }
  CHECK(mentions(sim::violations(), "destroyed with 2 operations pending"));
  release.set_value();
  sim::synchronize(*dev, milliseconds(2000));
  sim::clearViolations();

  auto alive = std::make_shared<int>(1);
  std::weak_ptr<int> tensor = alive;
  {
    auto s = sim::newStream(*dev);
    sim::recordStream(*s, [tensor] { return !tensor.expired(); });
  }
  CHECK(mentions(sim::violations(), "recordStream still refers to it"));
  sim::clearViolations();
  {
    auto s = sim::newStream(*dev);
    sim::recordStream(*s, [tensor] { return !tensor.expired(); });
    alive.reset();  // the tensor went first: fine
  }
  CHECK(sim::violations().empty());
}

TEST_CASE("a copy into page-locked memory already freed breaks the rules", "[sim]") {
  sim::clearViolations();
  SimDeviceOptions o;
  o.maxDelay = std::chrono::microseconds(20000);
  o.queues = 1;
  auto dev = makeSimDevice(o);
  std::vector<char> src(4096, 1);
  auto host = dev->allocHost(4096);
  dev->poolStream(0).copy(host.get(), src.data(), src.size());
  host.reset();  // freed while the copy is queued
  sim::synchronize(*dev, milliseconds(5000));
  CHECK(mentions(sim::violations(), "already freed"));
  sim::clearViolations();
}

TEST_CASE("under CUDA_LAUNCH_BLOCKING each operation has run when it returns", "[sim]") {
  SimDeviceOptions o;
  o.maxDelay = std::chrono::microseconds(2000);
  o.launchBlocking = true;
  auto dev = makeSimDevice(o);
  std::vector<int> dst(256, 0), src(256, 4);
  dev->poolStream(1).copy(dst.data(), src.data(), src.size() * sizeof(int));
  CHECK(dst[255] == 4);  // no synchronize needed
  CHECK(dev->poolStream(2).record()->query());
}
