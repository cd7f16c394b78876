// SMDDP_* configuration, declared next to the code that reads it (the
// NCCL_PARAM pattern). Every declaration registers its name, type, default
// and doc so `python -m torch_smddp.info` and the README can list them.
// A malformed value throws an Error naming the variable.
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
};

// All parameters declared so far (static registration order).
const std::vector<ParamSpec>& allParams();

struct ParamRegistrar {
  ParamRegistrar(const char* env, const char* type, const char* def, const char* doc);
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

#define SMDDP_PARAM_INT(Name, ENV, Default, Lo, Hi, Doc)                           \
  static const ::smddp::ParamRegistrar Name##Registrar_{ENV, "int", #Default, Doc}; \
  [[maybe_unused]] static int64_t Name() { return ::smddp::readIntParam(ENV, Default, Lo, Hi); }

#define SMDDP_PARAM_BYTES(Name, ENV, Default, Lo, Hi, Doc)                            \
  static const ::smddp::ParamRegistrar Name##Registrar_{ENV, "bytes", #Default, Doc}; \
  [[maybe_unused]] static int64_t Name() { return ::smddp::readBytesParam(ENV, Default, Lo, Hi); }

#define SMDDP_PARAM_BOOL(Name, ENV, Default, Doc)                                    \
  static const ::smddp::ParamRegistrar Name##Registrar_{ENV, "bool", #Default, Doc}; \
  [[maybe_unused]] static bool Name() { return ::smddp::readBoolParam(ENV, Default); }

#define SMDDP_PARAM_STRING(Name, ENV, Default, Doc)                                    \
  static const ::smddp::ParamRegistrar Name##Registrar_{ENV, "string", Default, Doc}; \
  [[maybe_unused]] static std::string Name() { return ::smddp::readStringParam(ENV, Default); }
