// SMDDP_* parameter parsing (common/param.h): accepted spellings give the
// closed-form value, everything else throws an invalid-argument Error that
// names the variable. Readers are driven through the real environment,
// which every test restores.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <set>
#include <string>

#include "common/error.h"
#include "common/param.h"
#include "env_override.h"

namespace {

using namespace smddp;

constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();

// Runs `fn`, which must throw an invalid-argument Error naming `env`.
template <typename F>
void requireRejected(const char* env, const std::string& text, F&& fn) {
  INFO(env << "='" << text << "'");
  try {
    fn();
    FAIL("accepted");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kInvalidArgument);
    CHECK_THAT(std::string(e.what()), Catch::Contains(env));
  }
}

}  // namespace

TEST_CASE("integer parameters: accepted spellings", "[param]") {
  const char* env = "SMDDP_TEST_INT";
  CHECK(parseIntParam(env, "42", 0, 100) == 42);
  CHECK(parseIntParam(env, "  42\t\n", 0, 100) == 42);
  CHECK(parseIntParam(env, "+7", 0, 100) == 7);
  CHECK(parseIntParam(env, "-5", -10, 10) == -5);
  CHECK(parseIntParam(env, "007", 0, 100) == 7);  // decimal, not octal
  // Bounds are inclusive.
  CHECK(parseIntParam(env, "0", 0, 100) == 0);
  CHECK(parseIntParam(env, "100", 0, 100) == 100);
  CHECK(parseIntParam(env, "9223372036854775807", 0, kI64Max) == kI64Max);
  CHECK(parseIntParam(env, "-9223372036854775808", kI64Min, 0) == kI64Min);
}

TEST_CASE("integer parameters: out of range, garbage and overflow are rejected", "[param]") {
  const char* env = "SMDDP_TEST_INT";
  for (const char* text :
       {"-1", "101", "", "   ", "abc", "12abc", "abc12", "1.5", "1e3", "0x10", "+", "-",
        "12 34", "4K", "99999999999999999999", "-99999999999999999999",
        "9223372036854775808", "18446744073709551616"}) {
    requireRejected(env, text, [&] { parseIntParam(env, text, 0, 100); });
  }
  // Overflow must be caught even when the range is the whole of int64.
  for (const char* text : {"99999999999999999999", "9223372036854775808",
                           "-9223372036854775809"}) {
    requireRejected(env, text, [&] { parseIntParam(env, text, kI64Min, kI64Max); });
  }
}

TEST_CASE("the error message shows the bad value and the accepted range", "[param]") {
  try {
    parseIntParam("SMDDP_SPIN_US", "fast", 0, 1000000);
    FAIL("accepted");
  } catch (const Error& e) {
    std::string m = e.what();
    CHECK_THAT(m, Catch::Contains("SMDDP_SPIN_US"));
    CHECK_THAT(m, Catch::Contains("'fast'"));
    CHECK_THAT(m, Catch::Contains("[0, 1000000]"));
  }
}

TEST_CASE("byte parameters: plain counts and K/M/G suffixes", "[param]") {
  const char* env = "SMDDP_TEST_BYTES";
  const int64_t hi = 1LL << 40;
  struct Case {
    const char* text;
    int64_t bytes;
  };
  const Case cases[] = {
      {"0", 0},
      {"4096", 4096},
      {"16B", 16},
      {"4K", 4096},
      {"4k", 4096},
      {"4KB", 4096},
      {"4KiB", 4096},
      {"3M", 3LL << 20},
      {"3m", 3LL << 20},
      {"3MB", 3LL << 20},
      {"3MiB", 3LL << 20},
      {"2G", 2LL << 30},
      {"2g", 2LL << 30},
      {"2GB", 2LL << 30},
      {"2GiB", 2LL << 30},
      {" 8M ", 8LL << 20},
      {"\t1024\n", 1024},
      {"1024G", 1LL << 40},  // exactly hi
  };
  for (const auto& c : cases) {
    INFO("'" << c.text << "'");
    CHECK(parseBytesParam(env, c.text, 0, hi) == c.bytes);
  }
}

TEST_CASE("byte parameters: bad suffixes, negatives, range and overflow are rejected",
          "[param]") {
  const char* env = "SMDDP_TEST_BYTES";
  const int64_t lo = 4096, hi = 1LL << 30;
  for (const char* text :
       {"", "  ", "K", "4X", "4T", "4KK", "4Kib", "1.5M", "-1", "-4K", "4096x", "0x1000",
        "4095", "3K",              // below lo
        "1025M", "2G", "1073741825",  // above hi
        "99999999999999999999", "99999999999999999999K",
        "9223372036854775807K",    // fits int64 until multiplied
        "8589934592G"}) {
    requireRejected(env, text, [&] { parseBytesParam(env, text, lo, hi); });
  }
  // With the whole int64 range allowed, the multiplication itself must not
  // overflow.
  // 2^54 + 1 KiB and 2^34 + 1 GiB wrap to exactly 1 KiB and 1 GiB.
  for (const char* text : {"9223372036854775807K", "8589934592G", "8796093022208M",
                           "18014398509481985K", "17179869185G"}) {
    requireRejected(env, text, [&] { parseBytesParam(env, text, 0, kI64Max); });
  }
  CHECK(parseBytesParam(env, "8589934591G", 0, kI64Max) == 8589934591LL << 30);
  CHECK(parseBytesParam(env, "4K", lo, hi) == lo);
  CHECK(parseBytesParam(env, "1G", lo, hi) == hi);
}

TEST_CASE("boolean parameters", "[param]") {
  const char* env = "SMDDP_TEST_BOOL";
  for (const char* t : {"1", "true", "TRUE", "True", "yes", "on", " yes\n"}) {
    INFO("'" << t << "'");
    CHECK(parseBoolParam(env, t) == true);
  }
  for (const char* t : {"0", "false", "FALSE", "False", "no", "off", "\toff "}) {
    INFO("'" << t << "'");
    CHECK(parseBoolParam(env, t) == false);
  }
  for (const char* t : {"", "2", "-1", "maybe", "tru", "yes please", "y e s", "01"}) {
    requireRejected(env, t, [&] { parseBoolParam(env, t); });
  }
}

TEST_CASE("readers return the default when unset or empty, else the parsed value", "[param]") {
  const char* env = "SMDDP_TEST_READER";
  SECTION("int") {
    {
      EnvOverride e(env, std::nullopt);
      CHECK(readIntParam(env, 17, 0, 100) == 17);
    }
    {
      EnvOverride e(env, "");
      CHECK(readIntParam(env, 17, 0, 100) == 17);
    }
    {
      EnvOverride e(env, " 64 ");
      CHECK(readIntParam(env, 17, 0, 100) == 64);
    }
    {
      EnvOverride e(env, "101");
      requireRejected(env, "101", [&] { readIntParam(env, 17, 0, 100); });
    }
    {
      EnvOverride e(env, "lots");
      requireRejected(env, "lots", [&] { readIntParam(env, 17, 0, 100); });
    }
  }
  SECTION("bytes") {
    {
      EnvOverride e(env, std::nullopt);
      CHECK(readBytesParam(env, 1 << 20, 1, 1LL << 30) == 1 << 20);
    }
    {
      EnvOverride e(env, "2MiB");
      CHECK(readBytesParam(env, 1 << 20, 1, 1LL << 30) == 2 << 20);
    }
    {
      EnvOverride e(env, "2Q");
      requireRejected(env, "2Q", [&] { readBytesParam(env, 1 << 20, 1, 1LL << 30); });
    }
  }
  SECTION("bool") {
    {
      EnvOverride e(env, std::nullopt);
      CHECK(readBoolParam(env, true) == true);
      CHECK(readBoolParam(env, false) == false);
    }
    {
      EnvOverride e(env, "off");
      CHECK(readBoolParam(env, true) == false);
    }
    {
      EnvOverride e(env, "sometimes");
      requireRejected(env, "sometimes", [&] { readBoolParam(env, true); });
    }
  }
  SECTION("string") {
    const std::vector<std::string> allowed = {"shm", "tcp;ofi_rxm"};
    {
      EnvOverride e(env, std::nullopt);
      CHECK(readStringParam(env, "dflt") == "dflt");
      CHECK(readStringParam(env, "", allowed).empty());
    }
    {
      EnvOverride e(env, " tcp;ofi_rxm ");
      CHECK(readStringParam(env, "", allowed) == "tcp;ofi_rxm");
      CHECK(readStringParam(env, "") == "tcp;ofi_rxm");
    }
    {
      EnvOverride e(env, "verbs");
      CHECK(readStringParam(env, "") == "verbs");  // no list: anything goes
      requireRejected(env, "verbs", [&] { readStringParam(env, "", allowed); });
      try {
        readStringParam(env, "", allowed);
      } catch (const Error& err) {
        CHECK_THAT(std::string(err.what()), Catch::Contains("shm, tcp;ofi_rxm"));
      }
    }
  }
}

TEST_CASE("EnvOverride restores the environment", "[param]") {
  const char* env = "SMDDP_TEST_RESTORE";
  unsetenv(env);
  {
    EnvOverride a(env, "1");
    {
      EnvOverride b(env, std::nullopt);
      CHECK(std::getenv(env) == nullptr);
    }
    REQUIRE(std::getenv(env) != nullptr);
    CHECK(std::string(std::getenv(env)) == "1");
  }
  CHECK(std::getenv(env) == nullptr);
}

TEST_CASE("allParams lists the parameters declared across the core", "[param]") {
  const auto& params = allParams();
  auto find = [&](const std::string& name) -> const ParamSpec* {
    for (const auto& p : params) {
      if (p.env == name) return &p;
    }
    return nullptr;
  };
  struct Expected {
    const char* env;
    const char* type;
  };
  for (const Expected& x : {Expected{"SMDDP_CHUNK_BYTES", "bytes"},
                            Expected{"SMDDP_MIN_SHARD_BYTES", "bytes"},
                            Expected{"SMDDP_SPIN_US", "int"}, Expected{"SMDDP_SLEEP_US", "int"},
                            Expected{"SMDDP_HOST_ID", "string"},
                            Expected{"SMDDP_FI_PROVIDER", "string"}}) {
    INFO(x.env);
    const ParamSpec* p = find(x.env);
    REQUIRE(p != nullptr);
    CHECK(p->type == x.type);
    CHECK_FALSE(p->doc.empty());
  }
  CHECK_FALSE(find("SMDDP_CHUNK_BYTES")->defaultValue.empty());
  // Where each is declared, relative to csrc/, and the range of a number
  // (docs/configuration.md is generated from these).
  CHECK(find("SMDDP_LOG_LEVEL")->file == "common/logging.cc");
  const ParamSpec* timeout = find("SMDDP_PEER_TIMEOUT");
  CHECK(timeout->file == "transport/peer_monitor.cc");
  CHECK(timeout->ranged);
  CHECK(timeout->lo == 0);
  CHECK(timeout->hi == 86400);
  CHECK_FALSE(find("SMDDP_FI_PROVIDER")->ranged);
  std::set<std::string> names;
  for (const auto& p : params) {
    INFO(p.env);
    // Ours, or torch's own names that smddp honours (TORCH_FR_*).
    CHECK((p.env.rfind("SMDDP_", 0) == 0 || p.env.rfind("TORCH_FR_", 0) == 0));
    CHECK(names.insert(p.env).second);  // each name once
    if (p.env.rfind("SMDDP_TEST_", 0) != 0) CHECK_FALSE(p.file.empty());
  }
}

TEST_CASE("registering a name twice keeps the first declaration", "[param]") {
  const size_t before = allParams().size();
  ParamRegistrar a("SMDDP_TEST_TWICE", "int", "1", "first");
  ParamRegistrar b("SMDDP_TEST_TWICE", "bool", "0", "second");
  REQUIRE(allParams().size() == before + 1);
  CHECK(allParams().back().env == "SMDDP_TEST_TWICE");
  CHECK(allParams().back().doc == "first");
}
