#include "transport/bootstrap.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include <cstdint>
#include <cstdio>
#include <random>
#include <unistd.h>

#include "common/error.h"

namespace smddp {

std::vector<std::string> bootstrapAllGather(Bootstrap& b, int rank, int size,
                                            const std::string& key, const std::string& value,
                                            std::chrono::milliseconds timeout) {
  b.set(key + "/" + std::to_string(rank), value);
  std::vector<std::string> out(size);
  for (int r = 0; r < size; ++r) {
    out[r] = (r == rank) ? value : b.get(key + "/" + std::to_string(r), timeout);
  }
  return out;
}

namespace {

std::string randomHex() {
  std::random_device rd;
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%08x%08x", rd(), rd());
  return buf;
}

}  // namespace

// Rank 0 names the instance with a random nonce. Every other rank posts a
// fresh random token under its hello key and waits for a welcome keyed by
// that token: a key no earlier instance can have written, so a rank can
// never pick up an old nonce. Rank 0 answers whatever hello it reads (an old
// token's welcome is never waited on) until every rank has confirmed under
// the new nonce.
std::string joinGroupInstance(Bootstrap& b, int rank, int size,
                              std::chrono::milliseconds timeout, const std::string& group) {
  if (size == 1) return randomHex();
  if (rank != 0) {
    const std::string token = randomHex();
    b.set("smddp/hello/" + std::to_string(rank), token);
    std::string nonce = b.get("smddp/welcome/" + token, timeout);
    b.set("smddp/" + nonce + "/joined/" + std::to_string(rank), "1");
    return nonce;
  }
  const std::string nonce = randomHex();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<std::string> answered(size);
  std::vector<bool> joined(size, false);
  joined[0] = true;
  PollPause pause(std::chrono::microseconds(20000));
  while (true) {
    std::string missing;
    for (int r = 1; r < size; ++r) {
      if (joined[r]) continue;
      std::string v;
      if (b.tryGet("smddp/" + nonce + "/joined/" + std::to_string(r), &v)) {
        joined[r] = true;
        continue;
      }
      if (b.tryGet("smddp/hello/" + std::to_string(r), &v) && v != answered[r]) {
        b.set("smddp/welcome/" + v, nonce);
        answered[r] = v;
      }
      missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    if (missing.empty()) return nonce;
    if (std::chrono::steady_clock::now() > deadline) {
      throwError(ErrorKind::kTimeout, "smddp: group '" + group + "' timed out after " +
                                          std::to_string(timeout.count()) +
                                          " ms waiting for rank(s) " + missing + " to join");
    }
    std::this_thread::sleep_for(pause.next());
  }
}

struct InMemoryBootstrap::State {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::string> kv;  // guarded by mu
};

InMemoryBootstrap::InMemoryBootstrap() : state_(std::make_shared<State>()) {}
InMemoryBootstrap::InMemoryBootstrap(std::shared_ptr<State> shared) : state_(std::move(shared)) {}

void InMemoryBootstrap::set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->kv[key] = value;
  }
  state_->cv.notify_all();
}

std::string InMemoryBootstrap::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(state_->mu);
  bool ok = state_->cv.wait_for(lock, timeout, [&] { return state_->kv.count(key) > 0; });
  if (!ok) throwError(ErrorKind::kTimeout, "bootstrap timed out waiting for key '" + key + "'");
  return state_->kv[key];
}

bool Bootstrap::waitFor(const std::string& key, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  std::string v;
  while (!tryGet(key, &v)) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

bool InMemoryBootstrap::tryGet(const std::string& key, std::string* value) {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->kv.find(key);
  if (it == state_->kv.end()) return false;
  *value = it->second;
  return true;
}

FileBootstrap::FileBootstrap(std::string dir) : dir_(std::move(dir)) {}

namespace {
std::string fileNameFor(const std::string& dir, const std::string& key) {
  std::string safe = key;
  for (char& c : safe) {
    if (c == '/') c = '_';
  }
  return dir + "/" + safe;
}
}  // namespace

void FileBootstrap::set(const std::string& key, const std::string& value) {
  // Write then rename, so a reader never sees a half-written value.
  std::string path = fileNameFor(dir_, key);
  // The temporary name is unique per call, not per process: ranks run as
  // threads of one process in tests (and several writers may answer one key,
  // such as a desync request), and two writers sharing a temporary file
  // would each rename the other's away.
  static std::atomic<uint64_t> serial{0};
  std::string tmp = path + ".tmp." + std::to_string(getpid()) + "." +
                    std::to_string(serial.fetch_add(1, std::memory_order_relaxed));
  {
    std::ofstream f(tmp, std::ios::binary);
    f.write(value.data(), static_cast<std::streamsize>(value.size()));
    SMDDP_CHECK(f.good(), kInternal, "cannot write bootstrap file " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    throwError(ErrorKind::kInternal, "cannot rename bootstrap file " + tmp + " to " + path);
  }
}

bool FileBootstrap::tryGet(const std::string& key, std::string* value) {
  std::ifstream f(fileNameFor(dir_, key), std::ios::binary);
  if (!f.good()) return false;
  std::stringstream ss;
  ss << f.rdbuf();
  *value = ss.str();
  return true;
}

std::string FileBootstrap::get(const std::string& key, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string path = fileNameFor(dir_, key);
  while (true) {
    std::ifstream f(path, std::ios::binary);
    if (f.good()) {
      std::stringstream ss;
      ss << f.rdbuf();
      return ss.str();
    }
    if (std::chrono::steady_clock::now() > deadline) {
      throwError(ErrorKind::kTimeout, "bootstrap timed out waiting for key '" + key + "'");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace smddp
