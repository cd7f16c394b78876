// libFuzzer target for the wire-format checks a receiver runs on bytes a
// peer (or anybody who can reach the endpoint) sent: validateFrame for data
// frames, validateControlFrame for error/probe frames, and the describe()
// path that error messages take through a hostile header.
//
// Oracle: besides "no crash, no sanitizer report", every verdict is compared
// with the wire-format spec, written out below from the header layout in
// transport/frame.h and docs/design.md ("Wire format and validation"). The
// oracle reads the header as raw bytes at the documented offsets and
// recomputes the fingerprint with its own FNV-1a; it shares no code and no
// exemption with the validators, so a validator bug cannot be mirrored here.
// It checks both directions: a frame the spec accepts must be accepted, and
// a frame the spec rejects must be rejected (with a reason).
//
// The spec. Header: 72 bytes, little-endian, fields at these byte offsets:
//   0 magic u32 = 0x50444d53 ("SMDP")   4 version u16 = 1   6 kind u8
//   7 collective u8   8 jobSecret u64   16 seq u64   24 srcRank u32
//   28 chunk u32   32 offset u64   40 length u64   48 numel u64
//   56 fingerprint u64   64 dtype u8   65 op u8   66 reserved   68 root i32
// kind: 1 data, 2 error (payload is UTF-8 text), 3 probe (header only),
// 4 leave notice (header only).
// fingerprint: FNV-1a 64 (offset basis 14695981039346656037, prime
//   1099511628211) over the little-endian bytes of six u64 words: collective,
//   dtype, op, numel, root sign-extended, seq.
// A data receive (validateFrame) accepts a frame if and only if:
//   D1 at least 72 bytes arrived;
//   D2 magic and version are as above;
//   D3 kind is data: error, probe and leave frames travel on the control tag only;
//   D4 jobSecret is the group's and srcRank is the sender the receive was
//      posted for, below the world size;
//   D5 length equals the bytes that arrived minus 72, and fits the posted
//      buffer (at most maxPayload; equal to the expected length if known);
//   D6 seq, collective, dtype, op, numel and root are those of this rank's
//      call, and the fingerprint is theirs.
//   (chunk and offset are not checked: the tag the receive was posted for
//   already fixes the phase and chunk.)
// The error channel (validateControlFrame) accepts a frame if and only if:
//   C1 at least 72 bytes arrived; C2 magic and version as above;
//   C3 kind is error, probe or leave; C4 jobSecret is the group's, srcRank
//   is below the world size; C5 length equals the bytes that arrived minus
//   72 and is at most the text buffer; C6 a probe carries no payload, names
//   a known dtype and op, and its fingerprint is that of its own fields;
//   C7 a leave notice carries no payload.
//
// Build: cmake -DSMDDP_BUILD_FUZZERS=ON -DCMAKE_CXX_COMPILER=clang++ (see
// `make fuzz` and tests/README.md, "Fuzzing").
#include <fuzzer/FuzzedDataProvider.h>

#include <bit>
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
  FrameKind kind = static_cast<FrameKind>(in.ConsumeIntegralInRange<uint8_t>(1, 4));
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

// ---- The oracle: the spec above, on raw header bytes --------------------

static_assert(std::endian::native == std::endian::little,
              "the oracle reads the little-endian wire format in place");

struct WireBytes {
  const uint8_t* b;
  template <typename T>
  T at(size_t offset) const {
    T v;
    std::memcpy(&v, b + offset, sizeof(T));
    return v;
  }
};

uint64_t specFingerprint(uint8_t collective, uint8_t dtype, uint8_t op, uint64_t numel,
                         int32_t root, uint64_t seq) {
  const uint64_t words[6] = {collective, dtype, op, numel,
                             static_cast<uint64_t>(static_cast<int64_t>(root)), seq};
  uint64_t h = 14695981039346656037ULL;
  for (uint64_t w : words) {
    for (int i = 0; i < 8; ++i) {
      h ^= (w >> (8 * i)) & 0xff;
      h *= 1099511628211ULL;
    }
  }
  return h;
}

constexpr size_t kSpecHeaderBytes = 72;
constexpr uint8_t kSpecData = 1, kSpecError = 2, kSpecProbe = 3, kSpecLeave = 4;

// D1..D6: "" when the spec accepts the frame, else the first rule it breaks.
const char* specRejectsData(const uint8_t* header, size_t received, const FrameExpectation& e) {
  if (received < kSpecHeaderBytes) return "D1 shorter than the header";
  WireBytes w{header};
  if (w.at<uint32_t>(0) != 0x50444d53u || w.at<uint16_t>(4) != 1) return "D2 magic or version";
  if (w.at<uint8_t>(6) != kSpecData) return "D3 only data frames";
  if (w.at<uint64_t>(8) != e.jobSecret) return "D4 job secret";
  const uint32_t src = w.at<uint32_t>(24);
  if (src != e.srcRank || src >= e.worldSize) return "D4 source rank";
  const uint64_t length = w.at<uint64_t>(40);
  if (length != received - kSpecHeaderBytes) return "D5 length equals the bytes carried";
  if (length > e.maxPayload || (e.length && length != *e.length)) return "D5 fits the buffer";
  const uint8_t collective = w.at<uint8_t>(7), dtype = w.at<uint8_t>(64), op = w.at<uint8_t>(65);
  const uint64_t seq = w.at<uint64_t>(16), numel = w.at<uint64_t>(48);
  const int32_t root = w.at<int32_t>(68);
  if (seq != e.seq || collective != static_cast<uint8_t>(e.sig.collective) ||
      dtype != static_cast<uint8_t>(e.sig.dtype) || op != static_cast<uint8_t>(e.sig.op) ||
      numel != e.sig.numel || root != e.sig.root) {
    return "D6 this rank's call";
  }
  if (w.at<uint64_t>(56) != specFingerprint(collective, dtype, op, numel, root, seq)) {
    return "D6 fingerprint";
  }
  return "";
}

// C1..C6, the same way.
const char* specRejectsControl(const uint8_t* header, size_t received, uint64_t jobSecret,
                               uint32_t worldSize, uint64_t maxText) {
  if (received < kSpecHeaderBytes) return "C1 shorter than the header";
  WireBytes w{header};
  if (w.at<uint32_t>(0) != 0x50444d53u || w.at<uint16_t>(4) != 1) return "C2 magic or version";
  const uint8_t kind = w.at<uint8_t>(6);
  if (kind != kSpecError && kind != kSpecProbe && kind != kSpecLeave) {
    return "C3 only error, probe or leave frames";
  }
  if (w.at<uint64_t>(8) != jobSecret || w.at<uint32_t>(24) >= worldSize) {
    return "C4 job secret and source rank";
  }
  const uint64_t length = w.at<uint64_t>(40);
  if (length != received - kSpecHeaderBytes || length > maxText) return "C5 length";
  if (kind == kSpecProbe) {
    const uint8_t dtype = w.at<uint8_t>(64), op = w.at<uint8_t>(65);
    if (length != 0) return "C6 a probe has no payload";
    if (dtype >= static_cast<uint8_t>(DataType::kCount) ||
        op >= static_cast<uint8_t>(ReduceOp::kCount)) {
      return "C6 a probe names a known dtype and op";
    }
    if (w.at<uint64_t>(56) != specFingerprint(w.at<uint8_t>(7), dtype, op, w.at<uint64_t>(48),
                                              w.at<int32_t>(68), w.at<uint64_t>(16))) {
      return "C6 probe fingerprint";
    }
  }
  if (kind == kSpecLeave && length != 0) return "C7 a leave notice has no payload";
  return "";
}

void compareWithSpec(FrameVerdict verdict, const std::string& why, const char* specRule) {
  const bool specAccepts = *specRule == '\0';
  if (verdict == FrameVerdict::kOk && !specAccepts) violated(specRule, verdict, why);
  if (verdict != FrameVerdict::kOk && specAccepts) {
    violated("the spec accepts this frame, the validator rejected it", verdict, why);
  }
  if (verdict != FrameVerdict::kOk && why.empty()) violated("a rejected frame says why", verdict, why);
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
  compareWithSpec(verdict, why,
                  specRejectsData(reinterpret_cast<const uint8_t*>(h.get()), received, e));
}

void checkControlFrame(FuzzedDataProvider& in) {
  uint32_t world = in.ConsumeIntegralInRange<uint32_t>(1, 64);
  uint64_t maxText = in.ConsumeIntegralInRange<uint64_t>(0, 8192);
  FrameExpectation e{kSecret, 0, 0, world, maxText, std::nullopt, consumeSignature(in)};
  auto h = consumeHeader(in, e);
  size_t received = consumeReceived(in, h->length);

  std::string why;
  FrameVerdict verdict = validateControlFrame(*h, received, kSecret, world, maxText, &why);
  compareWithSpec(verdict, why,
                  specRejectsControl(reinterpret_cast<const uint8_t*>(h.get()), received, kSecret,
                                     world, maxText));
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
