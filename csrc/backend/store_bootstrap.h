// Bootstrap over the c10d Store handed to the backend: the only way ranks
// find each other, so no extra ports or daemons are needed.
#pragma once

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <atomic>
#include <algorithm>
#include <memory>
#include <string>
#include <thread>

#include "common/error.h"
#include "transport/bootstrap.h"

namespace c10d_smddp {

// Lets another thread stop a group that is still forming (torchft aborts
// a reconfigure whose peers never come): once cancelled, every store wait
// of the group's bootstrap throws kAborted within kCancelPoll (5 ms).
class FormationCancel {
 public:
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }
  void check() const {
    if (cancelled()) {
      smddp::throwError(smddp::ErrorKind::kAborted,
                        "smddp: the group was aborted while it was still forming");
    }
  }

 private:
  std::atomic<bool> cancelled_{false};
};

class StoreBootstrap : public smddp::Bootstrap {
 public:
  explicit StoreBootstrap(c10::intrusive_ptr<c10d::Store> store,
                          std::shared_ptr<FormationCancel> cancel = nullptr)
      : store_(std::move(store)), cancel_(std::move(cancel)) {}
  void set(const std::string& key, const std::string& value) override {
    if (cancel_) cancel_->check();
    store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    if (!cancel_) {
      store_->wait({key}, timeout);
    } else if (!waitFor(key, timeout)) {
      smddp::throwError(smddp::ErrorKind::kTimeout,
                        "smddp: bootstrap timed out after " + std::to_string(timeout.count()) +
                            " ms waiting for key '" + key + "'");
    }
    auto v = store_->get(key);
    return std::string(v.begin(), v.end());
  }
  bool tryGet(const std::string& key, std::string* value) override {
    if (cancel_) cancel_->check();
    if (!store_->check({key})) return false;
    auto v = store_->get(key);
    value->assign(v.begin(), v.end());
    return true;
  }
  // A TCPStore blocks on the key in its server, so a waiting thread costs
  // nothing; other stores (a FileStore polls its file) are polled slowly.
  // A cancellable wait polls instead (PollPause), backing off to kCancelPoll: a store
  // wait cannot be interrupted, and one cut into slices logs a warning per
  // slice that runs out.
  bool waitFor(const std::string& key, std::chrono::milliseconds timeout) override {
    const auto until = std::chrono::steady_clock::now() + timeout;
    if (cancel_) {
      smddp::PollPause pause(kCancelPoll);
      while (true) {
        cancel_->check();
        if (store_->check({key})) return true;
        if (std::chrono::steady_clock::now() >= until) return false;
        std::this_thread::sleep_for(pause.next());
      }
    }
    if (!blocksOnWait()) {
      while (!store_->check({key})) {
        if (std::chrono::steady_clock::now() >= until) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
      return true;
    }
    try {
      store_->wait({key}, timeout);
      return true;
    } catch (const c10::DistStoreError&) {
      return store_->check({key});  // a timeout; a broken store throws here
    }
  }
  bool waitBlocks() const override { return blocksOnWait(); }
  // Handles for the group's own threads after it formed: not cancellable.
  std::unique_ptr<smddp::Bootstrap> share() override {
    return std::make_unique<StoreBootstrap>(store_);
  }
  std::unique_ptr<smddp::Bootstrap> clone() override {
    try {
      return std::make_unique<StoreBootstrap>(store_->clone());
    } catch (const std::exception&) {
      return nullptr;  // e.g. a store written in Python
    }
  }

 private:
  bool blocksOnWait() const {
    c10d::Store* s = store_.get();
    c10::intrusive_ptr<c10d::Store> inner;
    if (auto* p = dynamic_cast<c10d::PrefixStore*>(s)) {
      inner = p->getUnderlyingNonPrefixStore();
      s = inner.get();
    }
    return dynamic_cast<c10d::TCPStore*>(s) != nullptr;
  }

  static constexpr std::chrono::milliseconds kCancelPoll{5};

  c10::intrusive_ptr<c10d::Store> store_;
  std::shared_ptr<FormationCancel> cancel_;  // null: not cancellable
};

}  // namespace c10d_smddp
