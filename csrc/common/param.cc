#include "common/param.h"

#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <set>

#include "common/error.h"
#include "common/logging.h"

namespace smddp {
namespace {

std::vector<ParamSpec>& registry() {
  static std::vector<ParamSpec> r;
  return r;
}

std::mutex& loggedMutex() {
  static std::mutex m;
  return m;
}

// Logs each overridden variable once per process.
void noteOverride(const char* env, const std::string& value) {
  static std::set<std::string> logged;  // guarded by loggedMutex()
  std::lock_guard<std::mutex> lock(loggedMutex());
  if (logged.insert(std::string(env) + "=" + value).second) {
    SMDDP_LOG(kInfo) << env << " set by environment to " << value;
  }
}

[[noreturn]] void badValue(const char* env, const std::string& text, const std::string& expect) {
  throwError(ErrorKind::kInvalidArgument,
             std::string("invalid value for ") + env + "='" + text + "': expected " + expect);
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\n\r");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\n\r");
  return s.substr(b, e - b + 1);
}

const char* envValue(const char* env) {
  const char* v = std::getenv(env);
  return (v && *v) ? v : nullptr;
}

}  // namespace

const std::vector<ParamSpec>& allParams() { return registry(); }

ParamRegistrar::ParamRegistrar(const char* env, const char* type, const char* def, const char* doc,
                               const char* file, bool ranged, int64_t lo, int64_t hi) {
  for (const auto& p : registry()) {
    if (p.env == env) return;
  }
  // __FILE__ is the path the compiler was given: keep it from csrc/ on, so
  // the registry reads the same in every checkout and build directory.
  std::string where = file ? file : "";
  const size_t at = where.rfind("csrc/");
  where = at == std::string::npos ? "" : where.substr(at + 5);
  registry().push_back({env, type, def, doc, where, ranged, lo, hi});
}

int64_t parseIntParam(const char* env, const std::string& text, int64_t lo, int64_t hi) {
  std::string t = trim(text);
  std::string range = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (t.empty()) badValue(env, text, range);
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(t.c_str(), &end, 10);
  if (errno != 0 || end == t.c_str() || *end != '\0') badValue(env, text, range);
  if (v < lo || v > hi) badValue(env, text, range);
  return v;
}

int64_t parseBytesParam(const char* env, const std::string& text, int64_t lo, int64_t hi) {
  std::string t = trim(text);
  std::string range = "a byte count in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                      "], optionally with a K, M or G suffix";
  if (t.empty()) badValue(env, text, range);
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(t.c_str(), &end, 10);
  if (errno != 0 || end == t.c_str() || v < 0) badValue(env, text, range);
  std::string suffix = end;
  int64_t mult = 1;
  if (suffix.empty() || suffix == "B") mult = 1;
  else if (suffix == "K" || suffix == "KB" || suffix == "KiB" || suffix == "k") mult = 1LL << 10;
  else if (suffix == "M" || suffix == "MB" || suffix == "MiB" || suffix == "m") mult = 1LL << 20;
  else if (suffix == "G" || suffix == "GB" || suffix == "GiB" || suffix == "g") mult = 1LL << 30;
  else badValue(env, text, range);
  if (v > hi / mult) badValue(env, text, range);
  int64_t bytes = v * mult;
  if (bytes < lo || bytes > hi) badValue(env, text, range);
  return bytes;
}

bool parseBoolParam(const char* env, const std::string& text) {
  std::string t = trim(text);
  if (t == "1" || t == "true" || t == "TRUE" || t == "True" || t == "yes" || t == "on") return true;
  if (t == "0" || t == "false" || t == "FALSE" || t == "False" || t == "no" || t == "off") return false;
  badValue(env, text, "a boolean (1/0, true/false, yes/no, on/off)");
}

int64_t readIntParam(const char* env, int64_t def, int64_t lo, int64_t hi) {
  const char* v = envValue(env);
  if (!v) return def;
  int64_t r = parseIntParam(env, v, lo, hi);
  noteOverride(env, v);
  return r;
}

int64_t readBytesParam(const char* env, int64_t def, int64_t lo, int64_t hi) {
  const char* v = envValue(env);
  if (!v) return def;
  int64_t r = parseBytesParam(env, v, lo, hi);
  noteOverride(env, v);
  return r;
}

bool readBoolParam(const char* env, bool def) {
  const char* v = envValue(env);
  if (!v) return def;
  bool r = parseBoolParam(env, v);
  noteOverride(env, v);
  return r;
}

std::string readStringParam(const char* env, const std::string& def,
                            const std::vector<std::string>& allowed) {
  const char* v = envValue(env);
  if (!v) return def;
  std::string s = trim(v);
  if (!allowed.empty()) {
    bool ok = false;
    std::string list;
    for (const auto& a : allowed) {
      ok = ok || a == s;
      list += (list.empty() ? "" : ", ") + a;
    }
    if (!ok) badValue(env, v, "one of: " + list);
  }
  noteOverride(env, s);
  return s;
}

}  // namespace smddp
