// The wire format. Every message is a fixed FrameHeader followed by its
// payload; the header travels in its own iov so payloads land directly in
// their destination. A receiver validates every header field against what
// it expects before it trusts the payload.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/dtype.h"
#include "common/wire_limits.h"
#include "transport/peer_keys.h"

namespace smddp {

constexpr uint32_t kFrameMagic = 0x50444d53;  // "SMDP" little-endian
constexpr uint16_t kFrameVersion = 1;

enum class FrameKind : uint8_t {
  kData = 1,    // a payload chunk of a collective
  kError = 2,   // a rank failed this sequence; payload is UTF-8 text.
                // chunk == kErrorBroken: the group is unusable at the sender
                // (offset, the count of calls covered, may then be 0)
  kProbe = 3,   // stall probe on the error channel: header only, carries the
                // sender's signature for `seq`; chunk == 1 marks a reply.
                // Never valid on a data receive (validateFrame rejects it).
  kLeave = 4,   // on the error channel, header only: the sender shut its group
                // down and will never run a call from `seq` on (a clean leave,
                // which a collective that needs it must not wait out).
};

constexpr uint32_t kErrorBroken = 1;

enum class CollectiveType : uint8_t {
  kAllreduce = 1,
  kBroadcast = 2,
  kAllgather = 3,
  kBarrier = 4,
  kReduceScatter = 5,
  kAlltoall = 6,
  kGather = 7,
  kScatter = 8,
  kReduce = 9,
  kSendRecv = 10,
};
const char* toString(CollectiveType c);

// What a collective call looks like: all ranks must agree on it.
struct CollectiveSignature {
  CollectiveType collective = CollectiveType::kAllreduce;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  uint64_t numel = 0;  // elements contributed by each rank
  int32_t root = -1;   // -1 when the collective has no root

  uint64_t fingerprint(uint64_t seq) const;
  std::string describe() const;  // "allreduce(SUM, float32, 1024 elements)"
  bool operator==(const CollectiveSignature&) const = default;
};

struct FrameHeader {
  uint32_t magic;
  uint16_t version;
  uint8_t kind;        // FrameKind
  uint8_t collective;  // CollectiveType
  uint64_t jobSecret;  // random per group, shared through the Store: it keeps
                       // other groups' frames apart, it proves nothing
  uint64_t seq;
  uint32_t srcRank;
  uint32_t chunk;
  uint64_t offset;     // byte offset of the payload in the logical buffer
  uint64_t length;     // payload bytes that follow the header
  uint64_t numel;
  uint64_t fingerprint;
  uint8_t dtype;
  uint8_t op;
  int16_t reserved;
  int32_t root;
};
static_assert(sizeof(FrameHeader) == 72, "FrameHeader layout must be stable");

FrameHeader makeHeader(FrameKind kind, uint64_t jobSecret, uint64_t seq, uint32_t srcRank,
                       uint32_t chunk, uint64_t offset, uint64_t length,
                       const CollectiveSignature& sig);

// Recovers the signature a header describes (for error messages).
CollectiveSignature signatureOf(const FrameHeader& h);

// What the receiver expects of one frame.
struct FrameExpectation {
  uint64_t jobSecret;
  uint64_t seq;
  uint32_t srcRank;
  uint32_t worldSize;
  uint64_t maxPayload;             // capacity of the posted payload buffer
  std::optional<uint64_t> length;  // exact payload length when known
  CollectiveSignature sig;
};

enum class FrameVerdict {
  kOk,
  kMalformed,  // bad magic/version/kind/length: foreign or corrupt, drop it
  kForeign,    // another job or an unexpected sender
  kMismatch,   // a well-formed frame for a different collective call
};

// Validates `h` given `received` bytes in total (header + payload) on a
// data receive: only data frames pass; the length is checked before
// anything else. Never reads payload memory. On failure `why` says what
// did not match.
FrameVerdict validateFrame(const FrameHeader& h, size_t received, const FrameExpectation& e,
                           std::string* why);

// Validates the layout of an error or probe frame (the error channel,
// FrameKind kError or kProbe) of `received` bytes of header and text (the
// MAC not counted) from any rank of a `worldSize` group whose text buffer
// holds `maxText` bytes. A probe must carry no payload and a self-consistent
// fingerprint. Like validateFrame, it never reads payload memory.
FrameVerdict validateControlFrame(const FrameHeader& h, size_t received, uint64_t jobSecret,
                                  uint32_t worldSize, uint64_t maxText, std::string* why);

// On the wire a control frame (error or probe) is its header, the MAC of
// its sender and receiver's pair key (transport/peer_keys.h) over the whole
// header and the text, then the text. The group's jobSecret, which anyone
// who reads the store or one frame knows, proves nothing: the MAC does.
struct ControlHead {
  FrameHeader header;
  uint8_t mac[kPeerMacBytes];
};
static_assert(sizeof(ControlHead) == sizeof(FrameHeader) + kPeerMacBytes,
              "a control frame's MAC follows its header");
// The MAC a control frame from h.srcRank (this rank) to `to` carries.
PeerMac controlFrameMac(const PeerKeys& keys, const FrameHeader& h, uint32_t to,
                        std::string_view text);
// Checks a control frame of `received` bytes that landed in `head`, with
// its text (if any) in `text`: the layout first (validateControlFrame,
// over a world of keys.size() ranks), then the MAC from h.srcRank to this
// rank, which reads the text only once its length is proven. A forged
// frame (the group's secret but not the pair's key), one with any bit
// changed, and one MACed for another link or direction (reflected) are
// kForeign.
FrameVerdict checkControlFrame(const ControlHead& head, const char* text, size_t received,
                               uint64_t jobSecret, const PeerKeys& keys, uint64_t maxText,
                               std::string* why);

// What a rank keeps of error and probe frames for calls it has not reached.
// A peer (the only one that holds a pair key) could send well-formed ones
// for any sequence, so: a frame more than kControlSequenceWindow calls ahead of
// the latest call this rank has reached is refused (counted as rejected;
// no real peer runs that far ahead, every collective needs this rank), and
// at most kMaxHeldControlSequences sequences are held for each kind, the
// farthest given up first (the real ones sit at the rank's current call).
constexpr uint64_t kControlSequenceWindow = uint64_t{1} << 16;
constexpr size_t kMaxHeldControlSequences = 1024;

// 64-bit tags: [63:60] class, [59:28] sequence (mod 2^32), [27:24] phase,
// [23:0] chunk. Error and probe frames use class 1 with seq/phase/chunk 0
// and exact matching (see errorTag() in engine/control_frames.cc).
enum class TagClass : uint8_t { kData = 0, kError = 1, kP2P = 2 };
// Point-to-point: [63:60] class, [59:28] the user's tag; per-pair order is
// the provider's send-after-send ordering, so no counters are needed.
uint64_t makeP2PTag(int32_t userTag);
constexpr uint64_t kP2PAnySourceIgnore = 0;
// Throws (kInternal) when phase or chunk does not fit its field.
uint64_t makeTag(TagClass cls, uint64_t seq, uint32_t phase, uint32_t chunk);
// Matches every class-1 tag. Not used for posted receives: ignore bits
// break libfabric 1.17's shm tag matching (see engine/control_frames.cc).
constexpr uint64_t kErrorTagIgnore = (1ULL << 60) - 1;
// The chunk field of the network step of a multi-host batch: the step
// number within the batch, modulo 2^24, since a batch can have more steps.
// The wrap is safe because a server keeps at most SMDDP_SHM_DEPTH steps in
// flight (it reuses step s's result slot for step s + depth only once step
// s came back from every other host), so two servers are never more than
// about a depth apart (at most 64 steps), and no two steps less than 2^24
// apart share a tag.
constexpr uint32_t crossHostStepChunk(uint64_t step) {
  return static_cast<uint32_t>(step % kMaxChunksPerPhase);
}

}  // namespace smddp
