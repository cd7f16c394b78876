// A foreign libfabric process for tests/python/test_robust.py: it opens its
// own endpoint on the job's provider, inserts one rank's address and sends
// that rank hostile messages that get past the provider's own protocol, so
// they reach the smddp frame layer:
//   - on the error/probe tag (receives posted from any source): garbage,
//     truncated headers, forged headers with a wrong secret, and, when it is
//     given the group's secret (anyone who reads the store has it), frames
//     with the right secret that are still malformed (length lies,
//     oversized payload, bad probe fingerprint, source rank outside the
//     group), well-formed ones for calls far beyond kControlSequenceWindow,
//     and forgeries of what a peer would send about the job's next calls:
//     errors for each of them, a "group broken" error, probes that say a
//     peer called something else, each once in the layout before control
//     frames carried a MAC (the secret as a bearer token, which that code
//     accepted) and once with a MAC that is not the pair's. Then a flood of
//     well-formed ones within the window. None has its sender's pair key,
//     so every one must be rejected and counted in framesRejected, and
//     none may fail a call or change a result.
//   - on the data tags of the next sequence numbers (receives posted for
//     one peer's address only): forged data frames that must never match.
//
//   smddp_wire_intruder <provider> <hex endpoint name> <per kind> [secret] [world]
//
// Or, for tests/python/test_wire_encrypt.py, one point-to-point data frame
// with the group's secret that claims to come from rank <src>, on user tag
// <tag>, <n> floats of 666, in the sealed layout (a trailer of zeros) when
// <sealed> is 1: what a holder of the secret on another host would send a
// receive from any rank, passing itself off as a rank of the receiver's host.
//
//   smddp_wire_intruder p2p <provider> <hex endpoint name> <secret> <src> <tag> <n> <sealed>
//
// Prints "sent <error-tag frames> <data-tag frames>" once every send has
// completed, then stays connected until stdin closes (at most 120 s), so the
// messages are not torn down with the connection before they are read.
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "transport/endpoint.h"
#include "transport/fabric.h"
#include "transport/frame.h"

using namespace smddp;

namespace {

std::string unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

struct Message {
  uint64_t tag;
  std::vector<uint8_t> bytes;
};

std::vector<uint8_t> bytesOf(const FrameHeader& h, size_t keep, size_t extra, std::mt19937_64& rng) {
  std::vector<uint8_t> b(sizeof(h) + extra);
  std::memcpy(b.data(), &h, sizeof(h));
  for (size_t i = sizeof(h); i < b.size(); ++i) b[i] = static_cast<uint8_t>(rng());
  b.resize(keep == 0 ? b.size() : keep);
  return b;
}

// The frame in today's layout (header, MAC, text) with a MAC that is not
// the pair's: `h.length` bytes of text follow kPeerMacBytes random ones.
std::vector<uint8_t> withForgedMac(const FrameHeader& h, std::mt19937_64& rng) {
  return bytesOf(h, 0, kPeerMacBytes + h.length, rng);
}

}  // namespace

// Sends each message, one at a time, each waited for: bounded, and no queue
// to size. False when the 60 s deadline passes.
bool sendAll(Endpoint& ep, fi_addr_t dest, std::vector<Message>& msgs) {
  std::vector<uint8_t> context(64);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (auto& m : msgs) {
    iovec iov{m.bytes.data(), m.bytes.size()};
    while (ep.postSend(dest, m.tag, &iov, 1, context.data()) != 0) {
      Completion c[4];
      ep.poll(c, 4);
      if (std::chrono::steady_clock::now() > deadline) return false;
    }
    for (;;) {
      Completion c[4];
      size_t n = ep.poll(c, 4);
      if (n > 0) {
        if (c[0].err) fprintf(stderr, "send failed: %s\n", c[0].errText.c_str());
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) return false;
      usleep(100);
    }
  }
  return true;
}

// Stays connected (and keeps progressing) until the test closes stdin, at
// most 120 s, so the messages are not torn down before they are read.
void stayConnected(Endpoint& ep) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < until) {
    pollfd p{0, POLLIN, 0};
    if (poll(&p, 1, 1) > 0) {
      char buf[64];
      if (read(0, buf, sizeof(buf)) <= 0) break;
    }
    Completion c[4];
    ep.poll(c, 4);
  }
}

int forgePointToPoint(int argc, char** argv) {
  if (argc != 9) {
    fprintf(stderr, "usage: %s p2p <provider> <hex endpoint name> <secret> <src> <tag> <n> <sealed>\n",
            argv[0]);
    return 2;
  }
  auto fabric = std::make_shared<Fabric>(argv[2]);
  Endpoint ep(fabric);
  fi_addr_t dest = ep.insertPeers({unhex(argv[3])})[0];
  const uint64_t secret = std::stoull(argv[4]);
  const uint32_t src = static_cast<uint32_t>(std::atoi(argv[5]));
  const int32_t tag = std::atoi(argv[6]);
  const size_t n = static_cast<size_t>(std::atoll(argv[7]));
  const bool sealed = std::atoi(argv[8]) != 0;
  const CollectiveSignature sig{CollectiveType::kSendRecv, DataType::kFloat32, ReduceOp::kSum, n, -1};
  const FrameHeader h = makeHeader(FrameKind::kData, secret, static_cast<uint32_t>(tag), src, 0, 0,
                                   n * sizeof(float), sig);
  std::vector<uint8_t> b(sizeof(h) + n * sizeof(float) + (sealed ? 24 : 0), 0);
  std::memcpy(b.data(), &h, sizeof(h));
  const float forged = 666.0f;
  for (size_t i = 0; i < n; ++i) std::memcpy(b.data() + sizeof(h) + i * sizeof(float), &forged, 4);
  std::vector<Message> msgs{{makeP2PTag(tag), std::move(b)}};
  if (!sendAll(ep, dest, msgs)) return 3;
  printf("sent 1\n");
  fflush(stdout);
  stayConnected(ep);
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "p2p") return forgePointToPoint(argc, argv);
  if (argc < 4) {
    fprintf(stderr, "usage: %s <provider> <hex endpoint name> <per kind> [secret] [world]\n",
            argv[0]);
    return 2;
  }
  const std::string provider = argv[1];
  const std::string target = unhex(argv[2]);
  const int perKind = std::atoi(argv[3]);
  const bool haveSecret = argc > 4;
  const uint64_t secret = haveSecret ? std::stoull(argv[4]) : 0;
  const uint32_t world = argc > 5 ? static_cast<uint32_t>(std::atoi(argv[5])) : 2;

  auto fabric = std::make_shared<Fabric>(provider);
  Endpoint ep(fabric);
  fi_addr_t dest = ep.insertPeers({target})[0];

  std::mt19937_64 rng(42);
  const uint64_t errTag = makeTag(TagClass::kError, 0, 0, 0);
  CollectiveSignature sig{CollectiveType::kAllreduce, DataType::kFloat32, ReduceOp::kSum, 7, -1};
  std::vector<Message> msgs;
  size_t errorFrames = 0;
  auto add = [&](uint64_t tag, std::vector<uint8_t> b) {
    if (tag == errTag) ++errorFrames;
    msgs.push_back({tag, std::move(b)});
  };
  for (int i = 0; i < perKind; ++i) {
    // Garbage of every size around the header's.
    std::vector<uint8_t> g(1 + rng() % (sizeof(FrameHeader) * 3));
    for (auto& x : g) x = static_cast<uint8_t>(rng());
    add(errTag, g);
    uint64_t wrong = rng() | 1;
    if (haveSecret && wrong == secret) wrong ^= 2;
    // Truncated error header; a forged one with a wrong secret.
    FrameHeader e = makeHeader(FrameKind::kError, wrong, i, 0, 0, 0, 16, CollectiveSignature{});
    add(errTag, bytesOf(e, 1 + rng() % (sizeof(FrameHeader) - 1), 16, rng));
    add(errTag, bytesOf(e, 0, 16, rng));
    // A header that claims an absurd length.
    FrameHeader huge = e;
    huge.length = std::numeric_limits<uint64_t>::max() - i;
    add(errTag, bytesOf(huge, 0, 0, rng));
    if (haveSecret) {
      // The right secret, still malformed in one field each.
      FrameHeader lie = makeHeader(FrameKind::kError, secret, i, 0, 0, 0, 100, CollectiveSignature{});
      add(errTag, bytesOf(lie, 0, 16, rng));  // says 100 bytes, carries 16
      FrameHeader big = makeHeader(FrameKind::kError, secret, i, 0, 0, 0, 16, CollectiveSignature{});
      add(errTag, bytesOf(big, 0, 64 * 1024, rng));  // oversized: spills past the text buffer
      FrameHeader probe = makeHeader(FrameKind::kProbe, secret, i, 0, 0, 0, 0, sig);
      probe.fingerprint ^= 1;
      add(errTag, bytesOf(probe, 0, 0, rng));
      FrameHeader stranger = makeHeader(FrameKind::kError, secret, i, world + 3, 0, 0, 0,
                                        CollectiveSignature{});
      add(errTag, bytesOf(stranger, 0, 0, rng));
    }
    if (haveSecret) {
      // Well-formed, but for calls far beyond the window: refused outright.
      for (uint64_t j = 0; j < 4; ++j) {
        const uint64_t far = (uint64_t{1} << 40) + static_cast<uint64_t>(i) * 4 + j;
        FrameHeader e = makeHeader(FrameKind::kError, secret, far, 0, 0, 1, 16, CollectiveSignature{});
        add(errTag, bytesOf(e, 0, 16, rng));
        add(errTag, bytesOf(makeHeader(FrameKind::kProbe, secret, far, 0, 0, 0, 0, sig), 0, 0, rng));
      }
    }
    // Forged data frames for the sequence numbers the job is about to use.
    for (uint64_t seq = 0; seq < 4; ++seq) {
      FrameHeader d = makeHeader(FrameKind::kData, wrong, seq, 0, 0, 0, 28, sig);
      add(makeTag(TagClass::kData, seq + i, rng() % 2, 0), bytesOf(d, 0, 28, rng));
    }
  }

  if (haveSecret) {
    // What a holder of the secret would send to fail the job's next calls
    // (it is a few hundred calls in), as every rank of the group: an error
    // for each, a report that the group is broken, and probes that say
    // another collective was called. Main's layout (no MAC: the secret was
    // the proof) and today's with a forged MAC.
    CollectiveSignature other{CollectiveType::kBroadcast, DataType::kFloat32, ReduceOp::kSum, 7, 0};
    for (uint32_t from = 0; from < world; ++from) {
      for (uint64_t seq = 0; seq < 1000; ++seq) {
        const FrameHeader e = makeHeader(FrameKind::kError, secret, seq, from, 0, 1, 16,
                                         CollectiveSignature{});
        add(errTag, bytesOf(e, 0, 16, rng));
        add(errTag, withForgedMac(e, rng));
        if (seq % 50 == 0) {
          const FrameHeader p = makeHeader(FrameKind::kProbe, secret, seq, from, 0, 0, 0, other);
          add(errTag, bytesOf(p, 0, 0, rng));
          add(errTag, withForgedMac(p, rng));
        }
      }
      const FrameHeader broken = makeHeader(FrameKind::kError, secret, 0, from, kErrorBroken, 0,
                                            16, CollectiveSignature{});
      add(errTag, bytesOf(broken, 0, 16, rng));
      add(errTag, withForgedMac(broken, rng));
    }
    // A flood of well-formed ones within the window, for calls the job
    // will not reach: more than each kind could hold were they believed.
    const size_t flood = kMaxHeldControlSequences + 100;
    for (size_t j = 0; j < flood; ++j) {
      const uint64_t seq = kControlSequenceWindow - flood + j;  // far from any call it makes
      const FrameHeader e = makeHeader(FrameKind::kError, secret, seq, 0, 0, 1, 16,
                                       CollectiveSignature{});
      add(errTag, withForgedMac(e, rng));
      add(errTag, withForgedMac(makeHeader(FrameKind::kProbe, secret, seq, 0, 0, 0, 0, sig), rng));
    }
  }
  const size_t slack = 0;  // nothing is held: every error-tag frame is rejected

  if (!sendAll(ep, dest, msgs)) return 3;
  printf("sent %zu %zu %zu\n", errorFrames, msgs.size() - errorFrames - slack, slack);
  fflush(stdout);
  stayConnected(ep);
  return 0;
}
