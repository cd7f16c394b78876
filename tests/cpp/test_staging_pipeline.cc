// The GPU path's staging pipeline on the simulated device (sim_device.h):
// streams are CPU threads and every queued operation sleeps a random delay
// first, so copies of different streams land out of order, as on a GPU. The
// oracles are closed forms of what the host work computes, the order in
// which host work and done() ran, and how soon failures and shutdown finish.
// What a pipeline's calls use is declared before the pipeline: a test that
// fails early leaves calls that its destructor still finishes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/error.h"
#include "engine/sim_device.h"
#include "engine/staging_pipeline.h"

using namespace smddp;
using Clock = std::chrono::steady_clock;
using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace {

double msSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Polls the event until it completes or `within` passes.
bool completes(const DeviceEventPtr& event, milliseconds within) {
  const auto deadline = Clock::now() + within;
  while (!event->query()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(microseconds(50));
  }
  return true;
}

// The done() calls of a test's calls, in the order they came.
struct Dones {
  struct Call {
    int id;
    std::exception_ptr cause;
    std::thread::id thread;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Call> calls;

  std::function<void(std::exception_ptr)> callback(int id) {
    return [this, id](std::exception_ptr cause) {
      std::lock_guard<std::mutex> lk(mu);
      calls.push_back({id, cause, std::this_thread::get_id()});
      cv.notify_all();
    };
  }
  bool waitFor(size_t n, milliseconds within) {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, within, [&] { return calls.size() >= n; });
  }
  std::vector<Call> snapshot() {
    std::lock_guard<std::mutex> lk(mu);
    return calls;
  }
};

Error errorOf(const std::exception_ptr& cause) {
  try {
    std::rethrow_exception(cause);
  } catch (const Error& e) {
    return e;
  } catch (const std::exception& e) {
    return Error(ErrorKind::kInternal, std::string("not an smddp::Error: ") + e.what());
  }
}

// An in-place call on `floats` floats at `device`, in slotted chunks of
// `chunkBytes`; host work(chunk index, slot data, floats in the chunk).
StagingCall inPlaceCall(std::string what, float* device, size_t floats, size_t chunkBytes,
                        std::function<void(size_t, float*, size_t)> work) {
  StagingCall call;
  call.what = std::move(what);
  const size_t bytes = floats * sizeof(float);
  for (size_t off = 0, k = 0; off < bytes; off += chunkBytes, ++k) {
    StagingChunk chunk;
    chunk.slotted = true;
    const size_t n = std::min(chunkBytes, bytes - off);
    auto* dev = reinterpret_cast<char*>(device) + off;
    chunk.in.push_back({dev, nullptr, n});
    chunk.out.push_back({dev, nullptr, n});
    chunk.host = [work, k, n](void* slot) {
      work(k, static_cast<float*>(slot), n / sizeof(float));
    };
    call.chunks.push_back(std::move(chunk));
  }
  return call;
}

// Copies in land on the copy streams' threads; the hook records which chunk
// of `device` each copy in read, in landing order.
struct Landings {
  std::mutex mu;
  std::vector<size_t> chunks;
  const char* device = nullptr;
  size_t bytes = 0, chunkBytes = 0;

  void operator()(const void* src) {
    const auto* s = static_cast<const char*>(src);
    if (s < device || s >= device + bytes) return;  // a copy out
    std::lock_guard<std::mutex> lk(mu);
    chunks.push_back(static_cast<size_t>(s - device) / chunkBytes);
  }
};

// A barrier for the two-rank test that gives up instead of hanging.
class Barrier {
 public:
  explicit Barrier(int parties) : parties_(parties) {}
  void arrive() {
    std::unique_lock<std::mutex> lk(mu_);
    const uint64_t gen = generation_;
    if (++waiting_ == parties_) {
      waiting_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lk, std::chrono::seconds(5), [&] { return generation_ != gen; })) {
      throw Error(ErrorKind::kTimeout, "test barrier: the other rank never came");
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int parties_, waiting_ = 0;
  uint64_t generation_ = 0;
};

}  // namespace

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

  SimDeviceOptions so;
  so.maxDelay = microseconds(100);
  so.seed = 11;
  StagingOptions po;
  po.slots = 2;
  po.slotBytes = kChunk;
  po.copyStreams = 2;
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
  SimDeviceOptions so;
  so.maxDelay = microseconds(100);
  so.seed = 5;
  StagingOptions po;
  po.slots = 2;
  po.slotBytes = kChunk;
  po.copyStreams = 2;
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

TEST_CASE("host work that throws fails the call and every later one with its cause",
          "[staging]") {
  constexpr size_t kChunk = 256 << 10;
  constexpr size_t kFloats = 8 * kChunk / sizeof(float);
  SimDeviceOptions so;
  so.maxDelay = microseconds(100);
  StagingOptions po;
  po.slots = 3;
  po.slotBytes = kChunk;
  po.copyStreams = 2;
  std::vector<float> device(kFloats, 1.0f), second(kFloats, 1.0f);
  std::vector<size_t> ran;  // only the pipeline thread writes it
  Dones dones;
  StagingPipeline pipeline(makeSimDevice(so), po);
  StagingCall call = inPlaceCall("failing call", device.data(), kFloats, kChunk,
                                 [&ran](size_t k, float*, size_t) {
                                   ran.push_back(k);
                                   if (k == 3) throw Error(ErrorKind::kPeerLost, "rank 1 died");
                                 });
  REQUIRE(call.chunks.size() == 8);
  call.done = dones.callback(0);
  const auto start = Clock::now();
  DeviceEventPtr done = pipeline.submit(std::move(call));
  // Queued behind it: fails with the same cause.
  StagingCall next = inPlaceCall("queued call", second.data(), kFloats, kChunk,
                                 [&ran](size_t k, float*, size_t) { ran.push_back(100 + k); });
  next.done = dones.callback(1);
  DeviceEventPtr nextDone = pipeline.submit(std::move(next));

  REQUIRE(dones.waitFor(2, milliseconds(2000)));
  // Every copy drains: the return stream no longer waits for host work.
  CHECK(completes(done, milliseconds(1000)));
  CHECK(completes(nextDone, milliseconds(1000)));
  INFO("failed and drained after " << msSince(start) << " ms");
  auto calls = dones.snapshot();
  REQUIRE(calls.size() == 2);
  REQUIRE(calls[0].cause);
  CHECK(errorOf(calls[0].cause).kind() == ErrorKind::kPeerLost);
  CHECK(std::string(errorOf(calls[0].cause).what()) == "rank 1 died");
  CHECK(calls[1].cause == calls[0].cause);
  CHECK(pipeline.broken() == calls[0].cause);
  CHECK(ran == std::vector<size_t>{0, 1, 2, 3});

  // A later call fails at once with the same cause.
  StagingCall later = inPlaceCall("later call", second.data(), kFloats, kChunk,
                                  [&ran](size_t k, float*, size_t) { ran.push_back(200 + k); });
  later.done = dones.callback(2);
  const auto submitted = Clock::now();
  DeviceEventPtr laterDone = pipeline.submit(std::move(later));
  REQUIRE(dones.waitFor(3, milliseconds(1000)));
  CHECK(msSince(submitted) < 100);
  CHECK(dones.snapshot()[2].cause == calls[0].cause);
  CHECK(completes(laterDone, milliseconds(1000)));
  CHECK(ran.size() == 4);
}

TEST_CASE("copies in that never land time the call out", "[staging]") {
  constexpr size_t kChunk = 64 << 10;
  std::vector<float> device(4 * kChunk / sizeof(float), 1.0f);
  SimDeviceOptions so;
  so.maxDelay = microseconds(50);
  so.hangCopy = 2;  // queued third: chunk 1's copy in (chunk 0's in and out come first)
  StagingOptions po;
  po.slots = 2;
  po.slotBytes = kChunk;
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
  pipeline.reset();  // the stalled stream must still stop
  CHECK(msSince(destroyed) < 1000);
}

TEST_CASE("shutdown aborts queued calls promptly while a copy hangs", "[staging]") {
  constexpr size_t kChunk = 64 << 10;
  std::vector<float> device(3 * kChunk / sizeof(float), 1.0f);
  SimDeviceOptions so;
  so.maxDelay = microseconds(50);
  so.hangCopy = 0;  // the first call's first copy in
  StagingOptions po;
  po.slots = 2;
  po.slotBytes = kChunk;
  Dones dones;
  std::atomic<int> ran{0};
  auto pipeline = std::make_unique<StagingPipeline>(makeSimDevice(so), po);
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

TEST_CASE("a slotted chunk larger than a slot is refused", "[staging]") {
  StagingOptions po;
  po.slots = 2;
  po.slotBytes = 4096;
  std::vector<char> device(8192);
  Dones dones;
  StagingPipeline pipeline(makeSimDevice(), po);

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
  DeviceEventPtr done = pipeline.submit(std::move(call));
  CHECK(completes(done, milliseconds(1000)));
  REQUIRE(dones.waitFor(1, milliseconds(1000)));
  CHECK_FALSE(dones.snapshot()[0].cause);
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
  StagingOptions po;
  po.slots = 1;
  po.slotBytes = 4096;
  auto pipeline = std::make_unique<StagingPipeline>(makeSimDevice(), po);
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
  std::this_thread::sleep_for(milliseconds(20));  // the thread returns, finishing nothing
  CHECK(dones.snapshot().size() == 1);
}

TEST_CASE("shutdown releases the copies out only after the host work at hand", "[staging]") {
  // The copies out of a chunk read its slot; were they released while its
  // host work still wrote it, TSan would see the race.
  std::vector<float> device(1024, 1.0f);
  std::atomic<bool> entered{false};
  Dones dones;
  StagingOptions po;
  po.slots = 1;
  po.slotBytes = 4096;
  StagingPipeline pipeline(makeSimDevice(), po);
  StagingCall call = inPlaceCall("slow call", device.data(), device.size(), 4096,
                                 [&entered](size_t, float* x, size_t n) {
                                   entered = true;
                                   std::this_thread::sleep_for(milliseconds(100));
                                   for (size_t i = 0; i < n; ++i) x[i] = 7;
                                 });
  call.done = dones.callback(0);
  DeviceEventPtr done = pipeline.submit(std::move(call));
  while (!entered) std::this_thread::sleep_for(microseconds(100));
  const auto start = Clock::now();
  pipeline.shutdown();
  const double took = msSince(start);
  INFO("shutdown took " << took << " ms");
  CHECK(took < 500);
  CHECK(completes(done, milliseconds(1000)));
  auto calls = dones.snapshot();
  REQUIRE(calls.size() == 1);
  CHECK(errorOf(calls[0].cause).kind() == ErrorKind::kAborted);
}
