#include "transport/bootstrap.h"

#include <condition_variable>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include <cstdio>
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
  std::string tmp = path + ".tmp." + std::to_string(getpid());
  {
    std::ofstream f(tmp, std::ios::binary);
    f.write(value.data(), static_cast<std::streamsize>(value.size()));
    SMDDP_CHECK(f.good(), kInternal, "cannot write bootstrap file " + tmp);
  }
  SMDDP_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, kInternal,
              "cannot rename bootstrap file " + tmp);
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
