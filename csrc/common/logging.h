// Minimal leveled logging to stderr. SMDDP_LOG_LEVEL picks the threshold
// (error, warn, info, debug); the default, warn, keeps training output clean.
#pragma once

#include <sstream>

namespace smddp {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

LogLevel logThreshold();

class LogLine {
 public:
  explicit LogLine(LogLevel level);
  ~LogLine();
  template <typename T>
  LogLine& operator<<(const T& v) {
    stream_ << v;
    return *this;
  }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace smddp

#define SMDDP_LOG(level)                                                                      \
  if (::smddp::LogLevel::level > ::smddp::logThreshold()) {                                   \
  } else                                                                                      \
    ::smddp::LogLine(::smddp::LogLevel::level)
