// The GPU path's staging pipeline on the simulated device (sim_device.h),
// which follows CUDA's rules: in-order hardware queues, random delays per
// operation, a current device per thread. The oracles are closed forms of
// what the host work computes, the order in which host work, copies back
// and done() ran, and whether the device kept running while host work was
// blocked. What a pipeline's calls use is declared before the pipeline: a
// test that fails early leaves calls that its destructor still finishes.
#include "staging_harness.h"

using namespace staging_test;

TEST_CASE("a chunk goes back only after its host work, and calls chain through the caller's stream",
          "[staging]") {
  constexpr size_t kChunk = 1 << 20;
  constexpr size_t kFloats = (10 << 20) / sizeof(float) + 309;  // 10 MiB + 1236 bytes
  constexpr size_t kChunks = (kFloats * sizeof(float) + kChunk - 1) / kChunk;
  constexpr int kPasses = 8;
  std::vector<float> device(kFloats);
  // Not periodic in the chunk size: a chunk in another chunk's place shows.
  for (size_t i = 0; i < kFloats; ++i) device[i] = static_cast<float>(i % 65521);

  // A copy back queued before its chunk's host work would carry the staged
  // input back, and the closed form below would show one pass too few.
  SimDeviceOptions so = simDelays(200, 7);
  std::vector<size_t> hostOrder;  // only the pipeline thread writes it
  Dones dones;
  auto dev = makeSimDevice(so);
  StagingPipeline pipeline(dev, slotRing(3, kChunk));
  DeviceStream& caller = callerStream(*dev);

  // Each pass reads what the one before wrote, ordered as a caller's
  // stream orders them: wait() makes the stream wait for the pass's event,
  // and the next pass's readiness event comes after that.
  const auto start = Clock::now();
  for (int pass = 0; pass < kPasses; ++pass) {
    StagingCall call = inPlaceCall("pass " + std::to_string(pass), device.data(), kFloats, kChunk,
                                   [&](size_t k, float* x, size_t n) {
                                     hostOrder.push_back(k);
                                     for (size_t i = 0; i < n; ++i) x[i] = 2 * x[i] + 1;
                                   });
    REQUIRE(call.chunks.size() == kChunks);
    call.ready = caller.record();
    call.done = dones.callback(pass);
    pipeline.submit(std::move(call));
    Dones::Call d = dones.of(pass, milliseconds(15000));
    REQUIRE(d.id == pass);
    REQUIRE_FALSE(d.cause);
    REQUIRE(d.event);
    caller.wait(d.event);
  }
  REQUIRE(completes(caller.record(), milliseconds(15000)));
  INFO(kPasses << " passes over 10 MiB took " << msSince(start) << " ms");

  // x -> 2x + 1, eight times: 256x + 255 (exact in float: below 2^24).
  size_t wrong = 0;
  for (size_t i = 0; i < kFloats; ++i) {
    wrong += device[i] != static_cast<float>(256 * (i % 65521) + 255);
  }
  CHECK(wrong == 0);
  std::vector<size_t> expected;
  for (int pass = 0; pass < kPasses; ++pass) {
    for (size_t k = 0; k < kChunks; ++k) expected.push_back(k);
  }
  CHECK(hostOrder == expected);
}

TEST_CASE("copies in wait for the caller's readiness event", "[staging]") {
  // A kernel on the caller's stream writes the input after a delay; the
  // call is issued right behind it. Copies that did not wait for the
  // readiness event would stage the old values.
  constexpr size_t kFloats = 64 << 10;
  std::vector<float> device(kFloats, 1.0f);
  Dones dones;
  auto dev = makeSimDevice(simDelays(3000, 3));
  StagingPipeline pipeline(dev, slotRing(2, 64 << 10));
  DeviceStream& caller = callerStream(*dev);
  float seven = 7.0f;
  std::vector<uint8_t> pattern(sizeof(float));
  std::memcpy(pattern.data(), &seven, sizeof(float));
  sim::fill(caller, device.data(), kFloats * sizeof(float), pattern);
  StagingCall call = inPlaceCall("after a kernel", device.data(), kFloats, 64 << 10,
                                 [](size_t, float* x, size_t n) {
                                   for (size_t i = 0; i < n; ++i) x[i] += 1;
                                 });
  call.ready = caller.record();
  call.done = dones.callback(0);
  pipeline.submit(std::move(call));
  Dones::Call d = dones.of(0, milliseconds(10000));
  REQUIRE(d.id == 0);
  REQUIRE(d.event);
  REQUIRE(completes(d.event, milliseconds(10000)));
  size_t wrong = 0;
  for (float x : device) wrong += x != 8.0f;
  CHECK(wrong == 0);
}

TEST_CASE("no device queue waits for the host: a stream behind blocked host work keeps running",
          "[staging]") {
  // One hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1): every stream shares
  // it, so anything the pipeline queued that waited for its host work would
  // hold up the caller's kernels behind it.
  std::vector<float> device(4096, 1.0f), other(4096, 0.0f);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> entered{false};
  Dones dones;
  SimDeviceOptions so = simDelays(50, 9);
  so.queues = 1;
  auto dev = makeSimDevice(so);
  StagingPipeline pipeline(dev, slotRing(2, 4096));
  DeviceStream& caller = callerStream(*dev);
  StagingCall call = inPlaceCall("blocked", device.data(), device.size(), 4096,
                                 [&](size_t, float* x, size_t n) {
                                   entered = true;
                                   released.wait();
                                   for (size_t i = 0; i < n; ++i) x[i] = 3;
                                 });
  call.ready = caller.record();
  call.done = dones.callback(0);
  pipeline.submit(std::move(call));
  const auto deadline = Clock::now() + milliseconds(5000);
  while (!entered && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(1));
  REQUIRE(entered);
  // Host work is blocked. The caller's next kernel must still run.
  std::vector<uint8_t> ones(sizeof(float));
  float one = 1.0f;
  std::memcpy(ones.data(), &one, sizeof(float));
  sim::fill(caller, other.data(), other.size() * sizeof(float), ones);
  CHECK(completes(caller.record(), milliseconds(2000)));
  CHECK(other[0] == 1.0f);
  release.set_value();
  Dones::Call d = dones.of(0, milliseconds(5000));
  REQUIRE(d.id == 0);
  REQUIRE(completes(d.event, milliseconds(5000)));
  CHECK(device[4095] == 3.0f);
}

TEST_CASE("under CUDA_LAUNCH_BLOCKING the pipeline completes and computes the same", "[staging]") {
  constexpr size_t kChunk = 16 << 10;
  std::vector<float> device(10 * kChunk / sizeof(float) + 3);
  for (size_t i = 0; i < device.size(); ++i) device[i] = static_cast<float>(i % 977);
  SimDeviceOptions so = simDelays(20, 4);
  so.launchBlocking = true;
  so.queues = 1;
  Dones dones;
  auto dev = makeSimDevice(so);
  StagingPipeline pipeline(dev, slotRing(2, kChunk));
  for (int pass = 0; pass < 3; ++pass) {
    StagingCall call = inPlaceCall("blocking " + std::to_string(pass), device.data(), device.size(),
                                   kChunk, [](size_t, float* x, size_t n) {
                                     for (size_t i = 0; i < n; ++i) x[i] = x[i] * 2;
                                   });
    call.done = dones.callback(pass);
    pipeline.submit(std::move(call));
    Dones::Call d = dones.of(pass, milliseconds(10000));
    REQUIRE(d.id == pass);
    REQUIRE_FALSE(d.cause);
    REQUIRE(d.event->query());  // every operation ran before it returned
  }
  size_t wrong = 0;
  for (size_t i = 0; i < device.size(); ++i) wrong += device[i] != static_cast<float>(8 * (i % 977));
  CHECK(wrong == 0);
}

TEST_CASE("a slot is not refilled before the copies out of its previous chunk", "[staging]") {
  // Two slots: copies in run ahead as far as the slots let them. Each chunk
  // goes back in 32 pieces, each queued operation sleeping up to 100 us, so
  // the copies back are far slower than the copies in; a copy in that
  // refilled a slot too early would overwrite data not yet copied out, and
  // the result would show it.
  constexpr size_t kChunk = 64 << 10;
  constexpr size_t kPieces = 32;
  constexpr size_t kFloats = 24 * kChunk / sizeof(float);
  std::vector<float> device(kFloats);
  for (size_t i = 0; i < kFloats; ++i) device[i] = static_cast<float>(i);
  Dones dones;
  StagingPipeline pipeline(makeSimDevice(simDelays(100, 11)), slotRing(2, kChunk));

  StagingCall call = inPlaceCall("slot reuse", device.data(), kFloats, kChunk,
                                 [](size_t, float* x, size_t n) {
                                   for (size_t i = 0; i < n; ++i) x[i] = 3 * x[i] + 1;
                                 });
  for (auto& chunk : call.chunks) {
    const StageCopy whole = chunk.out[0];
    chunk.out.clear();
    for (size_t p = 0; p < kPieces; ++p) {
      const size_t off = p * whole.bytes / kPieces;
      chunk.out.push_back({static_cast<char*>(whole.device) + off,
                           reinterpret_cast<void*>(off), whole.bytes / kPieces});
    }
  }
  call.done = dones.callback(0);
  pipeline.submit(std::move(call));
  Dones::Call d = dones.of(0, milliseconds(15000));
  REQUIRE(d.id == 0);
  CHECK_FALSE(d.cause);
  REQUIRE(completes(d.event, milliseconds(15000)));
  size_t wrong = 0;
  for (size_t i = 0; i < kFloats; ++i) wrong += device[i] != static_cast<float>(3 * i + 1);
  CHECK(wrong == 0);
}

TEST_CASE("two ranks sum each chunk through host work that meets the other rank", "[staging]") {
  constexpr size_t kChunk = 256 << 10;
  constexpr size_t kFloats = (3 << 20) / sizeof(float) + 77;
  const auto value = [](int rank, size_t i) {
    return static_cast<float>(rank == 0 ? i % 1000 : 2 * (i % 777));
  };
  Barrier barrier(2);
  float* posted[2] = {nullptr, nullptr};  // each rank's slot for the chunk at hand

  const auto rank = [&](int r, std::vector<float>& device, std::string& failure) {
    SimDeviceOptions so = simDelays(r == 0 ? 30 : 300, 100 + r);
    Dones dones;
    StagingPipeline pipeline(makeSimDevice(so), slotRing(3, kChunk));
    StagingCall call = inPlaceCall(
        "allreduce on rank " + std::to_string(r), device.data(), kFloats, kChunk,
        [&, r](size_t, float* x, size_t n) {
          posted[r] = x;
          barrier.arrive();  // both slots posted
          std::vector<float> sum(x, x + n);
          const float* other = posted[1 - r];
          for (size_t i = 0; i < n; ++i) sum[i] += other[i];
          barrier.arrive();  // both done reading
          std::memcpy(x, sum.data(), n * sizeof(float));
        });
    call.done = dones.callback(0);
    pipeline.submit(std::move(call));
    Dones::Call d = dones.of(0, milliseconds(15000));
    if (d.id != 0) {
      failure = "no done()";
    } else if (d.cause) {
      failure = errorOf(d.cause).what();
    } else if (!completes(d.event, milliseconds(2000))) {
      failure = "completion event never completed";
    }
  };

  std::vector<float> device[2];
  std::string failure[2];
  for (int r = 0; r < 2; ++r) {
    device[r].resize(kFloats);
    for (size_t i = 0; i < kFloats; ++i) device[r][i] = value(r, i);
  }
  std::thread t0(rank, 0, std::ref(device[0]), std::ref(failure[0]));
  std::thread t1(rank, 1, std::ref(device[1]), std::ref(failure[1]));
  t0.join();
  t1.join();
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK(failure[r] == "");
    size_t wrong = 0;
    for (size_t i = 0; i < kFloats; ++i) wrong += device[r][i] != value(0, i) + value(1, i);
    CHECK(wrong == 0);
  }
}

TEST_CASE("calls queued back to back finish once each and in submit order", "[staging]") {
  constexpr size_t kChunk = 1 << 20;
  Dones dones;
  std::vector<float> a(3 * kChunk / sizeof(float) + 100);
  constexpr size_t kPart = 100000;
  std::vector<float> bIn(4 * kPart), bOut(4 * kPart, -1), hostIn(4 * kPart), hostOut(4 * kPart);
  std::vector<float> d(6 * kPart), hostD(d.size());
  StagingPipeline pipeline(makeSimDevice(simDelays(100, 5)), slotRing(2, kChunk));

  // 0: in place, slotted: x -> x + 1.
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 5000);
  StagingCall call0 = inPlaceCall("a", a.data(), a.size(), kChunk, [](size_t, float* x, size_t n) {
    for (size_t i = 0; i < n; ++i) x[i] += 1;
  });
  call0.done = dones.callback(0);
  pipeline.submit(std::move(call0));

  // 1: out of place through the caller's own host buffers: out = 3 * in.
  for (size_t i = 0; i < bIn.size(); ++i) bIn[i] = static_cast<float>(i % 3000);
  StagingCall call1;
  call1.what = "b";
  for (size_t k = 0; k < 4; ++k) {
    StagingChunk chunk;
    const size_t off = k * kPart;
    chunk.in.push_back({&bIn[off], &hostIn[off], kPart * sizeof(float)});
    chunk.out.push_back({&bOut[off], &hostOut[off], kPart * sizeof(float)});
    chunk.host = [&, off](void* slot) {
      if (slot) throw Error(ErrorKind::kInternal, "a slot for a chunk without one");
      for (size_t i = 0; i < kPart; ++i) hostOut[off + i] = 3 * hostIn[off + i];
    };
    call1.chunks.push_back(std::move(chunk));
  }
  call1.done = dones.callback(1);
  pipeline.submit(std::move(call1));

  // 2: no chunks at all.
  StagingCall call2;
  call2.what = "c";
  call2.done = dones.callback(2);
  pipeline.submit(std::move(call2));

  // 3: slotted and own-buffer chunks taking turns, in place: x -> 2x.
  for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<float>(i % 2003);
  StagingCall call3 = inPlaceCall("d", d.data(), d.size(), kPart * sizeof(float),
                                  [](size_t, float* x, size_t n) {
                                    for (size_t i = 0; i < n; ++i) x[i] *= 2;
                                  });
  for (size_t k = 1; k < call3.chunks.size(); k += 2) {
    StagingChunk& chunk = call3.chunks[k];
    float* host = &hostD[k * kPart];
    chunk.slotted = false;
    chunk.in[0].host = host;
    chunk.out[0].host = host;
    chunk.host = [host](void* slot) {
      if (slot) throw Error(ErrorKind::kInternal, "a slot for a chunk without one");
      for (size_t i = 0; i < kPart; ++i) host[i] *= 2;
    };
  }
  call3.done = dones.callback(3);
  pipeline.submit(std::move(call3));

  REQUIRE(dones.waitFor(4, milliseconds(15000)));
  std::this_thread::sleep_for(milliseconds(20));  // room for a second done()
  auto calls = dones.snapshot();
  REQUIRE(calls.size() == 4);
  for (int i = 0; i < 4; ++i) {
    CHECK(calls[i].id == i);
    CHECK_FALSE(calls[i].cause);
    CHECK(calls[i].thread != std::this_thread::get_id());
    REQUIRE(completes(calls[i].event, milliseconds(15000)));
  }
  size_t wrong = 0;
  for (size_t i = 0; i < a.size(); ++i) wrong += a[i] != static_cast<float>(i % 5000 + 1);
  for (size_t i = 0; i < bOut.size(); ++i) wrong += bOut[i] != static_cast<float>(3 * (i % 3000));
  for (size_t i = 0; i < d.size(); ++i) wrong += d[i] != static_cast<float>(2 * (i % 2003));
  CHECK(wrong == 0);

  // After shutdown a call is refused at once, without an event.
  pipeline.shutdown();
  StagingCall late = inPlaceCall("late", a.data(), 16, kChunk, [](size_t, float*, size_t) {});
  late.done = dones.callback(4);
  pipeline.submit(std::move(late));
  calls = dones.snapshot();
  REQUIRE(calls.size() == 5);
  CHECK(errorOf(calls[4].cause).kind() == ErrorKind::kAborted);
  CHECK_FALSE(calls[4].event);
}
