// The wire format (transport/frame.h) against closed forms: header fields
// as written, every validation rule with its verdict, FNV-1a fingerprints
// recomputed here, and the tag bit layout decoded field by field.
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "common/error.h"
#include "transport/frame.h"

namespace {

using namespace smddp;

constexpr size_t kHdr = sizeof(FrameHeader);
constexpr uint64_t kSecret = 0x0123456789abcdefULL;
constexpr uint64_t kSeq = 41;
constexpr uint32_t kWorld = 4;
constexpr uint32_t kSrc = 2;

CollectiveSignature allreduceSig() {
  return {CollectiveType::kAllreduce, DataType::kFloat32, ReduceOp::kSum, 1024, -1};
}

// What a receiver expecting rank kSrc's `bytes`-byte payload of `sig` posts.
FrameExpectation expectFor(const CollectiveSignature& sig, uint64_t bytes) {
  return {kSecret, kSeq, kSrc, kWorld, bytes, bytes, sig};
}

FrameHeader dataHeader(const CollectiveSignature& sig, uint64_t bytes) {
  return makeHeader(FrameKind::kData, kSecret, kSeq, kSrc, 3, 4096, bytes, sig);
}

struct Outcome {
  FrameVerdict verdict;
  std::string why;
};

Outcome check(const FrameHeader& h, size_t received, const FrameExpectation& e) {
  Outcome o{FrameVerdict::kOk, "<untouched>"};
  o.verdict = validateFrame(h, received, e, &o.why);
  return o;
}

// Independent FNV-1a over the six little-endian 64-bit words the
// fingerprint covers (collective, dtype, op, numel, root sign-extended, seq).
uint64_t fnv1a(const std::vector<uint64_t>& words) {
  uint64_t h = 14695981039346656037ULL;
  for (uint64_t w : words) {
    for (int i = 0; i < 8; ++i) {
      h ^= (w >> (8 * i)) & 0xff;
      h *= 1099511628211ULL;
    }
  }
  return h;
}

uint64_t oracleFingerprint(const CollectiveSignature& s, uint64_t seq) {
  return fnv1a({static_cast<uint64_t>(s.collective), static_cast<uint64_t>(s.dtype),
                static_cast<uint64_t>(s.op), s.numel,
                static_cast<uint64_t>(static_cast<int64_t>(s.root)), seq});
}

}  // namespace

TEST_CASE("makeHeader writes every field and validateFrame accepts it", "[frame]") {
  for (int c = 1; c <= 10; ++c) {
    for (int d = 0; d < static_cast<int>(DataType::kCount); ++d) {
      for (int o = 0; o < static_cast<int>(ReduceOp::kCount); ++o) {
        for (int32_t root : {-1, 0, 3}) {
          CollectiveSignature sig{static_cast<CollectiveType>(c), static_cast<DataType>(d),
                                  static_cast<ReduceOp>(o), 777, root};
          FrameHeader h = makeHeader(FrameKind::kData, kSecret, kSeq, kSrc, 5, 96, 300, sig);
          INFO("collective " << c << " dtype " << d << " op " << o << " root " << root);
          REQUIRE(h.magic == 0x50444d53u);
          REQUIRE(std::memcmp(&h.magic, "SMDP", 4) == 0);  // little-endian host
          REQUIRE(h.version == 1);
          REQUIRE(h.kind == 1);
          REQUIRE(h.collective == c);
          REQUIRE(h.jobSecret == kSecret);
          REQUIRE(h.seq == kSeq);
          REQUIRE(h.srcRank == kSrc);
          REQUIRE(h.chunk == 5u);
          REQUIRE(h.offset == 96u);
          REQUIRE(h.length == 300u);
          REQUIRE(h.numel == 777u);
          REQUIRE(h.dtype == d);
          REQUIRE(h.op == o);
          REQUIRE(h.reserved == 0);
          REQUIRE(h.root == root);
          REQUIRE(h.fingerprint == oracleFingerprint(sig, kSeq));
          REQUIRE(signatureOf(h) == sig);
          Outcome r = check(h, kHdr + 300, expectFor(sig, 300));
          REQUIRE(r.verdict == FrameVerdict::kOk);
        }
      }
    }
  }
}

TEST_CASE("the header is 72 bytes with fields at fixed offsets", "[frame]") {
  STATIC_REQUIRE(sizeof(FrameHeader) == 72);
  STATIC_REQUIRE(offsetof(FrameHeader, jobSecret) == 8);
  STATIC_REQUIRE(offsetof(FrameHeader, seq) == 16);
  STATIC_REQUIRE(offsetof(FrameHeader, srcRank) == 24);
  STATIC_REQUIRE(offsetof(FrameHeader, offset) == 32);
  STATIC_REQUIRE(offsetof(FrameHeader, length) == 40);
  STATIC_REQUIRE(offsetof(FrameHeader, fingerprint) == 56);
  STATIC_REQUIRE(offsetof(FrameHeader, root) == 68);
}

TEST_CASE("describe() spells out the signature", "[frame]") {
  REQUIRE(allreduceSig().describe() == "allreduce(SUM, float32, 1024 elements)");
  CollectiveSignature b{CollectiveType::kBroadcast, DataType::kInt64, ReduceOp::kSum, 7, 2};
  REQUIRE(b.describe() == "broadcast(int64, 7 elements, root 2)");
  CollectiveSignature r{CollectiveType::kReduce, DataType::kBFloat16, ReduceOp::kMax, 0, 0};
  REQUIRE(r.describe() == "reduce(MAX, bfloat16, 0 elements, root 0)");
}

TEST_CASE("bad magic, version or kind is malformed", "[frame]") {
  const auto sig = allreduceSig();
  const auto e = expectFor(sig, 64);
  SECTION("magic") {
    for (uint32_t magic : {0u, 0x534d4450u, kFrameMagic ^ 1u, 0xffffffffu}) {
      FrameHeader h = dataHeader(sig, 64);
      h.magic = magic;
      Outcome r = check(h, kHdr + 64, e);
      CHECK(r.verdict == FrameVerdict::kMalformed);
      CHECK_THAT(r.why, Catch::Contains("magic"));
    }
  }
  SECTION("version") {
    for (uint16_t v : {uint16_t{0}, uint16_t{2}, uint16_t{0xffff}}) {
      FrameHeader h = dataHeader(sig, 64);
      h.version = v;
      Outcome r = check(h, kHdr + 64, e);
      CHECK(r.verdict == FrameVerdict::kMalformed);
      CHECK_THAT(r.why, Catch::Contains("version " + std::to_string(v)));
    }
  }
  SECTION("kind") {
    for (uint8_t k : {uint8_t{0}, uint8_t{5}, uint8_t{255}}) {
      FrameHeader h = dataHeader(sig, 64);
      h.kind = k;
      Outcome r = check(h, kHdr + 64, e);
      CHECK(r.verdict == FrameVerdict::kMalformed);
      CHECK_THAT(r.why, Catch::Contains("kind " + std::to_string(k)));
    }
    // Probes travel on the error channel only; a data receive never takes one.
    FrameHeader h = dataHeader(sig, 64);
    h.kind = static_cast<uint8_t>(FrameKind::kProbe);
    CHECK(check(h, kHdr + 64, e).verdict != FrameVerdict::kOk);
    // Nor a leave notice: its sequence would be taken for this call's.
    h.kind = static_cast<uint8_t>(FrameKind::kLeave);
    const Outcome leave = check(h, kHdr + 64, e);
    CHECK(leave.verdict == FrameVerdict::kMalformed);
    CHECK(leave.why.find("leave notice") != std::string::npos);
  }
}

TEST_CASE("a foreign job secret or an unexpected sender is foreign", "[frame]") {
  const auto sig = allreduceSig();
  SECTION("job secret") {
    for (uint64_t s : {uint64_t{0}, kSecret ^ 1, kSecret ^ (uint64_t{1} << 63)}) {
      FrameHeader h = dataHeader(sig, 64);
      h.jobSecret = s;
      Outcome r = check(h, kHdr + 64, expectFor(sig, 64));
      CHECK(r.verdict == FrameVerdict::kForeign);
      CHECK_THAT(r.why, Catch::Contains("another job"));
    }
  }
  SECTION("srcRank differs from the rank the frame came from") {
    for (uint32_t src : {0u, 1u, 3u}) {
      FrameHeader h = dataHeader(sig, 64);
      h.srcRank = src;
      Outcome r = check(h, kHdr + 64, expectFor(sig, 64));
      CHECK(r.verdict == FrameVerdict::kForeign);
      CHECK_THAT(r.why, Catch::Contains("source rank " + std::to_string(src)));
      CHECK_THAT(r.why, Catch::Contains("rank " + std::to_string(kSrc)));
    }
  }
  SECTION("srcRank at or past the world size, even when it matches") {
    for (uint32_t src : {kWorld, kWorld + 1, 0xffffffffu}) {
      FrameHeader h = makeHeader(FrameKind::kData, kSecret, kSeq, src, 0, 0, 64, sig);
      FrameExpectation e = expectFor(sig, 64);
      e.srcRank = src;
      Outcome r = check(h, kHdr + 64, e);
      CHECK(r.verdict == FrameVerdict::kForeign);
    }
  }
}

TEST_CASE("the length field must equal the bytes carried", "[frame]") {
  const auto sig = allreduceSig();
  auto e = expectFor(sig, 64);
  e.length.reset();
  e.maxPayload = std::numeric_limits<uint64_t>::max();  // only the carried bytes bound it
  SECTION("fewer bytes than a header") {
    for (size_t received : {size_t{0}, size_t{1}, kHdr - 1}) {
      FrameHeader h = dataHeader(sig, 0);
      Outcome r = check(h, received, e);
      CHECK(r.verdict == FrameVerdict::kMalformed);
      CHECK_THAT(r.why, Catch::Contains(std::to_string(received) + " bytes"));
    }
  }
  SECTION("off by one either way") {
    FrameHeader h = dataHeader(sig, 64);
    CHECK(check(h, kHdr + 63, e).verdict == FrameVerdict::kMalformed);
    CHECK(check(h, kHdr + 65, e).verdict == FrameVerdict::kMalformed);
    CHECK(check(h, kHdr + 64, e).verdict == FrameVerdict::kOk);
    Outcome r = check(h, kHdr + 65, e);
    CHECK_THAT(r.why, Catch::Contains("says 64 payload bytes but carried 65"));
  }
  SECTION("huge lengths do not wrap") {
    // length + sizeof(header) wraps to a small number for the values near
    // 2^64 - 72; a check written as `received >= header + length` would pass.
    constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
    for (uint64_t len : {kMax, kMax - 1, kMax - (kHdr - 1), kMax - kHdr + 1 + 64,
                         kMax - kHdr + 1 + 200, uint64_t{1} << 63}) {
      for (size_t received : {kHdr, kHdr + 64, kHdr + 200, size_t{1} << 20}) {
        FrameHeader h = dataHeader(sig, 0);
        h.length = len;
        INFO("length " << len << " received " << received);
        CHECK(check(h, received, e).verdict == FrameVerdict::kMalformed);
      }
    }
  }
  SECTION("an error frame's length is checked too") {
    FrameHeader h = makeHeader(FrameKind::kError, kSecret, kSeq, kSrc, 0, 0, 10, sig);
    CHECK(check(h, kHdr + 11, e).verdict == FrameVerdict::kMalformed);
    CHECK(check(h, kHdr - 1, e).verdict == FrameVerdict::kMalformed);
  }
}

TEST_CASE("an unknown dtype or op is malformed", "[frame]") {
  const auto sig = allreduceSig();
  const auto e = expectFor(sig, 64);
  for (uint8_t d : {static_cast<uint8_t>(DataType::kCount), uint8_t{200}, uint8_t{255}}) {
    FrameHeader h = dataHeader(sig, 64);
    h.dtype = d;
    Outcome r = check(h, kHdr + 64, e);
    CHECK(r.verdict == FrameVerdict::kMalformed);
    CHECK_THAT(r.why, Catch::Contains("dtype"));
  }
  for (uint8_t o : {static_cast<uint8_t>(ReduceOp::kCount), uint8_t{200}, uint8_t{255}}) {
    FrameHeader h = dataHeader(sig, 64);
    h.op = o;
    Outcome r = check(h, kHdr + 64, e);
    CHECK(r.verdict == FrameVerdict::kMalformed);
    CHECK_THAT(r.why, Catch::Contains("op"));
  }
}

TEST_CASE("a different collective call is a mismatch naming both sides", "[frame]") {
  const CollectiveSignature mine = allreduceSig();
  struct Variant {
    const char* field;
    CollectiveSignature theirs;
    std::string theirText;
  };
  std::vector<Variant> variants = {
      {"numel", {CollectiveType::kAllreduce, DataType::kFloat32, ReduceOp::kSum, 1025, -1},
       "allreduce(SUM, float32, 1025 elements)"},
      {"dtype", {CollectiveType::kAllreduce, DataType::kFloat64, ReduceOp::kSum, 1024, -1},
       "allreduce(SUM, float64, 1024 elements)"},
      {"op", {CollectiveType::kAllreduce, DataType::kFloat32, ReduceOp::kMax, 1024, -1},
       "allreduce(MAX, float32, 1024 elements)"},
      {"collective",
       {CollectiveType::kReduceScatter, DataType::kFloat32, ReduceOp::kSum, 1024, -1},
       "reduce_scatter(SUM, float32, 1024 elements)"},
      {"root", {CollectiveType::kAllreduce, DataType::kFloat32, ReduceOp::kSum, 1024, 1},
       "allreduce(SUM, float32, 1024 elements, root 1)"},
  };
  const std::string myText = "allreduce(SUM, float32, 1024 elements)";
  for (const auto& v : variants) {
    INFO("differing field: " << v.field);
    FrameHeader h = dataHeader(v.theirs, 64);
    Outcome r = check(h, kHdr + 64, expectFor(mine, 64));
    CHECK(r.verdict == FrameVerdict::kMismatch);
    CHECK_THAT(r.why, Catch::Contains("rank 2 called " + v.theirText + " at sequence 41"));
    CHECK_THAT(r.why, Catch::Contains("this rank called " + myText + " at sequence 41"));
  }
  SECTION("sequence") {
    FrameHeader h = makeHeader(FrameKind::kData, kSecret, kSeq + 1, kSrc, 0, 0, 64, mine);
    Outcome r = check(h, kHdr + 64, expectFor(mine, 64));
    CHECK(r.verdict == FrameVerdict::kMismatch);
    CHECK_THAT(r.why, Catch::Contains(myText + " at sequence 42"));
    CHECK_THAT(r.why, Catch::Contains(myText + " at sequence 41"));
  }
  SECTION("sequence, with a fingerprint forged for this rank's sequence") {
    FrameHeader h = makeHeader(FrameKind::kData, kSecret, kSeq + 1, kSrc, 0, 0, 64, mine);
    h.fingerprint = mine.fingerprint(kSeq);
    CHECK(check(h, kHdr + 64, expectFor(mine, 64)).verdict == FrameVerdict::kMismatch);
  }
  SECTION("root mismatch between two rooted calls") {
    CollectiveSignature a{CollectiveType::kBroadcast, DataType::kUInt8, ReduceOp::kSum, 9, 0};
    CollectiveSignature b = a;
    b.root = 3;
    Outcome r = check(dataHeader(b, 9), kHdr + 9, expectFor(a, 9));
    CHECK(r.verdict == FrameVerdict::kMismatch);
    CHECK_THAT(r.why, Catch::Contains("broadcast(uint8, 9 elements, root 3)"));
    CHECK_THAT(r.why, Catch::Contains("broadcast(uint8, 9 elements, root 0)"));
  }
}

TEST_CASE("a data receive accepts no error frame, whatever its length", "[frame]") {
  // Error frames travel on the control tag (validateControlFrame). One that
  // lands in a data receive would be taken for this call's payload: its text
  // reduced as numbers. Its length is checked first, as for any frame.
  const CollectiveSignature sig = allreduceSig();
  const FrameExpectation e = expectFor(sig, 64);
  SECTION("longer than the posted buffer (the rest spilled into the sink)") {
    FrameHeader h = makeHeader(FrameKind::kError, kSecret, kSeq, kSrc, 0, 0, 100, sig);
    Outcome r = check(h, kHdr + 100, e);
    CHECK(r.verdict == FrameVerdict::kMalformed);
    CHECK(r.why != "<untouched>");
  }
  SECTION("a length that disagrees with the bytes carried") {
    FrameHeader h = makeHeader(FrameKind::kError, kSecret, kSeq, kSrc, 0, 0, 64, sig);
    Outcome r = check(h, kHdr + 10, e);
    CHECK(r.verdict == FrameVerdict::kMalformed);
    CHECK_THAT(r.why, Catch::Contains("says 64 payload bytes but carried 10"));
  }
  SECTION("exactly the expected length, for this very call") {
    FrameHeader h = makeHeader(FrameKind::kError, kSecret, kSeq, kSrc, 0, 0, 64, sig);
    Outcome r = check(h, kHdr + 64, e);
    CHECK(r.verdict == FrameVerdict::kMalformed);
    CHECK_THAT(r.why, Catch::Contains("error frame"));
  }
  SECTION("another call's error text") {
    CollectiveSignature other{CollectiveType::kBarrier, DataType::kUInt8, ReduceOp::kSum, 0, -1};
    FrameHeader h = makeHeader(FrameKind::kError, kSecret, kSeq + 5, kSrc, 0, 0, 12, other);
    CHECK(check(h, kHdr + 12, e).verdict == FrameVerdict::kMalformed);
  }
}

TEST_CASE("the payload must fit the posted buffer and match the expected length", "[frame]") {
  const auto sig = allreduceSig();
  SECTION("longer than maxPayload, no exact length known") {
    FrameExpectation e = expectFor(sig, 0);
    e.length.reset();
    e.maxPayload = 100;
    CHECK(check(dataHeader(sig, 100), kHdr + 100, e).verdict == FrameVerdict::kOk);
    CHECK(check(dataHeader(sig, 0), kHdr, e).verdict == FrameVerdict::kOk);
    Outcome r = check(dataHeader(sig, 101), kHdr + 101, e);
    CHECK(r.verdict == FrameVerdict::kMismatch);
    CHECK_THAT(r.why, Catch::Contains("sent 101 bytes where 100 were expected"));
  }
  SECTION("an exact length shorter or longer than expected") {
    FrameExpectation e = expectFor(sig, 0);
    e.maxPayload = 4096;
    e.length = 50;
    CHECK(check(dataHeader(sig, 50), kHdr + 50, e).verdict == FrameVerdict::kOk);
    for (uint64_t len : {0ull, 49ull, 51ull, 4096ull}) {
      Outcome r = check(dataHeader(sig, len), kHdr + len, e);
      INFO("length " << len);
      CHECK(r.verdict == FrameVerdict::kMismatch);
      CHECK_THAT(r.why, Catch::Contains("sent " + std::to_string(len) + " bytes where 50"));
    }
  }
}

TEST_CASE("fingerprints are FNV-1a over the signature and sequence", "[frame]") {
  const auto base = allreduceSig();
  REQUIRE(base.fingerprint(kSeq) == oracleFingerprint(base, kSeq));
  // Each single-field change gives a different fingerprint, and all differ
  // from each other.
  std::vector<std::pair<CollectiveSignature, uint64_t>> calls = {{base, kSeq}, {base, kSeq + 1}};
  auto add = [&](auto mutate) {
    CollectiveSignature s = base;
    mutate(s);
    calls.push_back({s, kSeq});
  };
  add([](auto& s) { s.numel += 1; });
  add([](auto& s) { s.numel = 0; });
  add([](auto& s) { s.dtype = DataType::kBFloat16; });
  add([](auto& s) { s.op = ReduceOp::kAvg; });
  add([](auto& s) { s.collective = CollectiveType::kBroadcast; });
  add([](auto& s) { s.root = 0; });
  add([](auto& s) { s.root = 1; });
  std::set<uint64_t> seen;
  for (const auto& [s, seq] : calls) {
    uint64_t f = s.fingerprint(seq);
    CHECK(f == oracleFingerprint(s, seq));
    seen.insert(f);
  }
  CHECK(seen.size() == calls.size());
}

TEST_CASE("a header whose fingerprint alone differs is a mismatch", "[frame]") {
  const auto sig = allreduceSig();
  for (int bit : {0, 17, 63}) {
    FrameHeader h = dataHeader(sig, 64);
    h.fingerprint ^= 1ULL << bit;
    INFO("flipped bit " << bit);
    CHECK(check(h, kHdr + 64, expectFor(sig, 64)).verdict == FrameVerdict::kMismatch);
  }
}

TEST_CASE("why is optional", "[frame]") {
  const auto sig = allreduceSig();
  FrameHeader h = dataHeader(sig, 64);
  h.magic = 0;
  CHECK(validateFrame(h, kHdr + 64, expectFor(sig, 64), nullptr) == FrameVerdict::kMalformed);
}

TEST_CASE("makeTag packs class, sequence, phase and chunk into disjoint bits", "[frame][tag]") {
  const uint64_t seqs[] = {0, 1, 2, 0x7fffffff, 0x80000000ULL, 0xffffffffULL};
  const uint32_t chunks[] = {0, 1, 2, 0x7fffff, kMaxChunksPerPhase - 1};
  std::set<uint64_t> tags;
  size_t count = 0;
  for (TagClass cls : {TagClass::kData, TagClass::kError}) {
    for (uint64_t seq : seqs) {
      for (uint32_t phase = 0; phase < 16; ++phase) {
        for (uint32_t chunk : chunks) {
          uint64_t t = makeTag(cls, seq, phase, chunk);
          // Decode each field from its documented bit range.
          REQUIRE((t >> 60) == static_cast<uint64_t>(cls));
          REQUIRE(((t >> 28) & 0xffffffffULL) == seq);
          REQUIRE(((t >> 24) & 0xf) == phase);
          REQUIRE((t & 0xffffff) == chunk);
          tags.insert(t);
          ++count;
        }
      }
    }
  }
  CHECK(tags.size() == count);
}

TEST_CASE("makeTag wraps the sequence and refuses a phase or chunk its field cannot hold",
          "[frame][tag]") {
  // The sequence wraps modulo 2^32 by design (see frame.h).
  CHECK(makeTag(TagClass::kData, 5 + (1ULL << 32), 1, 2) == makeTag(TagClass::kData, 5, 1, 2));
  CHECK(makeTag(TagClass::kData, 0xffffffffULL, 0, 0) >> 60 == 0);
  // A phase or chunk past its field would alias another message's tag.
  CHECK_THROWS_AS(makeTag(TagClass::kData, 7, 16, 0), smddp::Error);
  CHECK_THROWS_AS(makeTag(TagClass::kData, 7, 0, kMaxChunksPerPhase), smddp::Error);
  CHECK_THROWS_AS(makeTag(TagClass::kData, 7, 0xffffffffu, 0xffffffffu), smddp::Error);
  CHECK_NOTHROW(makeTag(TagClass::kData, 7, 15, kMaxChunksPerPhase - 1));
}

TEST_CASE("cross-host step numbers past 2^24 get tags no step in flight shares",
          "[frame][tag]") {
  // The network step of a multi-host batch tags its messages with the step
  // number, which can pass the 24-bit chunk field. Between two servers only
  // steps s and s + 1 can be in flight at once (a server finishes step s
  // only after every other host's server sent its step-s piece), so any
  // window of 2^24 consecutive steps must map to distinct tags, and the
  // class, sequence and phase bits must stay intact.
  constexpr uint64_t k24 = uint64_t{1} << 24;
  constexpr uint32_t kPhase = 2;  // engine's kPhaseHostsToServer
  for (uint64_t first : {k24 - 3, k24, 3 * k24 - 1, (uint64_t{1} << 32) - 2, (uint64_t{1} << 40) + 5,
                         std::numeric_limits<uint64_t>::max() - 4}) {
    std::set<uint64_t> window;
    for (uint64_t step = first; step < first + 4; ++step) {
      INFO("step " << step);
      uint64_t t = 0;
      REQUIRE_NOTHROW(t = makeTag(TagClass::kData, kSeq, kPhase, crossHostStepChunk(step)));
      CHECK((t >> 60) == static_cast<uint64_t>(TagClass::kData));
      CHECK(((t >> 28) & 0xffffffffULL) == kSeq);
      CHECK(((t >> 24) & 0xf) == kPhase);
      CHECK((t & 0xffffff) == step % k24);
      window.insert(t);
    }
    CHECK(window.size() == 4);
  }
  // The two ends of a full window differ; one step past it aliases the first.
  CHECK(crossHostStepChunk(k24 + 7) != crossHostStepChunk(2 * k24 + 6));
  CHECK(crossHostStepChunk(k24 + 7) == crossHostStepChunk(2 * k24 + 7));
}

TEST_CASE("one error receive matches every error tag and no data tag", "[frame][tag]") {
  // libfabric matches when (tag & ~ignore) == (posted & ~ignore).
  const uint64_t posted = makeTag(TagClass::kError, 0, 0, 0);
  auto matches = [&](uint64_t t) { return (t & ~kErrorTagIgnore) == (posted & ~kErrorTagIgnore); };
  CHECK(kErrorTagIgnore == 0x0fffffffffffffffULL);
  for (uint64_t seq : {0ULL, 1ULL, 12345ULL, 0xffffffffULL}) {
    for (uint32_t phase : {0u, 1u, 15u}) {
      for (uint32_t chunk : {0u, 9u, kMaxChunksPerPhase - 1}) {
        CHECK(matches(makeTag(TagClass::kError, seq, phase, chunk)));
        CHECK_FALSE(matches(makeTag(TagClass::kData, seq, phase, chunk)));
      }
    }
  }
}

TEST_CASE("validateControlFrame accepts error, probe and leave frames and nothing else", "[frame]") {
  constexpr uint64_t kText = 4096;
  CollectiveSignature sig = allreduceSig();
  auto probe = makeHeader(FrameKind::kProbe, kSecret, kSeq, kSrc, 0, 0, 0, sig);
  auto error = makeHeader(FrameKind::kError, kSecret, kSeq, kSrc, 0, 0, 10, CollectiveSignature{});
  auto data = makeHeader(FrameKind::kData, kSecret, kSeq, kSrc, 0, 0, 10, sig);
  std::string why;
  CHECK(validateControlFrame(probe, kHdr, kSecret, kWorld, kText, &why) == FrameVerdict::kOk);
  CHECK(validateControlFrame(error, kHdr + 10, kSecret, kWorld, kText, &why) == FrameVerdict::kOk);
  CHECK(validateControlFrame(data, kHdr + 10, kSecret, kWorld, kText, &why) ==
        FrameVerdict::kMalformed);
  // Shorter than a header, and lengths that disagree with what arrived.
  for (size_t received : {size_t{0}, size_t{1}, kHdr - 1}) {
    CHECK(validateControlFrame(error, received, kSecret, kWorld, kText, &why) ==
          FrameVerdict::kMalformed);
  }
  CHECK(validateControlFrame(error, kHdr + 9, kSecret, kWorld, kText, &why) ==
        FrameVerdict::kMalformed);
  CHECK(validateControlFrame(error, kHdr + 10, kSecret, kWorld, 9, &why) ==
        FrameVerdict::kMalformed);  // longer than the text buffer: it spilled into the sink
  auto huge = error;
  huge.length = std::numeric_limits<uint64_t>::max();
  CHECK(validateControlFrame(huge, kHdr - 1, kSecret, kWorld, kText, &why) ==
        FrameVerdict::kMalformed);  // kHdr - 1 - kHdr would wrap to this very value
  CHECK(validateControlFrame(error, kHdr + 10, kSecret ^ 1, kWorld, kText, &why) ==
        FrameVerdict::kForeign);
  CHECK(validateControlFrame(error, kHdr + 10, kSecret, kSrc, kText, &why) ==
        FrameVerdict::kForeign);  // source rank outside the group
  // A probe with a payload, or whose fingerprint does not match its fields.
  auto fat = makeHeader(FrameKind::kProbe, kSecret, kSeq, kSrc, 0, 0, 4, sig);
  CHECK(validateControlFrame(fat, kHdr + 4, kSecret, kWorld, kText, &why) ==
        FrameVerdict::kMalformed);
  auto forged = probe;
  forged.numel += 1;
  CHECK(validateControlFrame(forged, kHdr, kSecret, kWorld, kText, &why) ==
        FrameVerdict::kMalformed);
  CHECK(!why.empty());
  // A leave notice is its header alone.
  auto leave = makeHeader(FrameKind::kLeave, kSecret, kSeq, kSrc, 0, 0, 0, CollectiveSignature{});
  CHECK(validateControlFrame(leave, kHdr, kSecret, kWorld, kText, &why) == FrameVerdict::kOk);
  auto wordy = makeHeader(FrameKind::kLeave, kSecret, kSeq, kSrc, 0, 0, 5, CollectiveSignature{});
  CHECK(validateControlFrame(wordy, kHdr + 5, kSecret, kWorld, kText, &why) ==
        FrameVerdict::kMalformed);
  auto unknown = leave;
  unknown.kind = 5;
  CHECK(validateControlFrame(unknown, kHdr, kSecret, kWorld, kText, &why) ==
        FrameVerdict::kMalformed);
}
