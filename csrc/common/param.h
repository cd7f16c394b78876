// SMDDP_* configuration, declared next to the code that reads it (the
// NCCL_PARAM pattern). Every declaration registers its name, type, default,
// range, doc and the file that declares it, so `python -m torch_smddp.info`
// can list them and `python -m torch_smddp.info --markdown` writes
// docs/configuration.md from them. A malformed value throws an Error naming
// the variable.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace smddp {

struct ParamSpec {
  std::string env;
  std::string type;
  std::string defaultValue;
  std::string doc;
  std::string file;      // the declaring file, relative to csrc/ ("" if unknown)
  bool ranged = false;   // int and bytes parameters: accepted values [lo, hi]
  int64_t lo = 0;
  int64_t hi = 0;
};

// All parameters declared so far (static registration order).
const std::vector<ParamSpec>& allParams();

struct ParamRegistrar {
  // `file` is __FILE__ of the declaration; only its part from csrc/ on is kept.
  ParamRegistrar(const char* env, const char* type, const char* def, const char* doc,
                 const char* file = nullptr, bool ranged = false, int64_t lo = 0, int64_t hi = 0);
};

// Parsers (exposed for tests). Each throws kInvalidArgument naming `env`.
int64_t parseIntParam(const char* env, const std::string& text, int64_t lo, int64_t hi);
// Accepts plain bytes or a K/M/G/KiB/MiB/GiB suffix.
int64_t parseBytesParam(const char* env, const std::string& text, int64_t lo, int64_t hi);
bool parseBoolParam(const char* env, const std::string& text);

// Readers: the default when unset or empty; logs the first override.
int64_t readIntParam(const char* env, int64_t def, int64_t lo, int64_t hi);
int64_t readBytesParam(const char* env, int64_t def, int64_t lo, int64_t hi);
bool readBoolParam(const char* env, bool def);
std::string readStringParam(const char* env, const std::string& def,
                            const std::vector<std::string>& allowed = {});

}  // namespace smddp

#define SMDDP_PARAM_INT(Name, ENV, Default, Lo, Hi, Doc)                                     \
  static const ::smddp::ParamRegistrar Name##Registrar_{ENV, "int", #Default, Doc, __FILE__, \
                                                        true, Lo, Hi};                       \
  [[maybe_unused]] static int64_t Name() { return ::smddp::readIntParam(ENV, Default, Lo, Hi); }

#define SMDDP_PARAM_BYTES(Name, ENV, Default, Lo, Hi, Doc)                                     \
  static const ::smddp::ParamRegistrar Name##Registrar_{ENV, "bytes", #Default, Doc, __FILE__, \
                                                        true, Lo, Hi};                         \
  [[maybe_unused]] static int64_t Name() { return ::smddp::readBytesParam(ENV, Default, Lo, Hi); }

#define SMDDP_PARAM_BOOL(Name, ENV, Default, Doc)                                              \
  static const ::smddp::ParamRegistrar Name##Registrar_{ENV, "bool", #Default, Doc, __FILE__}; \
  [[maybe_unused]] static bool Name() { return ::smddp::readBoolParam(ENV, Default); }

#define SMDDP_PARAM_STRING(Name, ENV, Default, Doc)                                              \
  static const ::smddp::ParamRegistrar Name##Registrar_{ENV, "string", Default, Doc, __FILE__}; \
  [[maybe_unused]] static std::string Name() { return ::smddp::readStringParam(ENV, Default); }
