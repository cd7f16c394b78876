// Bootstrap over the c10d Store handed to the backend: the only way ranks
// find each other, so no extra ports or daemons are needed.
#pragma once

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <thread>

#include "transport/bootstrap.h"

namespace c10d_smddp {

class StoreBootstrap : public smddp::Bootstrap {
 public:
  explicit StoreBootstrap(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::string& value) override {
    store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    store_->wait({key}, timeout);
    auto v = store_->get(key);
    return std::string(v.begin(), v.end());
  }
  bool tryGet(const std::string& key, std::string* value) override {
    if (!store_->check({key})) return false;
    auto v = store_->get(key);
    value->assign(v.begin(), v.end());
    return true;
  }
  // A TCPStore blocks on the key in its server, so a waiting thread costs
  // nothing; other stores (a FileStore polls its file) are polled slowly.
  bool waitFor(const std::string& key, std::chrono::milliseconds timeout) override {
    if (!blocksOnWait()) {
      const auto until = std::chrono::steady_clock::now() + timeout;
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

  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace c10d_smddp
