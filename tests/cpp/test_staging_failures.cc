// The staging pipeline's failure and shutdown paths on the simulated
// device: host work that throws, copies that never land, shutdown with calls
// queued, host work that does not return, and memory that copies still use.
// The oracles are the causes each done() gets, that every call gets exactly
// one, what the outputs hold, how soon each finishes, and the stand-in's
// record of broken rules (a copy into freed memory).
#include "staging_harness.h"

using namespace staging_test;

TEST_CASE("host work that throws fails the call and every later one, and no output gets staging",
          "[staging]") {
  constexpr size_t kChunk = 256 << 10;
  constexpr size_t kFloats = 8 * kChunk / sizeof(float);
  constexpr size_t kPerChunk = kChunk / sizeof(float);
  std::vector<float> device(kFloats, 1.0f), second(kFloats, 1.0f);
  std::vector<size_t> ran;  // only the pipeline thread writes it
  Dones dones;
  auto dev = makeSimDevice(simDelays(100, 1));
  StagingPipeline pipeline(dev, slotRing(3, kChunk));
  StagingCall call = inPlaceCall("failing call", device.data(), kFloats, kChunk,
                                 [&ran](size_t k, float* x, size_t n) {
                                   ran.push_back(k);
                                   if (k == 3) throw Error(ErrorKind::kPeerLost, "rank 1 died");
                                   for (size_t i = 0; i < n; ++i) x[i] = 5;
                                 });
  REQUIRE(call.chunks.size() == 8);
  call.done = dones.callback(0);
  const auto start = Clock::now();
  pipeline.submit(std::move(call));
  // Queued behind it: fails with the same cause.
  StagingCall next = inPlaceCall("queued call", second.data(), kFloats, kChunk,
                                 [&ran](size_t k, float*, size_t) { ran.push_back(100 + k); });
  next.done = dones.callback(1);
  pipeline.submit(std::move(next));

  REQUIRE(dones.waitFor(2, milliseconds(2000)));
  INFO("failed after " << msSince(start) << " ms");
  auto calls = dones.snapshot();
  REQUIRE(calls.size() == 2);
  REQUIRE(calls[0].cause);
  CHECK(errorOf(calls[0].cause).kind() == ErrorKind::kPeerLost);
  CHECK(std::string(errorOf(calls[0].cause).what()) == "rank 1 died");
  CHECK_FALSE(calls[0].event);
  CHECK(calls[1].cause == calls[0].cause);
  CHECK(pipeline.broken() == calls[0].cause);
  CHECK(ran == std::vector<size_t>{0, 1, 2, 3});

  // The chunks before the failure went back; the failed one and every
  // later one were never written, whatever the slots held.
  sim::synchronize(*dev, milliseconds(5000));
  size_t wrong = 0;
  for (size_t i = 0; i < kFloats; ++i) wrong += device[i] != (i < 3 * kPerChunk ? 5.0f : 1.0f);
  for (float x : second) wrong += x != 1.0f;
  CHECK(wrong == 0);

  // A later call fails at once with the same cause.
  StagingCall later = inPlaceCall("later call", second.data(), kFloats, kChunk,
                                  [&ran](size_t k, float*, size_t) { ran.push_back(200 + k); });
  later.done = dones.callback(2);
  const auto submitted = Clock::now();
  pipeline.submit(std::move(later));
  REQUIRE(dones.waitFor(3, milliseconds(1000)));
  CHECK(msSince(submitted) < 100);
  CHECK(dones.snapshot()[2].cause == calls[0].cause);
  CHECK(ran.size() == 4);
}

TEST_CASE("copies in that never land time the call out", "[staging]") {
  constexpr size_t kChunk = 64 << 10;
  std::vector<float> device(4 * kChunk / sizeof(float), 1.0f);
  SimDeviceOptions so = simDelays(50, 1);
  so.hangCopy = 1;  // queued second: chunk 1's copy in (two slots: both go first)
  StagingOptions po = slotRing(2, kChunk);
  po.timeout = milliseconds(300);
  Dones dones;
  auto pipeline = std::make_unique<StagingPipeline>(makeSimDevice(so), po);
  StagingCall call = inPlaceCall("allreduce of 256 KiB", device.data(), device.size(), kChunk,
                                 [](size_t, float*, size_t) {});
  call.done = dones.callback(0);
  const auto start = Clock::now();
  pipeline->submit(std::move(call));
  REQUIRE(dones.waitFor(1, milliseconds(2000)));
  const double took = msSince(start);
  INFO("timed out after " << took << " ms");
  CHECK(took >= 290);
  CHECK(took < 2000);
  const Error e = errorOf(dones.snapshot()[0].cause);
  CHECK(e.kind() == ErrorKind::kTimeout);
  const std::string msg = e.what();
  INFO(msg);
  CHECK(msg.find("allreduce of 256 KiB") != std::string::npos);
  CHECK(msg.find("chunk 1 ") != std::string::npos);
  CHECK(msg.find("sim") != std::string::npos);

  const auto destroyed = Clock::now();
  pipeline.reset();  // the stalled queue must not hold up the pipeline's end
  CHECK(msSince(destroyed) < 1000);
}

TEST_CASE("shutdown aborts queued calls promptly while a copy hangs", "[staging]") {
  constexpr size_t kChunk = 64 << 10;
  std::vector<float> device(3 * kChunk / sizeof(float), 1.0f);
  SimDeviceOptions so = simDelays(50, 1);
  so.hangCopy = 0;  // the first call's first copy in
  Dones dones;
  std::atomic<int> ran{0};
  auto pipeline = std::make_unique<StagingPipeline>(makeSimDevice(so), slotRing(2, kChunk));
  for (int i = 0; i < 3; ++i) {
    StagingCall call = inPlaceCall("call " + std::to_string(i), device.data(), device.size(),
                                   kChunk, [&](size_t, float*, size_t) { ++ran; });
    call.done = dones.callback(i);
    pipeline->submit(std::move(call));
  }
  std::this_thread::sleep_for(milliseconds(50));  // the thread is waiting on the hung copy
  CHECK(dones.snapshot().empty());

  auto start = Clock::now();
  pipeline->shutdown();
  const double took = msSince(start);
  INFO("shutdown took " << took << " ms");
  CHECK(took < 500);
  auto calls = dones.snapshot();
  REQUIRE(calls.size() == 3);
  for (int i = 0; i < 3; ++i) {
    CHECK(calls[i].id == i);
    CHECK(errorOf(calls[i].cause).kind() == ErrorKind::kAborted);
  }
  CHECK(ran == 0);

  start = Clock::now();
  pipeline->shutdown();  // idempotent
  pipeline.reset();
  CHECK(msSince(start) < 500);
  CHECK(dones.snapshot().size() == 3);
}

TEST_CASE("staging memory outlives a shutdown until the copies that use it have run", "[staging]") {
  // Slow copies: every operation sleeps up to 20 ms, and the pipeline is
  // shut down right after the call is queued, while its copies in are
  // still pending. Were the slots or the call's memory freed then, a copy
  // would land in freed memory, which the stand-in reports.
  sim::clearViolations();
  constexpr size_t kChunk = 64 << 10;
  std::vector<float> device(6 * kChunk / sizeof(float), 1.0f);
  auto keep = std::make_shared<std::vector<float>>(kChunk / sizeof(float), 2.0f);
  std::weak_ptr<std::vector<float>> kept = keep;
  Dones dones;
  auto dev = makeSimDevice(simDelays(20000, 2));
  auto pipeline = std::make_unique<StagingPipeline>(dev, slotRing(3, kChunk));
  StagingCall call = inPlaceCall("slow call", device.data(), device.size(), kChunk,
                                 [](size_t, float*, size_t) {});
  call.keep = std::move(keep);
  call.done = dones.callback(0);
  pipeline->submit(std::move(call));
  std::this_thread::sleep_for(milliseconds(5));
  pipeline.reset();
  REQUIRE(dones.waitFor(1, milliseconds(1000)));
  sim::synchronize(*dev, milliseconds(10000));
  for (const auto& v : sim::violations()) INFO(v);
  CHECK(sim::violations() == std::vector<std::string>{});
  // The reaper frees what the copies used once they have run.
  const auto deadline = Clock::now() + milliseconds(3000);
  while (!kept.expired() && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(5));
  CHECK(kept.expired());
}

TEST_CASE("a slotted chunk larger than a slot is refused", "[staging]") {
  std::vector<char> device(8192);
  Dones dones;
  StagingPipeline pipeline(makeSimDevice(), slotRing(2, 4096));

  StagingCall call;
  call.what = "broadcast of 8 KiB";
  call.chunks.resize(2);
  call.chunks[0].slotted = true;
  call.chunks[0].in.push_back({device.data(), nullptr, 4096});
  call.chunks[1].slotted = true;
  call.chunks[1].out.push_back({device.data() + 4096, reinterpret_cast<void*>(100), 4000});
  call.done = dones.callback(0);
  try {
    pipeline.submit(call);
    FAIL("submit took a chunk larger than its slot");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kInvalidArgument);
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("broadcast of 8 KiB") != std::string::npos);
    CHECK(msg.find("chunk 1") != std::string::npos);
    CHECK(msg.find("4000 bytes at offset 100") != std::string::npos);
    CHECK(msg.find("4096 bytes") != std::string::npos);
  }
  CHECK(dones.snapshot().empty());

  // Nothing was queued: the pipeline still works.
  call.chunks[1].out[0].bytes = 3996;
  pipeline.submit(std::move(call));
  Dones::Call d = dones.of(0, milliseconds(1000));
  REQUIRE(d.id == 0);
  CHECK_FALSE(d.cause);
  CHECK(completes(d.event, milliseconds(1000)));
}

TEST_CASE("shutdown leaves host work that does not return behind after 500 ms", "[staging]") {
  // The host work outlives the pipeline: what it uses is shared with it.
  struct Stuck {
    std::promise<void> release;
    std::shared_future<void> released{release.get_future().share()};
    std::atomic<bool> entered{false}, returned{false};
  };
  auto stuck = std::make_shared<Stuck>();
  std::vector<float> device(1024, 1.0f);
  Dones dones;
  auto pipeline = std::make_unique<StagingPipeline>(makeSimDevice(), slotRing(1, 4096));
  StagingCall call = inPlaceCall("stuck call", device.data(), device.size(), 4096,
                                 [stuck](size_t, float* x, size_t n) {
                                   stuck->entered = true;
                                   stuck->released.wait();
                                   // The slot is still there to write.
                                   for (size_t i = 0; i < n; ++i) x[i] = 5;
                                   stuck->returned = true;
                                 });
  call.done = dones.callback(0);
  pipeline->submit(std::move(call));
  const auto deadline = Clock::now() + milliseconds(2000);
  while (!stuck->entered && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(1));
  REQUIRE(stuck->entered);

  const auto start = Clock::now();
  pipeline->shutdown();
  const double took = msSince(start);
  INFO("shutdown took " << took << " ms");
  CHECK(took >= 490);
  CHECK(took < 1000);
  auto calls = dones.snapshot();
  REQUIRE(calls.size() == 1);
  CHECK(errorOf(calls[0].cause).kind() == ErrorKind::kAborted);
  pipeline.reset();

  stuck->release.set_value();
  while (!stuck->returned) std::this_thread::sleep_for(milliseconds(1));
  std::this_thread::sleep_for(milliseconds(20));  // the thread returns, finishing nothing twice
  CHECK(dones.snapshot().size() == 1);
}

TEST_CASE("the watch fails a call whose copies in wait behind device work that never ends, and "
          "onBroken ends that work before the drain",
          "[staging]") {
  // An intra-host NCCL collective whose peer died: a kernel ahead of the
  // copies in that only an abort ends. The watch is what notices the death.
  constexpr size_t kChunk = 16 << 10;
  std::vector<float> device(2 * kChunk / sizeof(float), 1.0f);
  auto dev = makeSimDevice(simDelays(50, 1));
  std::atomic<bool> peerDead{false}, released{false};
  std::atomic<int> watched{0}, brokenCalls{0};
  StagingOptions po = slotRing(2, kChunk);
  po.watch = [&](const std::string& what) {
    ++watched;
    if (peerDead) throwError(ErrorKind::kPeerLost, "smddp: rank 3 exited during " + what);
  };
  po.onBroken = [&](std::exception_ptr cause) {
    ++brokenCalls;
    released = true;  // the abort: the hung kernel ends
  };
  Dones dones;
  StagingPipeline pipeline(dev, po);
  StagingCall call = inPlaceCall("allreduce of 32 KiB", device.data(), device.size(), kChunk,
                                 [](size_t, float*, size_t) {});
  call.chunks[0].beforeIn = [&](DeviceStream& in, int, void*, const DeviceEventPtr&) {
    sim::hostKernel(in, [&] {
      while (!released) std::this_thread::sleep_for(std::chrono::microseconds(200));
    });
  };
  call.done = dones.callback(0);
  pipeline.submit(std::move(call));
  std::this_thread::sleep_for(milliseconds(100));
  CHECK(dones.snapshot().empty());  // waiting on the hung kernel, watching
  CHECK(watched > 5);
  const auto died = Clock::now();
  peerDead = true;
  const Dones::Call done = dones.of(0, milliseconds(2000));
  REQUIRE(done.id == 0);
  INFO("failed " << msSince(died) << " ms after the death");
  CHECK(msSince(died) < 500);
  const Error e = errorOf(done.cause);
  CHECK(e.kind() == ErrorKind::kPeerLost);
  CHECK(std::string(e.what()).find("allreduce of 32 KiB") != std::string::npos);
  CHECK(brokenCalls == 1);
  CHECK(device[0] == 1.0f);  // nothing copied back into the failed call's output
  // The drain went through: the streams run again.
  DeviceEventPtr after = pipeline.inStream().record();
  CHECK(completes(after, milliseconds(2000)));
}
