// A scoped SMDDP_* (or any) environment variable for tests that drive
// readers through the real environment.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace smddp {

// Sets (or, with nullopt, unsets) a variable and restores the old state.
class EnvOverride {
 public:
  EnvOverride(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) setenv(name, value->c_str(), 1);
    else unsetenv(name);
  }
  ~EnvOverride() {
    if (old_) setenv(name_, old_->c_str(), 1);
    else unsetenv(name_);
  }
  EnvOverride(const EnvOverride&) = delete;
  EnvOverride& operator=(const EnvOverride&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace smddp
