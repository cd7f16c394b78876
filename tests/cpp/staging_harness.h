// Helpers of the staging pipeline's Catch2 tests
// (test_staging_pipeline.cc: the data path; test_staging_failures.cc:
// failure and shutdown), on the simulated device (device/sim_device.h).
#pragma once

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
#include "device/sim_device.h"
#include "device/staging_pipeline.h"
#include "sim_waits.h"


namespace staging_test {

using namespace smddp;
using Clock = std::chrono::steady_clock;
using std::chrono::microseconds;
using std::chrono::milliseconds;

inline double msSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

using sim_waits::completes;

// The done() calls of a test's calls, in the order they came.
struct Dones {
  struct Call {
    int id;
    std::exception_ptr cause;
    DeviceEventPtr event;  // after the call's copies back (null on failure)
    std::thread::id thread;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Call> calls;

  std::function<void(std::exception_ptr, DeviceEventPtr)> callback(int id) {
    return [this, id](std::exception_ptr cause, DeviceEventPtr event) {
      std::lock_guard<std::mutex> lk(mu);
      calls.push_back({id, cause, std::move(event), std::this_thread::get_id()});
      cv.notify_all();
    };
  }
  // The done() of call `id`, once it came within `within` (a default Call
  // with id -1 when it did not).
  Call of(int id, milliseconds within) {
    std::unique_lock<std::mutex> lk(mu);
    Call found{-1, nullptr, nullptr, {}};
    cv.wait_for(lk, within, [&] {
      for (const auto& c : calls) {
        if (c.id == id) {
          found = c;
          return true;
        }
      }
      return false;
    });
    return found;
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

inline Error errorOf(const std::exception_ptr& cause) {
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
inline StagingCall inPlaceCall(std::string what, float* device, size_t floats, size_t chunkBytes,
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


// The simulated device with random delays up to `maxDelayUs`.
inline SimDeviceOptions simDelays(int64_t maxDelayUs, uint64_t seed) {
  SimDeviceOptions so;
  so.maxDelay = microseconds(maxDelayUs);
  so.seed = seed;
  return so;
}

inline StagingOptions slotRing(int slots, size_t slotBytes) {
  StagingOptions po;
  po.slots = slots;
  po.slotBytes = slotBytes;
  return po;
}

// The caller's stream in these tests: a pool stream the pipeline does not
// use (it takes 0 and 1).
inline DeviceStream& callerStream(Device& device) { return device.poolStream(3); }

}  // namespace staging_test
