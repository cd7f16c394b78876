// Each layer's own tunables, carried by a group's EngineConfig without the
// engine knowing their types (the NCCL_PARAM pattern, one struct per
// layer): the layer that reads its SMDDP_* values sets its struct, and
// reads it back where it needs it; a struct never set reads as T{}.
#pragma once

#include <memory>
#include <typeindex>
#include <typeinfo>
#include <unordered_map>
#include <utility>

namespace smddp {

class LayerConfigs {
 public:
  template <class T>
  void set(T value) {
    slots_[std::type_index(typeid(T))] = std::make_shared<const T>(std::move(value));
  }
  template <class T>
  const T& get() const {
    auto it = slots_.find(std::type_index(typeid(T)));
    if (it == slots_.end()) {
      static const T kUnset{};
      return kUnset;
    }
    return *static_cast<const T*>(it->second.get());
  }

 private:
  std::unordered_map<std::type_index, std::shared_ptr<const void>> slots_;
};

}  // namespace smddp
