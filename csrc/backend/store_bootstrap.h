// Bootstrap over the c10d Store handed to the backend: the only way ranks
// find each other, so no extra ports or daemons are needed.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

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

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace c10d_smddp
