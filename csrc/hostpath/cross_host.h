// FusionBufferScheduler::CrossHost: the pipelined network step of a
// multi-host batch (docs/design.md, "The allreduce path", step 5). Used by
// FusionBufferScheduler's data steps only (fusion_steps.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine_context.h"
#include "engine/exchange.h"
#include "hostpath/fusion_batch.h"
#include "hostpath/fusion_scheduler.h"

namespace smddp {

// The network step of a multi-host batch on one server: reduction servers
// once more, between hosts. Each chunk (one step of this server's shard) is
// cut into one piece per host; host h's server for this shard combines
// piece h of every host's partial, in host order (so every host gets the
// same bits), and returns it: 2(H-1)/H of the chunk each way. A step goes
// out as soon as this server reduced it on its host, and up to `depth`
// steps stay in flight, so the link never waits for a round trip (one step
// at a time left a 2 Gbit/s link 40-60% idle). A step is done once the
// other hosts' pieces came back and its sends completed (its result slot
// can then be read and, a ring later, reused).
class FusionBufferScheduler::CrossHost {
 public:
  CrossHost(FusionBufferScheduler& s, Batch& b, int server, uint64_t depth, uint64_t chunkElems);

  // Step k of the batch: `data` holds this host's partial (len elements,
  // in acc_); on completion, the reduction over every host.
  void post(uint64_t k, uint8_t* data, uint64_t len);

  // Reads what completed; true if any step finished. Throws on failure.
  bool poll();
  uint64_t done() const { return done_; }
  bool inFlight() const { return done_ < posted_; }
  std::string waitingOn() const;

  // A batch that unwinds with steps in flight leaves results on their way
  // from the standalone servers into its slots: the links drop them and
  // refuse later batches (ServerLinks::abandon).
  ~CrossHost();
  CrossHost(const CrossHost&) = delete;
  CrossHost& operator=(const CrossHost&) = delete;

 private:
  struct Step {
    uint8_t* data = nullptr;
    uint64_t len = 0;
    int partialsLeft = 0;
    int left = 0;  // messages of this step not yet complete
    std::vector<uint64_t> tickets;  // each standalone server's post (ServerLinks::post)
    std::vector<Range> servers;     // their pieces
  };
  // Narrow with standalone servers: step k's piece for server j going
  // out, and its result coming back.
  uint8_t* serverOut(uint64_t k, int j) const {
    return wireSlices_ + serverSlicesAt_ +
           ((k % steps_.size()) * 2 * K_ + j) * serverSliceBytes_;
  }
  uint8_t* serverResult(uint64_t k, int j) const {
    return serverOut(k, j) + K_ * serverSliceBytes_;
  }
  // Step k's pieces H.. to the K standalone servers, queued on their links.
  void postToServers(uint64_t k, Step& st, uint8_t* data, const std::vector<Range>& piece);
  bool stepDone(const Step& st) const;
  int peerOf(int h) const { return s_.topo_.ranksOfHost[h][local_]; }
  bool narrow() const { return wire_ != DataType::kFloat32; }

  // post() across hosts in the narrow wire type (reduce/narrow_wire.h):
  // this host's pieces go out packed; host h's server widens the partials
  // (its own one rounded the same way), sums them in f32 in host order, and
  // packs the result once, which every host then reads back (itself
  // included), so every rank gets the same bytes.
  void postNarrow(uint64_t k, Step& st, const std::vector<Range>& piece, uint32_t tag);
  void unpackOrThrow(float* dst, const uint8_t* src, uint64_t count, int host,
                     const char* what);
  [[noreturn]] void throwBadScale(int host, const char* what);

  FusionBufferScheduler& s_;
  Batch& b_;
  const int H_, myHost_, local_;
  const int K_;            // standalone reduction servers
  const uint64_t share_;   // their share of each step, in millionths
  const bool wide_;
  const DataType acc_;
  const size_t es_;
  const DataType wire_;  // kFloat32: the partials cross in acc_
  // The buffers the posted messages point into are the engine's scratch
  // (CallMemory::scratch, kept from call to call, so a batch does not
  // allocate and zero 4-6 MiB again; nothing in it is read before this
  // batch writes it). They outlive the exchange: when a failure unwinds
  // the batch, the exchange's destructor cancels and waits for its
  // receives, and a send it leaves posted holds the scratch
  // (CallMemory::holdForSend). A receive it cannot confirm cancelled (a
  // peer on a host gone silent) quarantines the endpoint, which is then
  // never progressed, nor closed (EngineContext::release), so it cannot
  // write there any more.
  std::vector<Step> steps_;  // ring of `depth`: step k at k % depth
  uint8_t* partials_ = nullptr;    // acc_: the other hosts' partials
  uint8_t* wireSlices_ = nullptr;  // narrow: see postNarrow
  float* scratch_ = nullptr;       // narrow: scaling and widening
  Exchange ex_;
  uint64_t maxPiece_ = 0;  // elements of the largest piece of a step
  uint64_t maxServerPiece_ = 0;  // narrow: of a standalone server's piece
  size_t pieceBytes_ = 0;
  size_t sliceBytes_ = 0;
  size_t serverSliceBytes_ = 0;  // narrow: serverOut
  size_t serverSlicesAt_ = 0;    // narrow: where serverOut's slices start
  size_t scaleFloats_ = 0;       // narrow: scratch_'s room to scale one piece
  uint64_t posted_ = 0, done_ = 0;
};

}  // namespace smddp
