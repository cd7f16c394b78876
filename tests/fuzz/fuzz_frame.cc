// libFuzzer target for the wire-format checks a receiver runs on bytes a
// peer (or anybody who can reach the endpoint) sent: validateFrame for data
// frames, validateControlFrame for error/probe frames, and the describe()
// path that error messages take through a hostile header.
//
// Oracle: besides "no crash, no sanitizer report", every frame a validator
// accepts is re-checked here against the rules of docs/design.md ("Wire format and validation")
// written out independently; an accepted frame that breaks one aborts.
//
// Build: cmake -DSMDDP_BUILD_FUZZERS=ON -DCMAKE_CXX_COMPILER=clang++ (see
// `make fuzz` and README.md, "Fuzzing").
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "transport/frame.h"

using namespace smddp;

namespace {

constexpr uint64_t kSecret = 0x5eed5eed12345678ULL;

[[noreturn]] void violated(const char* rule, FrameVerdict v, const std::string& why) {
  fprintf(stderr, "fuzz_frame: accepted frame breaks rule: %s (verdict %d, why '%s')\n", rule,
          static_cast<int>(v), why.c_str());
  abort();
}

#define REQUIRE_RULE(cond, rule)                  \
  do {                                            \
    if (!(cond)) violated(rule, verdict, why);   \
  } while (0)

CollectiveSignature consumeSignature(FuzzedDataProvider& in) {
  CollectiveSignature s;
  s.collective = static_cast<CollectiveType>(in.ConsumeIntegralInRange<uint8_t>(1, 10));
  s.dtype = static_cast<DataType>(
      in.ConsumeIntegralInRange<uint8_t>(0, static_cast<uint8_t>(DataType::kCount) - 1));
  s.op = static_cast<ReduceOp>(
      in.ConsumeIntegralInRange<uint8_t>(0, static_cast<uint8_t>(ReduceOp::kCount) - 1));
  s.numel = in.ConsumeBool() ? in.ConsumeIntegralInRange<uint64_t>(0, 4096)
                             : in.ConsumeIntegral<uint64_t>();
  s.root = in.ConsumeIntegralInRange<int32_t>(-1, 8);
  return s;
}

// A byte-exact wrong answer in `received` arithmetic is the classic bug:
// pick small, boundary and huge values alike.
size_t consumeReceived(FuzzedDataProvider& in, uint64_t hintLength) {
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0: return sizeof(FrameHeader) + hintLength;  // consistent (may wrap: fine)
    case 1: return in.ConsumeIntegralInRange<size_t>(0, 2 * sizeof(FrameHeader));
    case 2: return sizeof(FrameHeader) + in.ConsumeIntegralInRange<size_t>(0, 1 << 20);
    default: return in.ConsumeIntegral<size_t>();
  }
}

// The header under test: raw fuzz bytes, or a well-formed header whose
// fields are then selectively overwritten (reaches the accept paths fast).
// Returned on the heap at exactly sizeof(FrameHeader), so a validator that
// read past the header would trip ASan.
std::unique_ptr<FrameHeader> consumeHeader(FuzzedDataProvider& in, const FrameExpectation& e) {
  auto h = std::make_unique<FrameHeader>();
  if (in.ConsumeBool()) {
    uint8_t raw[sizeof(FrameHeader)] = {0};
    in.ConsumeData(raw, sizeof(raw));
    std::memcpy(h.get(), raw, sizeof(raw));
    return h;
  }
  FrameKind kind = static_cast<FrameKind>(in.ConsumeIntegralInRange<uint8_t>(1, 3));
  uint64_t length = in.ConsumeBool() ? e.length.value_or(e.maxPayload)
                                     : in.ConsumeIntegral<uint64_t>();
  CollectiveSignature sig = in.ConsumeBool() ? e.sig : consumeSignature(in);
  uint64_t seq = in.ConsumeBool() ? e.seq : in.ConsumeIntegral<uint64_t>();
  uint32_t src = in.ConsumeBool() ? e.srcRank : in.ConsumeIntegral<uint32_t>();
  *h = makeHeader(kind, kSecret, seq, src, in.ConsumeIntegral<uint32_t>(),
                  in.ConsumeIntegral<uint64_t>(), length, sig);
  // Flip up to four bytes anywhere in the header.
  auto* bytes = reinterpret_cast<uint8_t*>(h.get());
  int flips = in.ConsumeIntegralInRange<int>(0, 4);
  for (int i = 0; i < flips; ++i) {
    size_t at = in.ConsumeIntegralInRange<size_t>(0, sizeof(FrameHeader) - 1);
    bytes[at] ^= in.ConsumeIntegral<uint8_t>();
  }
  return h;
}

void checkDataFrame(FuzzedDataProvider& in) {
  FrameExpectation e;
  e.jobSecret = kSecret;
  e.seq = in.ConsumeIntegralInRange<uint64_t>(0, 1 << 20);
  e.worldSize = in.ConsumeIntegralInRange<uint32_t>(1, 64);
  e.srcRank = in.ConsumeIntegralInRange<uint32_t>(0, e.worldSize - 1);
  e.maxPayload = in.ConsumeIntegralInRange<uint64_t>(0, 1 << 20);
  if (in.ConsumeBool()) e.length = in.ConsumeIntegralInRange<uint64_t>(0, e.maxPayload);
  e.sig = consumeSignature(in);
  auto h = consumeHeader(in, e);
  size_t received = consumeReceived(in, h->length);

  std::string why;
  FrameVerdict verdict = validateFrame(*h, received, e, &why);
  std::string why2;
  REQUIRE_RULE(validateFrame(*h, received, e, &why2) == verdict && why2 == why,
               "validateFrame is deterministic");
  if (verdict != FrameVerdict::kOk) {
    REQUIRE_RULE(!why.empty(), "a rejected frame says why");
    return;
  }
  REQUIRE_RULE(received >= sizeof(FrameHeader), "no frame shorter than its header");
  REQUIRE_RULE(h->magic == kFrameMagic && h->version == kFrameVersion, "magic and version");
  REQUIRE_RULE(h->jobSecret == e.jobSecret, "job secret");
  REQUIRE_RULE(h->srcRank == e.srcRank && h->srcRank < e.worldSize, "source rank");
  REQUIRE_RULE(h->length == received - sizeof(FrameHeader), "length equals bytes received");
  if (h->kind == static_cast<uint8_t>(FrameKind::kError)) return;  // text payload, any length
  REQUIRE_RULE(h->kind == static_cast<uint8_t>(FrameKind::kData), "only data or error frames");
  REQUIRE_RULE(h->length <= e.maxPayload, "payload fits the posted buffer");
  REQUIRE_RULE(!e.length || h->length == *e.length, "payload has the expected length");
  REQUIRE_RULE(h->seq == e.seq, "sequence");
  REQUIRE_RULE(signatureOf(*h) == e.sig, "signature");
  REQUIRE_RULE(h->fingerprint == e.sig.fingerprint(e.seq), "fingerprint");
}

void checkControlFrame(FuzzedDataProvider& in) {
  uint32_t world = in.ConsumeIntegralInRange<uint32_t>(1, 64);
  uint64_t maxText = in.ConsumeIntegralInRange<uint64_t>(0, 8192);
  FrameExpectation e{kSecret, 0, 0, world, maxText, std::nullopt, consumeSignature(in)};
  auto h = consumeHeader(in, e);
  size_t received = consumeReceived(in, h->length);

  std::string why;
  FrameVerdict verdict = validateControlFrame(*h, received, kSecret, world, maxText, &why);
  if (verdict != FrameVerdict::kOk) {
    REQUIRE_RULE(!why.empty(), "a rejected control frame says why");
    return;
  }
  REQUIRE_RULE(received >= sizeof(FrameHeader), "no frame shorter than its header");
  REQUIRE_RULE(h->magic == kFrameMagic && h->version == kFrameVersion, "magic and version");
  REQUIRE_RULE(h->jobSecret == kSecret && h->srcRank < world, "secret and source rank");
  REQUIRE_RULE(h->length == received - sizeof(FrameHeader) && h->length <= maxText,
               "length equals bytes received and fits the text buffer");
  if (h->kind == static_cast<uint8_t>(FrameKind::kProbe)) {
    REQUIRE_RULE(h->length == 0, "a probe has no payload");
    REQUIRE_RULE(h->dtype < static_cast<uint8_t>(DataType::kCount) &&
                     h->op < static_cast<uint8_t>(ReduceOp::kCount),
                 "a probe names a known dtype and op");
    REQUIRE_RULE(h->fingerprint == signatureOf(*h).fingerprint(h->seq), "probe fingerprint");
  } else {
    REQUIRE_RULE(h->kind == static_cast<uint8_t>(FrameKind::kError),
                 "only error or probe frames on the error channel");
  }
}

// Error messages describe whatever a hostile header claims: must not crash
// on out-of-range enums and must name the collective.
void checkDescribe(FuzzedDataProvider& in) {
  FrameHeader h{};
  uint8_t raw[sizeof(FrameHeader)] = {0};
  in.ConsumeData(raw, sizeof(raw));
  std::memcpy(&h, raw, sizeof(raw));
  std::string d = signatureOf(h).describe();
  FrameVerdict verdict = FrameVerdict::kOk;
  std::string why = d;
  REQUIRE_RULE(d.find('(') != std::string::npos && d.back() == ')', "describe() is well formed");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  switch (in.ConsumeIntegralInRange<int>(0, 2)) {
    case 0: checkDataFrame(in); break;
    case 1: checkControlFrame(in); break;
    default: checkDescribe(in); break;
  }
  return 0;
}
