// The GPU path's staging pipeline on the simulated device (sim_device.h):
// streams are CPU threads and every queued operation sleeps a random delay
// first, so copies of different streams land out of order, as on a GPU. The
// oracles are closed forms of what the host work computes, the order in
// which host work and done() ran, and how soon failures and shutdown finish.
// What a pipeline's calls use is declared before the pipeline: a test that
// fails early leaves calls that its destructor still finishes.
#include "staging_harness.h"

using namespace staging_test;

TEST_CASE("chunks staged through slots land out of order and get host work in order",
          "[staging]") {
  constexpr size_t kChunk = 1 << 20;
  constexpr size_t kFloats = (10 << 20) / sizeof(float) + 309;  // 10 MiB + 1236 bytes
  constexpr size_t kChunks = (kFloats * sizeof(float) + kChunk - 1) / kChunk;
  constexpr int kPasses = 8;
  std::vector<float> device(kFloats);
  // Not periodic in the chunk size: a chunk in another chunk's place shows.
  for (size_t i = 0; i < kFloats; ++i) device[i] = static_cast<float>(i % 65521);

  auto landings = std::make_shared<Landings>();
  landings->device = reinterpret_cast<const char*>(device.data());
  landings->bytes = kFloats * sizeof(float);
  landings->chunkBytes = kChunk;
  SimDeviceOptions so;
  so.maxDelay = microseconds(200);
  so.seed = 7;
  so.afterCopy = [landings](void*, const void* src, size_t) { (*landings)(src); };
  StagingOptions po;
  po.slots = 3;
  po.slotBytes = kChunk;
  po.copyStreams = 3;
  std::vector<size_t> hostOrder;  // only the pipeline thread writes it
  Dones dones;
  StagingPipeline pipeline(makeSimDevice(so), po);

  // Each pass reads what the one before wrote: it is ready after that
  // pass's completion event, as a caller's stream would order them.
  DeviceEventPtr last;
  const auto start = Clock::now();
  for (int pass = 0; pass < kPasses; ++pass) {
    StagingCall call = inPlaceCall("pass " + std::to_string(pass), device.data(), kFloats, kChunk,
                                   [&hostOrder](size_t k, float* x, size_t n) {
                                     hostOrder.push_back(k);
                                     for (size_t i = 0; i < n; ++i) x[i] = 2 * x[i] + 1;
                                   });
    REQUIRE(call.chunks.size() == kChunks);
    call.ready = last;
    call.done = dones.callback(pass);
    last = pipeline.submit(std::move(call));
  }
  REQUIRE(completes(last, milliseconds(15000)));
  REQUIRE(dones.waitFor(kPasses, milliseconds(1000)));
  INFO(kPasses << " passes over 10 MiB took " << msSince(start) << " ms");

  for (const auto& d : dones.snapshot()) CHECK_FALSE(d.cause);
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

  // Passes land one after another (each waits for the one before); within
  // a pass, count the chunks that landed after a later one had.
  std::lock_guard<std::mutex> lk(landings->mu);
  REQUIRE(landings->chunks.size() == kPasses * kChunks);
  size_t outOfOrder = 0;
  for (int pass = 0; pass < kPasses; ++pass) {
    std::vector<size_t> got(landings->chunks.begin() + pass * kChunks,
                            landings->chunks.begin() + (pass + 1) * kChunks);
    size_t highest = 0;
    for (size_t k : got) {
      if (k < highest) ++outOfOrder;
      highest = std::max(highest, k);
    }
    std::sort(got.begin(), got.end());
    CHECK(got == std::vector<size_t>(expected.begin(), expected.begin() + kChunks));
  }
  INFO("chunks that landed after a later one: " << outOfOrder << " of " << kPasses * kChunks);
  CHECK(outOfOrder > 0);
}

TEST_CASE("a slot is not refilled before the copies out of its previous chunk", "[staging]") {
  // Two slots and two copy streams: copies in run ahead as far as the slots
  // let them. Each chunk goes back in 32 pieces, each queued operation
  // sleeping up to 100 us, so the return stream is far slower than the
  // copies in; a copy in that refilled a slot too early would overwrite
  // data not yet copied out, and the result would show it.
  constexpr size_t kChunk = 64 << 10;
  constexpr size_t kPieces = 32;
  constexpr size_t kFloats = 24 * kChunk / sizeof(float);
  std::vector<float> device(kFloats);
  for (size_t i = 0; i < kFloats; ++i) device[i] = static_cast<float>(i);

  SimDeviceOptions so = simDelays(100, 11);
  StagingOptions po = slotRing(2, kChunk, 2);
  Dones dones;
  StagingPipeline pipeline(makeSimDevice(so), po);

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
  DeviceEventPtr done = pipeline.submit(std::move(call));
  REQUIRE(completes(done, milliseconds(15000)));
  REQUIRE(dones.waitFor(1, milliseconds(1000)));
  CHECK_FALSE(dones.snapshot()[0].cause);
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
    SimDeviceOptions so;
    so.maxDelay = microseconds(r == 0 ? 30 : 300);
    so.seed = 100 + r;
    StagingOptions po;
    po.slots = 3;
    po.slotBytes = kChunk;
    po.copyStreams = 2;
    std::promise<std::exception_ptr> result;
    StagingPipeline pipeline(makeSimDevice(so), po);
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
    call.done = [&](std::exception_ptr cause) { result.set_value(cause); };
    DeviceEventPtr done = pipeline.submit(std::move(call));
    auto f = result.get_future();
    if (f.wait_for(std::chrono::seconds(15)) != std::future_status::ready) {
      failure = "no done()";
    } else if (auto cause = f.get()) {
      failure = errorOf(cause).what();
    } else if (!completes(done, milliseconds(2000))) {
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
  SimDeviceOptions so = simDelays(100, 5);
  StagingOptions po = slotRing(2, kChunk, 2);
  Dones dones;
  std::vector<float> a(3 * kChunk / sizeof(float) + 100);
  constexpr size_t kPart = 100000;
  std::vector<float> bIn(4 * kPart), bOut(4 * kPart, -1), hostIn(4 * kPart), hostOut(4 * kPart);
  std::vector<float> d(6 * kPart), hostD(d.size());
  StagingPipeline pipeline(makeSimDevice(so), po);
  std::vector<DeviceEventPtr> events;

  // 0: in place, slotted: x -> x + 1.
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 5000);
  StagingCall call0 = inPlaceCall("a", a.data(), a.size(), kChunk, [](size_t, float* x, size_t n) {
    for (size_t i = 0; i < n; ++i) x[i] += 1;
  });
  call0.done = dones.callback(0);
  events.push_back(pipeline.submit(std::move(call0)));

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
  events.push_back(pipeline.submit(std::move(call1)));

  // 2: no chunks at all.
  StagingCall call2;
  call2.what = "c";
  call2.done = dones.callback(2);
  events.push_back(pipeline.submit(std::move(call2)));

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
  events.push_back(pipeline.submit(std::move(call3)));

  for (auto& e : events) REQUIRE(completes(e, milliseconds(15000)));
  REQUIRE(dones.waitFor(4, milliseconds(1000)));
  std::this_thread::sleep_for(milliseconds(20));  // room for a second done()
  auto calls = dones.snapshot();
  REQUIRE(calls.size() == 4);
  for (int i = 0; i < 4; ++i) {
    CHECK(calls[i].id == i);
    CHECK_FALSE(calls[i].cause);
    CHECK(calls[i].thread != std::this_thread::get_id());
  }
  size_t wrong = 0;
  for (size_t i = 0; i < a.size(); ++i) wrong += a[i] != static_cast<float>(i % 5000 + 1);
  for (size_t i = 0; i < bOut.size(); ++i) wrong += bOut[i] != static_cast<float>(3 * (i % 3000));
  for (size_t i = 0; i < d.size(); ++i) wrong += d[i] != static_cast<float>(2 * (i % 2003));
  CHECK(wrong == 0);

  // After shutdown a call is refused at once, and its event still completes.
  pipeline.shutdown();
  StagingCall late = inPlaceCall("late", a.data(), 16, kChunk, [](size_t, float*, size_t) {});
  late.done = dones.callback(4);
  DeviceEventPtr lateDone = pipeline.submit(std::move(late));
  calls = dones.snapshot();
  REQUIRE(calls.size() == 5);
  CHECK(errorOf(calls[4].cause).kind() == ErrorKind::kAborted);
  CHECK(completes(lateDone, milliseconds(1000)));
}

