#include "common/logging.h"

#include "common/param.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace smddp {

static const ParamRegistrar kLogLevelParam{"SMDDP_LOG_LEVEL", "string", "warn",
                                           "log threshold: error, warn, info or debug", __FILE__};

LogLevel logThreshold() {
  // Read once: a logging knob must never throw, so unknown values mean warn.
  static const LogLevel level = [] {
    const char* v = std::getenv("SMDDP_LOG_LEVEL");
    if (!v) return LogLevel::kWarn;
    if (!std::strcmp(v, "error")) return LogLevel::kError;
    if (!std::strcmp(v, "info")) return LogLevel::kInfo;
    if (!std::strcmp(v, "debug")) return LogLevel::kDebug;
    return LogLevel::kWarn;
  }();
  return level;
}

LogLine::LogLine(LogLevel level) : level_(level) {
  static const char* names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
  stream_ << "[smddp " << names[static_cast<int>(level)] << " pid " << getpid() << "] ";
}

LogLine::~LogLine() {
  stream_ << "\n";
  std::string s = stream_.str();
  fwrite(s.data(), 1, s.size(), stderr);
}

}  // namespace smddp
