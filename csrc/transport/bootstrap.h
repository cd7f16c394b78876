// How ranks find each other: a tiny key-value interface. The backend adapts
// the c10d Store handed to it; tests use an in-memory map (threads) or a
// directory (processes). Nothing here knows about libfabric.
#pragma once

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace smddp {

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Waits for `key` to exist; throws kTimeout naming the key after `timeout`.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // The value of `key` if it exists now; never waits.
  virtual bool tryGet(const std::string& key, std::string* value) = 0;
  // Waits up to `timeout` for `key` to exist; false if it does not by then.
  // The default polls tryGet; a store that can block on the key does so.
  virtual bool waitFor(const std::string& key, std::chrono::milliseconds timeout);
  // True when waitFor blocks in the store itself rather than polling.
  virtual bool waitBlocks() const { return false; }
  // Another handle on the same keys with its own connection, for a thread
  // that may block in waitFor while this one is in use; null if the store
  // cannot be cloned.
  virtual std::unique_ptr<Bootstrap> clone() { return nullptr; }
  // Another handle on the same keys through the same connection (an owned
  // copy of a view that may not outlive its caller); null if unsupported.
  virtual std::unique_ptr<Bootstrap> share() { return clone(); }
};

// The sleeps of a wait that polls the store: 200 us while the wait is
// younger than 50 ms, then doubling up to `cap`. Ranks forming the same
// group mostly arrive within tens of ms of each other; a pause that had
// already doubled to many ms by then added about as much again to the
// formation (torchft forms a group after each quorum change). A wait for
// a rank that is not coming soon still costs the store little.
class PollPause {
 public:
  explicit PollPause(std::chrono::microseconds cap) : cap_(cap) {}
  std::chrono::microseconds next() {
    if (std::chrono::steady_clock::now() - start_ < std::chrono::milliseconds(50)) return pause_;
    pause_ = std::min(pause_ * 2, cap_);
    return pause_;
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::microseconds pause_{200};
  std::chrono::microseconds cap_;
};

// Joins this instance of a group and returns its nonce, which prefixes
// every other key the group uses: a store that earlier instances used (a
// second group over the same store, an elastic restart) still holds their
// keys, and those must never be read. Bounded by `timeout`.
std::string joinGroupInstance(Bootstrap& b, int rank, int size, std::chrono::milliseconds timeout,
                              const std::string& group);

// Every rank publishes `value` under `key`; returns all ranks' values.
std::vector<std::string> bootstrapAllGather(Bootstrap& b, int rank, int size,
                                            const std::string& key, const std::string& value,
                                            std::chrono::milliseconds timeout);

// Shared map for ranks that are threads of one process.
class InMemoryBootstrap : public Bootstrap {
 public:
  struct State;
  InMemoryBootstrap();  // a fresh map
  explicit InMemoryBootstrap(std::shared_ptr<State> shared);
  std::shared_ptr<State> state() const { return state_; }
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  bool tryGet(const std::string& key, std::string* value) override;
  std::unique_ptr<Bootstrap> clone() override {
    return std::make_unique<InMemoryBootstrap>(state_);
  }

 private:
  std::shared_ptr<State> state_;
};

// A view of another Bootstrap whose keys all start with `prefix`: ranks of
// one host meet in their own key space.
class PrefixBootstrap : public Bootstrap {
 public:
  PrefixBootstrap(Bootstrap& inner, std::string prefix)
      : inner_(inner), prefix_(std::move(prefix)) {}
  void set(const std::string& key, const std::string& value) override {
    inner_.set(prefix_ + key, value);
  }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    return inner_.get(prefix_ + key, timeout);
  }
  bool tryGet(const std::string& key, std::string* value) override {
    return inner_.tryGet(prefix_ + key, value);
  }

 private:
  Bootstrap& inner_;
  std::string prefix_;
};

// One file per key in a directory, for ranks that are separate processes.
class FileBootstrap : public Bootstrap {
 public:
  explicit FileBootstrap(std::string dir);
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  bool tryGet(const std::string& key, std::string* value) override;
  std::unique_ptr<Bootstrap> clone() override { return std::make_unique<FileBootstrap>(dir_); }

 private:
  std::string dir_;
};

}  // namespace smddp
