#include "transport/frame.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"

namespace smddp {

const char* toString(CollectiveType c) {
  switch (c) {
    case CollectiveType::kAllreduce: return "allreduce";
    case CollectiveType::kBroadcast: return "broadcast";
    case CollectiveType::kAllgather: return "allgather";
    case CollectiveType::kBarrier: return "barrier";
    case CollectiveType::kReduceScatter: return "reduce_scatter";
    case CollectiveType::kAlltoall: return "alltoall";
    case CollectiveType::kGather: return "gather";
    case CollectiveType::kScatter: return "scatter";
    case CollectiveType::kReduce: return "reduce";
    case CollectiveType::kSendRecv: return "send/recv";
  }
  return "unknown-collective";
}

namespace {
uint64_t mix(uint64_t h, uint64_t v) {
  // FNV-1a over the 8 bytes of v.
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xff;
    h *= 1099511628211ULL;
  }
  return h;
}
}  // namespace

uint64_t CollectiveSignature::fingerprint(uint64_t seq) const {
  uint64_t h = 14695981039346656037ULL;
  h = mix(h, static_cast<uint64_t>(collective));
  h = mix(h, static_cast<uint64_t>(dtype));
  h = mix(h, static_cast<uint64_t>(op));
  h = mix(h, numel);
  h = mix(h, static_cast<uint64_t>(static_cast<int64_t>(root)));
  h = mix(h, seq);
  return h;
}

std::string CollectiveSignature::describe() const {
  std::string s = toString(collective);
  s += "(";
  bool reduces = collective == CollectiveType::kAllreduce ||
                 collective == CollectiveType::kReduceScatter ||
                 collective == CollectiveType::kReduce;
  if (reduces) s += std::string(toString(op)) + ", ";
  s += std::string(toString(dtype)) + ", " + std::to_string(numel) + " elements";
  if (root >= 0) s += ", root " + std::to_string(root);
  s += ")";
  return s;
}

FrameHeader makeHeader(FrameKind kind, uint64_t jobSecret, uint64_t seq, uint32_t srcRank,
                       uint32_t chunk, uint64_t offset, uint64_t length,
                       const CollectiveSignature& sig) {
  FrameHeader h;
  std::memset(&h, 0, sizeof(h));
  h.magic = kFrameMagic;
  h.version = kFrameVersion;
  h.kind = static_cast<uint8_t>(kind);
  h.collective = static_cast<uint8_t>(sig.collective);
  h.jobSecret = jobSecret;
  h.seq = seq;
  h.srcRank = srcRank;
  h.chunk = chunk;
  h.offset = offset;
  h.length = length;
  h.numel = sig.numel;
  h.fingerprint = sig.fingerprint(seq);
  h.dtype = static_cast<uint8_t>(sig.dtype);
  h.op = static_cast<uint8_t>(sig.op);
  h.root = sig.root;
  return h;
}

CollectiveSignature signatureOf(const FrameHeader& h) {
  CollectiveSignature s;
  s.collective = static_cast<CollectiveType>(h.collective);
  s.dtype = static_cast<DataType>(h.dtype);
  s.op = static_cast<ReduceOp>(h.op);
  s.numel = h.numel;
  s.root = h.root;
  return s;
}

FrameVerdict validateFrame(const FrameHeader& h, size_t received, const FrameExpectation& e,
                           std::string* why) {
  auto fail = [&](FrameVerdict v, const std::string& msg) {
    if (why) *why = msg;
    return v;
  };
  if (received < sizeof(FrameHeader)) {
    return fail(FrameVerdict::kMalformed,
                "frame of " + std::to_string(received) + " bytes is shorter than its header");
  }
  // The length first, whatever the kind claims. No wrap: received >=
  // sizeof(FrameHeader) was checked above.
  const size_t payload = received - sizeof(FrameHeader);
  if (h.length != payload) {
    return fail(FrameVerdict::kMalformed, "frame says " + std::to_string(h.length) +
                                              " payload bytes but carried " +
                                              std::to_string(payload));
  }
  if (h.magic != kFrameMagic) return fail(FrameVerdict::kMalformed, "bad frame magic");
  if (h.version != kFrameVersion) {
    return fail(FrameVerdict::kMalformed, "unsupported frame version " + std::to_string(h.version));
  }
  // Error and probe frames travel on the control tag (validateControlFrame).
  // Accepted here, one would be taken for this call's payload.
  if (h.kind == static_cast<uint8_t>(FrameKind::kError) ||
      h.kind == static_cast<uint8_t>(FrameKind::kProbe) ||
      h.kind == static_cast<uint8_t>(FrameKind::kLeave)) {
    const char* what = h.kind == static_cast<uint8_t>(FrameKind::kError)   ? "an error frame"
                       : h.kind == static_cast<uint8_t>(FrameKind::kProbe) ? "a stall probe"
                                                                           : "a leave notice";
    return fail(FrameVerdict::kMalformed, std::string(what) + " arrived on a data receive");
  }
  if (h.kind != static_cast<uint8_t>(FrameKind::kData)) {
    return fail(FrameVerdict::kMalformed, "unknown frame kind " + std::to_string(h.kind));
  }
  if (h.jobSecret != e.jobSecret) return fail(FrameVerdict::kForeign, "frame from another job");
  if (h.srcRank >= e.worldSize || h.srcRank != e.srcRank) {
    return fail(FrameVerdict::kForeign, "frame claims source rank " + std::to_string(h.srcRank) +
                                            " but came from rank " + std::to_string(e.srcRank));
  }
  // The payload's fit in the posted buffer is checked after the signature,
  // so that a different call is reported as that call rather than as a
  // size; neither check reads the payload, and nothing is accepted before
  // both pass.
  if (h.dtype >= static_cast<uint8_t>(DataType::kCount) ||
      h.op >= static_cast<uint8_t>(ReduceOp::kCount)) {
    return fail(FrameVerdict::kMalformed, "frame names an unknown dtype or op");
  }
  if (h.seq != e.seq || h.fingerprint != e.sig.fingerprint(e.seq) ||
      !(signatureOf(h) == e.sig)) {
    return fail(FrameVerdict::kMismatch,
                "rank " + std::to_string(h.srcRank) + " called " + signatureOf(h).describe() +
                    " at sequence " + std::to_string(h.seq) + " but this rank called " +
                    e.sig.describe() + " at sequence " + std::to_string(e.seq));
  }
  if (h.length > e.maxPayload || (e.length && h.length != *e.length)) {
    return fail(FrameVerdict::kMismatch,
                "rank " + std::to_string(h.srcRank) + " sent " + std::to_string(h.length) +
                    " bytes where " + std::to_string(e.length ? *e.length : e.maxPayload) +
                    " were expected");
  }
  return FrameVerdict::kOk;
}

FrameVerdict validateControlFrame(const FrameHeader& h, size_t received, uint64_t jobSecret,
                                  uint32_t worldSize, uint64_t maxText, std::string* why) {
  auto fail = [&](FrameVerdict v, const char* msg) {
    if (why) *why = msg;
    return v;
  };
  const bool probe = h.kind == static_cast<uint8_t>(FrameKind::kProbe);
  const bool leave = h.kind == static_cast<uint8_t>(FrameKind::kLeave);
  if (received < sizeof(FrameHeader)) {
    return fail(FrameVerdict::kMalformed, "control frame shorter than its header");
  }
  if (h.magic != kFrameMagic || h.version != kFrameVersion ||
      !(probe || leave || h.kind == static_cast<uint8_t>(FrameKind::kError))) {
    return fail(FrameVerdict::kMalformed, "bad control frame magic, version or kind");
  }
  if (h.jobSecret != jobSecret || h.srcRank >= worldSize) {
    return fail(FrameVerdict::kForeign, "control frame from another job or an unknown rank");
  }
  // No wrap: received >= sizeof(FrameHeader) was checked above.
  if (h.length != received - sizeof(FrameHeader) || h.length > maxText) {
    return fail(FrameVerdict::kMalformed, "control frame length does not match what arrived");
  }
  if (probe && (h.length != 0 || h.dtype >= static_cast<uint8_t>(DataType::kCount) ||
                h.op >= static_cast<uint8_t>(ReduceOp::kCount) ||
                h.fingerprint != signatureOf(h).fingerprint(h.seq))) {
    return fail(FrameVerdict::kMalformed, "malformed stall probe");
  }
  if (leave && h.length != 0) return fail(FrameVerdict::kMalformed, "malformed leave notice");
  return FrameVerdict::kOk;
}

PeerMac controlFrameMac(const PeerKeys& keys, const FrameHeader& h, uint32_t to,
                        std::string_view text) {
  return keys.mac(h.srcRank, to, std::string_view(reinterpret_cast<const char*>(&h), sizeof(h)),
                  text);
}

FrameVerdict checkControlFrame(const ControlHead& head, const char* text, size_t received,
                               uint64_t jobSecret, const PeerKeys& keys, uint64_t maxText,
                               std::string* why) {
  const FrameHeader& h = head.header;
  if (received < sizeof(ControlHead)) {
    if (why) *why = "control frame shorter than its header and MAC";
    return FrameVerdict::kMalformed;
  }
  const FrameVerdict layout =
      validateControlFrame(h, received - kPeerMacBytes, jobSecret,
                           static_cast<uint32_t>(std::max(keys.size(), 0)), maxText, why);
  if (layout != FrameVerdict::kOk) return layout;
  // The length is proven: h.length bytes of text arrived.
  if (!keys.verify(h.srcRank, std::string_view(reinterpret_cast<const char*>(&h), sizeof(h)),
                   std::string_view(text, h.length), head.mac)) {
    if (why) {
      *why = "control frame's MAC does not match: forged, changed on the way, or MACed for "
             "another link";
    }
    return FrameVerdict::kForeign;
  }
  return FrameVerdict::kOk;
}

uint64_t makeP2PTag(int32_t userTag) {
  return (static_cast<uint64_t>(TagClass::kP2P) << 60) |
         (static_cast<uint64_t>(static_cast<uint32_t>(userTag)) << 28);
}

uint64_t makeTag(TagClass cls, uint64_t seq, uint32_t phase, uint32_t chunk) {
  // A phase or chunk masked into its field would alias another message's
  // tag without a trace; a caller whose counter can outgrow the field wraps
  // it on purpose (crossHostStepChunk) where that is provably safe.
  SMDDP_CHECK(phase < 16 && chunk < kMaxChunksPerPhase, kInternal,
              "tag field overflow: phase " + std::to_string(phase) + ", chunk " +
                  std::to_string(chunk) + " (at most 15 and " +
                  std::to_string(kMaxChunksPerPhase - 1) + ")");
  return (static_cast<uint64_t>(cls) << 60) | ((seq & 0xffffffffULL) << 28) |
         (static_cast<uint64_t>(phase & 0xf) << 24) | (chunk & 0xffffffu);
}

}  // namespace smddp
