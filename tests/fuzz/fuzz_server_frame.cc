// libFuzzer target for what a standalone reduction server and a worker's
// links accept from a socket (server/server_wire.h; docs/design.md,
// "Standalone reduction servers"): validateServerFrame on a 64-byte header,
// samePiece on two headers, a byte stream read frame by frame with
// FrameReader exactly as the server's event loop reads it, the same with
// every frame sealed (SMDDP_SERVER_INTEGRITY) and one byte perhaps changed
// on the way, and the SMDDP_SERVER_HOSTS parser.
//
// Oracle: besides "no crash, no sanitizer report", every verdict is compared
// with the wire spec written out below, on raw header bytes at the
// documented offsets; it shares no code with the validator (element sizes
// and the dtype/op rules are spelled out here again), and it checks both
// directions: a header the spec accepts must be accepted and one it
// rejects must be rejected with a reason. The stream check parses the same
// bytes by offsets and requires FrameReader to deliver exactly those frames
// and payload bytes, and to stop where the spec says the stream goes bad.
//
// The spec. Header: 64 bytes, little-endian, fields at these byte offsets:
//   0 magic u32 = 0x56534d53 ("SMSV")  4 version u16 = 5  6 kind u8
//   7 dtype u8  8 op u8  9 flags u8  10 reserved[2]  12 divisor u32
//   16 group u64  24 seq u64  32 step u64  40 count u64  48 payload u64
//   56 hosts u16  58 host u16  60 stream u16  62 server u16
// kind: 1 hello, 2 welcome, 3 data, 4 result, 5 error, 6 bye, 7 challenge,
// 8 answer.
// A header is accepted for a set of kinds if and only if:
//   S1 magic and version are as above, and kind is one of the set;
//   S2 data or result: dtype < 9 and op < 8; bitwise ops (5, 6, 7) only on
//      integer and bool dtypes (4..8), AVG (1) only on floating ones (0..3);
//      divisor != 0; payload <= 2^28; flags 0 or 2 (narrow); narrow only
//      with dtype 2 or 3; payload == count * element size (sizes by dtype:
//      4 8 2 2 1 1 4 8 1), plus 4 (a scale) when narrow, computed without
//      wrapping;
//   S3 hello: 32 <= payload <= 32 + 256 (a proof, a job id), hosts >= 2,
//      host < hosts, count (its piece limit) <= 2^28, flags only bit 0;
//   S4 welcome or bye: payload == 0;
//   S5 error: payload <= 4096;
//   S6 challenge: 1 <= count (the address dialled) <= 64, and
//      payload == 32 (a nonce) + 32 (a key share) + count + a job id of
//      at most 256 bytes; answer: payload == 96 (a nonce, a share, a proof).
// A sealed stream (every frame followed by its 16-byte tag) reads back
// frame for frame; with one byte changed anywhere, no frame from the one
// that holds it on is delivered, and the reader stops there.
// samePiece(a, b) is "" if and only if seq, step, count, dtype, op,
// flags and divisor are equal.
// SMDDP_SERVER_HOSTS is accepted (a list) or refused with an error that
// names the variable; every address it returns has a non-empty host and a
// port in 1..65535, and there are at most 1024.
//
// Build: cmake -DSMDDP_BUILD_FUZZERS=ON -DCMAKE_CXX_COMPILER=clang++ (see
// `make fuzz` and tests/README.md, "Fuzzing").
#include <fuzzer/FuzzedDataProvider.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "common/crypto.h"
#include "common/error.h"
#include "server/server_auth.h"
#include "server/server_wire.h"

using namespace smddp;

namespace {

[[noreturn]] void violated(const char* rule, const std::string& detail) {
  fprintf(stderr, "fuzz_server_frame: %s (%s)\n", rule, detail.c_str());
  abort();
}

static_assert(std::endian::native == std::endian::little,
              "the oracle reads the little-endian wire format in place");

template <typename T>
T at(const uint8_t* b, size_t offset) {
  T v;
  std::memcpy(&v, b + offset, sizeof(T));
  return v;
}

// The spec's element sizes, by dtype 0..8.
constexpr uint64_t kSpecSize[9] = {4, 8, 2, 2, 1, 1, 4, 8, 1};

// The spec's verdict on raw header bytes: true if accepted for `kinds`.
bool specAccepts(const uint8_t* b, const std::vector<uint8_t>& kinds) {
  if (at<uint32_t>(b, 0) != 0x56534d53u || at<uint16_t>(b, 4) != 5) return false;
  const uint8_t kind = b[6];
  bool listed = false;
  for (uint8_t k : kinds) listed = listed || k == kind;
  if (!listed) return false;
  const uint64_t payload = at<uint64_t>(b, 48);
  switch (kind) {
    case 3:
    case 4: {
      const uint8_t dtype = b[7], op = b[8];
      if (dtype >= 9 || op >= 8) return false;
      const bool floating = dtype <= 3;
      if (op >= 5 && floating) return false;
      if (op == 1 && !floating) return false;
      if (at<uint32_t>(b, 12) == 0) return false;
      if (payload > (1ull << 28)) return false;
      const uint8_t flags = b[9];
      if (flags != 0 && flags != 2) return false;
      const bool narrow = flags == 2;
      if (narrow && dtype != 2 && dtype != 3) return false;
      const unsigned __int128 want =
          static_cast<unsigned __int128>(at<uint64_t>(b, 40)) * kSpecSize[dtype] + (narrow ? 4 : 0);
      return want == payload;
    }
    case 1: {
      const uint16_t hosts = at<uint16_t>(b, 56), host = at<uint16_t>(b, 58);
      return payload >= 32 && payload <= 32 + 256 && hosts >= 2 && host < hosts &&
             at<uint64_t>(b, 40) <= (1ull << 28) && (b[9] & ~1) == 0;
    }
    case 2:
    case 6: return payload == 0;
    case 5: return payload <= 4096;
    case 7: {
      const uint64_t address = at<uint64_t>(b, 40);
      return address >= 1 && address <= 64 && payload >= 64 + address && payload - 64 - address <= 256;
    }
    case 8: return payload == 96;
    default: return false;  // not reachable: listed kinds are 1..8
  }
}

std::string validate(const uint8_t* b, const std::vector<uint8_t>& kinds) {
  ServerFrame f;
  std::memcpy(&f, b, sizeof(f));
  // The kind sets the two ends use; the fuzzer picks one of them.
  auto k = [](uint8_t v) { return static_cast<ServerFrameKind>(v); };
  switch (kinds.size()) {
    case 1: return validateServerFrame(f, {k(kinds[0])});
    default: return validateServerFrame(f, {k(kinds[0]), k(kinds[1])});
  }
}

const std::vector<uint8_t> kKindSets[] = {
    {7},     // the server's first frame: a challenge
    {8, 5},  // a worker's answer to its challenge: answer or error
    {1},     // the server's second: a hello
    {2, 5},  // a worker's answer to its hello: welcome or error
    {3, 6},  // the server, inside a stream: data or bye
    {4, 5},  // a worker, inside a stream: result or error
};

// A header: raw bytes, or a well-formed data frame with a few bytes
// flipped (reaches the accept paths fast).
void consumeHeader(FuzzedDataProvider& in, uint8_t* b) {
  std::memset(b, 0, 64);
  if (in.ConsumeBool()) {
    in.ConsumeData(b, 64);
    return;
  }
  ServerFrame f;
  f.kind = in.ConsumeIntegralInRange<uint8_t>(1, 8);
  f.flags = in.ConsumeIntegralInRange<uint8_t>(0, 2);
  f.dtype = in.ConsumeIntegralInRange<uint8_t>(0, 9);
  f.op = in.ConsumeIntegralInRange<uint8_t>(0, 8);
  f.divisor = in.ConsumeIntegralInRange<uint32_t>(0, 4);
  f.count = in.ConsumeBool() ? in.ConsumeIntegralInRange<uint64_t>(0, 64)
                             : in.ConsumeIntegral<uint64_t>();
  f.payload = in.ConsumeBool() ? f.count * (f.dtype < 9 ? kSpecSize[f.dtype] : 1) +
                                     (f.flags == 2 ? 4 : 0)
                               : in.ConsumeIntegral<uint64_t>();
  f.hosts = in.ConsumeIntegralInRange<uint16_t>(0, 4);
  f.host = in.ConsumeIntegralInRange<uint16_t>(0, 4);
  if (f.kind == 1 || f.kind == 7 || f.kind == 8) {  // near the handshake's sizes
    f.payload = in.ConsumeIntegralInRange<uint64_t>(0, 300);
    f.count = in.ConsumeBool() ? in.ConsumeIntegralInRange<uint64_t>(0, 1ull << 29) : 0;
  }
  std::memcpy(b, &f, 64);
  const int flips = in.ConsumeIntegralInRange<int>(0, 3);
  for (int i = 0; i < flips; ++i) {
    b[in.ConsumeIntegralInRange<size_t>(0, 63)] ^= in.ConsumeIntegral<uint8_t>();
  }
}

void checkHeader(FuzzedDataProvider& in) {
  const auto& kinds = kKindSets[in.ConsumeIntegralInRange<size_t>(0, 5)];
  uint8_t a[64], b[64];
  consumeHeader(in, a);
  const std::string why = validate(a, kinds);
  const bool spec = specAccepts(a, kinds);
  if (spec && !why.empty()) violated("the spec accepts a header the validator rejected", why);
  if (!spec && why.empty()) violated("the validator accepted a header the spec rejects", "");
  // samePiece: b is a with a few fields perhaps changed.
  std::memcpy(b, a, 64);
  const int changes = in.ConsumeIntegralInRange<int>(0, 2);
  for (int i = 0; i < changes; ++i) {
    b[in.ConsumeIntegralInRange<size_t>(0, 63)] ^= in.ConsumeIntegral<uint8_t>();
  }
  ServerFrame fa, fb;
  std::memcpy(&fa, a, 64);
  std::memcpy(&fb, b, 64);
  const bool same = at<uint64_t>(a, 24) == at<uint64_t>(b, 24) &&
                    at<uint64_t>(a, 32) == at<uint64_t>(b, 32) &&
                    at<uint64_t>(a, 40) == at<uint64_t>(b, 40) && a[7] == b[7] && a[8] == b[8] &&
                    a[9] == b[9] && at<uint32_t>(a, 12) == at<uint32_t>(b, 12);
  if (samePiece(fa, fb).empty() != same) {
    violated("samePiece disagrees with the spec", samePiece(fa, fb));
  }
}

// A stream the server reads from one host: frames read as its event loop
// reads them (header, validate for data or bye, payload into a buffer of
// the announced size), against the same bytes parsed by offsets. The bytes
// arrive in chunks of 1 to 97 bytes with the reader draining the socket
// between them, so headers and payloads are read in pieces.
void checkStream(FuzzedDataProvider& in) {
  uint32_t lcg = in.ConsumeIntegral<uint32_t>();  // the chunk sizes
  std::vector<uint8_t> bytes;
  // Mostly well-formed frames with fuzzed tails, so whole frames occur.
  while (in.remaining_bytes() > 0 && bytes.size() < 8192) {
    if (in.ConsumeBool()) {
      const auto raw = in.ConsumeBytes<uint8_t>(in.ConsumeIntegralInRange<size_t>(0, 200));
      bytes.insert(bytes.end(), raw.begin(), raw.end());
      continue;
    }
    ServerFrame f;
    f.kind = in.ConsumeBool() ? 3 : 6;
    f.dtype = static_cast<uint8_t>(DataType::kUInt8);
    f.count = f.kind == 3 ? in.ConsumeIntegralInRange<uint64_t>(0, 300) : 0;
    f.payload = f.count;
    const auto* h = reinterpret_cast<const uint8_t*>(&f);
    bytes.insert(bytes.end(), h, h + sizeof(f));
    const auto body = in.ConsumeBytes<uint8_t>(f.payload);
    bytes.insert(bytes.end(), body.begin(), body.end());
  }
  // The spec's parse: whole frames until a bad header or the end.
  std::vector<size_t> starts;
  bool bad = false;
  for (size_t off = 0; bytes.size() - off >= 64;) {
    if (!specAccepts(bytes.data() + off, {3, 6})) {
      bad = true;
      break;
    }
    const uint64_t p = at<uint64_t>(bytes.data() + off, 48);
    if (bytes.size() - off - 64 < p) break;
    starts.push_back(off);
    off += 64 + p;
  }
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) != 0) return;
  // FrameReader, as StandaloneServer::serve reads.
  FrameReader r;
  std::vector<uint8_t> payload;
  std::string why;
  size_t got = 0;
  bool rejected = false, failed = false;
  auto drain = [&] {
    while (!rejected && !failed) {
      const FrameIo io = r.read(sv[1], &why);
      if (io == FrameIo::kAgain) return;
      if (io == FrameIo::kFailed) {
        failed = true;
        return;
      }
      if (io == FrameIo::kHeader) {
        const ServerFrame& f = r.header();
        if (!validateServerFrame(f, {ServerFrameKind::kData, ServerFrameKind::kBye}).empty()) {
          rejected = true;
          return;
        }
        // The announced size, as the server allocates it; a frame cut
        // short by the end of the stream needs no more than it holds.
        payload.assign(std::min<uint64_t>(f.payload, bytes.size()), 0);
        r.payloadTo(payload.data());
        continue;
      }
      if (got >= starts.size()) violated("FrameReader delivered a frame the spec did not parse", "");
      const uint8_t* want = bytes.data() + starts[got];
      if (std::memcmp(&r.header(), want, 64) != 0) violated("a frame's header differs", "");
      if (!payload.empty() && std::memcmp(payload.data(), want + 64, payload.size()) != 0) {
        violated("a frame's payload differs", "");
      }
      ++got;
      r.next();
    }
  };
  for (size_t put = 0; put < bytes.size() && !rejected && !failed;) {
    lcg = lcg * 1664525u + 1013904223u;
    const size_t n = std::min<size_t>(1 + (lcg >> 16) % 97, bytes.size() - put);
    const ssize_t k = send(sv[0], bytes.data() + put, n, MSG_NOSIGNAL);
    if (k <= 0) violated("a socket pair refused a small send", std::to_string(k));
    put += static_cast<size_t>(k);
    drain();
  }
  close(sv[0]);  // the reader now sees the end of the stream
  drain();
  close(sv[1]);
  if (got != starts.size()) {
    violated("FrameReader delivered another number of frames",
             std::to_string(got) + " against " + std::to_string(starts.size()));
  }
  if (rejected != bad) violated("FrameReader's reader stopped where the spec does not", why);
  if (!rejected && (!failed || why != "closed")) {
    violated("the end of the stream was not read as closed", why);
  }
}

// A sealed stream: well-formed data and bye frames, each followed by its
// tag from the sender's FrameSeal, perhaps with one byte changed, read in
// chunks by a FrameReader checking with the receiver's.
void checkSealedStream(FuzzedDataProvider& in) {
  std::string key = in.ConsumeBytesAsString(kGmacKeyBytes);
  key.resize(kGmacKeyBytes, 'k');
  FrameSeal sender(key, SealDirection::kToServer), receiver(key, SealDirection::kToServer);
  std::vector<uint8_t> bytes;
  std::vector<size_t> starts;
  const int frames = in.ConsumeIntegralInRange<int>(0, 12);
  for (int i = 0; i < frames; ++i) {
    ServerFrame f;
    f.kind = in.ConsumeIntegralInRange<int>(0, 4) ? 3 : 6;
    f.dtype = static_cast<uint8_t>(DataType::kUInt8);
    f.count = f.kind == 3 ? in.ConsumeIntegralInRange<uint64_t>(0, 300) : 0;
    f.payload = f.count;
    std::vector<uint8_t> body = in.ConsumeBytes<uint8_t>(f.payload);
    body.resize(f.payload, 0);
    const Tag tag = sender.next(f, body.data());
    starts.push_back(bytes.size());
    const auto* h = reinterpret_cast<const uint8_t*>(&f);
    bytes.insert(bytes.end(), h, h + sizeof(f));
    bytes.insert(bytes.end(), body.begin(), body.end());
    bytes.insert(bytes.end(), tag.bytes, tag.bytes + kTagBytes);
  }
  starts.push_back(bytes.size());
  // One byte changed, in frame `bad`: the frames before it must pass.
  size_t bad = starts.size();
  if (!bytes.empty() && in.ConsumeBool()) {
    const size_t pos = in.ConsumeIntegralInRange<size_t>(0, bytes.size() - 1);
    bytes[pos] ^= in.ConsumeIntegralInRange<uint8_t>(1, 255);
    bad = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), pos) -
                              starts.begin()) - 1;
  }
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) != 0) return;
  FrameReader r;
  r.checkWith(&receiver);
  std::vector<uint8_t> payload;
  std::string why;
  size_t got = 0;
  bool stopped = false;
  auto drain = [&] {
    while (!stopped) {
      const FrameIo io = r.read(sv[1], &why);
      if (io == FrameIo::kAgain) return;
      if (io == FrameIo::kFailed) {
        stopped = true;
        return;
      }
      if (io == FrameIo::kHeader) {
        if (!validateServerFrame(r.header(), {ServerFrameKind::kData, ServerFrameKind::kBye})
                 .empty()) {
          stopped = true;
          return;
        }
        payload.assign(std::min<uint64_t>(r.header().payload, bytes.size()), 0);
        r.payloadTo(payload.data());
        continue;
      }
      if (got >= bad) violated("a sealed frame with a changed byte was delivered", "");
      if (std::memcmp(&r.header(), bytes.data() + starts[got], 64) != 0) {
        violated("a sealed frame's header differs", "");
      }
      ++got;
      r.next();
    }
  };
  for (size_t put = 0; put < bytes.size() && !stopped;) {
    const size_t n = std::min<size_t>(1 + in.ConsumeIntegralInRange<size_t>(0, 96),
                                      bytes.size() - put);
    if (send(sv[0], bytes.data() + put, n, MSG_NOSIGNAL) != static_cast<ssize_t>(n)) {
      violated("a socket pair refused a small send", "");
    }
    put += n;
    drain();
  }
  close(sv[0]);
  drain();
  close(sv[1]);
  if (bad == starts.size() && got != starts.size() - 1) {
    violated("an untouched sealed stream did not read back whole", why);
  }
  if (bad < starts.size() && got != bad) {
    violated("the frames before a changed byte were not all delivered", std::to_string(got));
  }
}

void checkServerHosts(FuzzedDataProvider& in) {
  const std::string spec = in.ConsumeRandomLengthString(512);
  try {
    for (const ServerAddress& a : parseServerHosts(spec)) {
      if (a.host.empty() || a.port < 1 || a.port > 65535) {
        violated("parseServerHosts returned a bad address", spec);
      }
    }
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kInvalidArgument ||
        std::string(e.what()).find("SMDDP_SERVER_HOSTS") == std::string::npos) {
      violated("parseServerHosts threw an error that does not name the variable", e.what());
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0: checkHeader(in); break;
    case 1: checkStream(in); break;
    case 2: checkSealedStream(in); break;
    default: checkServerHosts(in); break;
  }
  return 0;
}
