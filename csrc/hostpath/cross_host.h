// FusionBufferScheduler::CrossHost: the pipelined network step of a
// multi-host batch (docs/design.md, "The allreduce path", step 5). Used by
// FusionBufferScheduler's data steps only (fusion_steps.cc).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/engine_context.h"
#include "engine/exchange.h"
#include "hostpath/fusion_batch.h"
#include "hostpath/fusion_scheduler.h"
#include "observe/stats.h"
#include "reduce/narrow_wire.h"
#include "reduce/reduce_kernels.h"
#include "server/server_wire.h"
#include "transport/frame.h"

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
  CrossHost(FusionBufferScheduler& s, Batch& b, int server, uint64_t depth, uint64_t chunkElems)
      : s_(s), b_(b), H_(s.topo_.hosts()), myHost_(s.topo_.hostIndex),
        local_(s.segment_->serverRank(server)), K_(s.standalone_),
        share_(serverShareMillionths(H_, K_, s.ctx_.config().serverSharePercent)),
        wide_(s.widePartials(b.dtype)),
        acc_(wide_ ? DataType::kFloat32 : b.dtype), es_(elementSize(acc_)),
        wire_(s.crossHostWire(b.dtype, b.op)), steps_(depth), ex_(s.ctx_, b.firstSeq, b.sigs[0]) {
    maxPiece_ = (chunkElems + H_ - 1) / H_ + 1;
    pieceBytes_ = maxPiece_ * es_;
    if (narrow()) {
      // Per step, 3H wire slices: this host's pieces going out (slice
      // myHost_: its server's result going back), the other hosts'
      // partials of this host's piece, and their results for theirs.
      sliceBytes_ = (narrowWireBytes(maxPiece_, wire_) + 63) & ~size_t{63};
      // Then 2K for the standalone servers' pieces, out and back.
      // (A step of chunkElems has the largest pieces: the same split as post's.)
      for (int j = 0; j < K_; ++j) {
        maxServerPiece_ = std::max<uint64_t>(
            maxServerPiece_, crossHostPiece(chunkElems, H_, K_, H_ + j, 0, share_).count + 1);
      }
      if (K_) serverSliceBytes_ = (narrowWireBytes(maxServerPiece_, wire_) + 63) & ~size_t{63};
      // Then room to scale one piece, and each host's partial widened.
      scaleFloats_ = std::max(maxPiece_, maxServerPiece_);
      serverSlicesAt_ = depth * 3 * H_ * sliceBytes_;
      const size_t floatsAt = serverSlicesAt_ + depth * 2 * K_ * serverSliceBytes_;
      wireSlices_ =
          s.ctx_.memory().scratch(floatsAt + (scaleFloats_ + H_ * maxPiece_) * sizeof(float));
      scratch_ = reinterpret_cast<float*>(wireSlices_ + floatsAt);
    } else {
      // Each step's pieces from the other hosts land in a slice of their own.
      partials_ = s.ctx_.memory().scratch(depth * H_ * pieceBytes_ + 1);
    }
    SMDDP_CHECK(K_ == 0 || (s.serverLinks_ && s.serverLinks_->count() == K_), kInternal,
                "smddp: a host server rank without its standalone-server links");
  }

  // Step k of the batch: `data` holds this host's partial (len elements,
  // in acc_); on completion, the reduction over every host.
  void post(uint64_t k, uint8_t* data, uint64_t len) {
    Step& st = steps_[k % steps_.size()];
    st = Step{};
    st.data = data;
    const uint32_t tag = crossHostStepChunk(k);  // wraps past 2^24 steps, safely (frame.h)
    // With K standalone servers the chunk is cut into H + K pieces; pieces
    // H.. (SMDDP_SERVER_SHARE of the chunk) go to the standalone servers,
    // which combine them in host order too (docs/design.md, "Standalone
    // reduction servers"); poll() reads their results into place.
    std::vector<Range> piece(H_ + K_);
    for (int i = 0; i < H_ + K_; ++i) piece[i] = crossHostPiece(len, H_, K_, i, k, share_);
    postToServers(k, st, data, piece);
    const Range mine = piece[myHost_];
    const size_t mineBytes = mine.count * es_;
    SMDDP_CHECK(mineBytes <= pieceBytes_, kInternal, "smddp: a cross-host piece outgrew its slice");
    st.len = len;
    ++posted_;
    if (narrow()) return postNarrow(k, st, piece, tag);
    uint8_t* partials = partials_ + (k % steps_.size()) * H_ * pieceBytes_;
    // Outstanding: H-1 partials in, H-1 pieces back, 2(H-1) sends.
    st.partialsLeft = H_ - 1;
    st.left = 4 * (H_ - 1);
    auto sent = [&st] { --st.left; };
    auto reduceAndReturn = [this, &st, k, mine, mineBytes, partials, tag, sent] {
      uint8_t* own = st.data + mine.offset * es_;
      std::vector<const void*> in(H_);
      for (int h = 0; h < H_; ++h) in[h] = h == myHost_ ? own : partials + h * mineBytes;
      s_.ctx_.traffic().serverReduce([&] {
        reduceOrdered(own, in.data(), H_, mine.count, acc_, b_.op,
                      b_.op == ReduceOp::kAvg ? static_cast<double>(s_.ctx_.size()) : 1.0);
      });
      for (int h = 0; h < H_; ++h) {
        if (h != myHost_) ex_.send(peerOf(h), kPhaseHostsReturn, tag, mine.offset * es_, own,
                                   mineBytes, sent);
      }
    };
    // Receives first, so frames land in place; then this host's pieces out.
    for (int h = 0; h < H_; ++h) {
      if (h == myHost_) continue;
      ex_.recv(peerOf(h), kPhaseHostsToServer, tag, partials + h * mineBytes, mineBytes,
               [&st, reduceAndReturn] {
                 --st.left;
                 if (--st.partialsLeft == 0) reduceAndReturn();
               });
      ex_.recv(peerOf(h), kPhaseHostsReturn, tag, data + piece[h].offset * es_,
               piece[h].count * es_, [&st] { --st.left; });
    }
    for (int h = 0; h < H_; ++h) {
      if (h == myHost_) continue;
      ex_.send(peerOf(h), kPhaseHostsToServer, tag, piece[h].offset * es_,
               data + piece[h].offset * es_, piece[h].count * es_, sent);
    }
  }

  // Reads what completed; true if any step finished. Throws on failure.
  bool poll() {
    if (done_ == posted_) return false;
    ex_.poll();
    if (K_) s_.serverLinks_->progress();
    const uint64_t before = done_;
    while (done_ < posted_ && stepDone(steps_[done_ % steps_.size()])) {
      Step& st = steps_[done_ % steps_.size()];
      if (K_) s_.ctx_.batches().standaloneStep();
      if (K_ && narrow()) {
        const uint64_t k = done_;
        for (int j = 0; j < K_; ++j) {
          const Range& p = st.servers[j];
          if (!unpackNarrowWire(reinterpret_cast<float*>(st.data) + p.offset, serverResult(k, j),
                                p.count, wire_)) {
            throwInvalidWireScale(wire_, "the result from " + s_.serverLinks_->describe(j));
          }
        }
      }
      if (wide_) narrowFromFloat(st.data, reinterpret_cast<const float*>(st.data), st.len, b_.dtype);
      ++done_;
    }
    return done_ > before;
  }
  uint64_t done() const { return done_; }
  bool inFlight() const { return done_ < posted_; }
  std::string waitingOn() const {
    std::string servers = K_ ? s_.serverLinks_->waitingOn() : std::string();
    return ex_.waitingOn() + " (across hosts)" + (servers.empty() ? "" : "; " + servers);
  }

  // A batch that unwinds with steps in flight leaves results on their way
  // from the standalone servers into its slots: the links drop them and
  // refuse later batches (ServerLinks::abandon).
  ~CrossHost() {
    if (K_ && done_ < posted_) {
      s_.serverLinks_->abandon("the allreduce of seq " + std::to_string(b_.firstSeq) + " failed");
    }
  }
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
  void postToServers(uint64_t k, Step& st, uint8_t* data, const std::vector<Range>& piece) {
    st.tickets.assign(K_, 0);
    if (narrow()) st.servers.assign(piece.begin() + H_, piece.end());  // poll() unpacks them
    for (int j = 0; j < K_; ++j) {
      const Range& p = piece[H_ + j];
      ServerFrame f;
      f.kind = static_cast<uint8_t>(ServerFrameKind::kData);
      f.dtype = static_cast<uint8_t>(acc_);
      f.op = static_cast<uint8_t>(b_.op);
      f.divisor = b_.op == ReduceOp::kAvg ? static_cast<uint32_t>(s_.ctx_.size()) : 1;
      f.seq = b_.firstSeq;
      f.step = k;
      f.count = p.count;
      f.payload = p.count * es_;
      const uint8_t* src = data + p.offset * es_;
      uint8_t* dst = data + p.offset * es_;
      if (narrow()) {
        // In the wire form both ways (docs/design.md, "Compression between
        // hosts"): the server combines as this host's own server does, and
        // poll() reads its result back into place once the step is done.
        SMDDP_CHECK(p.count <= maxServerPiece_, kInternal,
                    "smddp: a standalone server's piece outgrew its slice");
        f.dtype = static_cast<uint8_t>(wire_);
        f.flags = kServerFlagNarrowWire;
        f.payload = narrowWireBytes(p.count, wire_);
        packNarrowWire(serverOut(k, j), reinterpret_cast<const float*>(src), p.count, wire_,
                       scratch_);
        src = serverOut(k, j);
        dst = serverResult(k, j);
      }
      // Queued, not waited for: the socket takes what it can now, and
      // poll() sends the rest and reads the result back into place.
      st.tickets[j] = s_.serverLinks_->post(j, f, src, dst);
      s_.ctx_.batches().sentToStandalone(f.payload);
    }
  }

  bool stepDone(const Step& st) const {
    if (st.left) return false;
    for (int j = 0; j < K_; ++j) {
      if (!s_.serverLinks_->received(j, st.tickets[j])) return false;
    }
    return true;
  }
  int peerOf(int h) const { return s_.topo_.ranksOfHost[h][local_]; }
  bool narrow() const { return wire_ != DataType::kFloat32; }

  // post() across hosts in the narrow wire type (reduce/narrow_wire.h):
  // this host's pieces go out packed; host h's server widens the partials
  // (its own one rounded the same way), sums them in f32 in host order, and
  // packs the result once, which every host then reads back (itself
  // included), so every rank gets the same bytes.
  void postNarrow(uint64_t k, Step& st, const std::vector<Range>& piece, uint32_t tag) {
    float* data = reinterpret_cast<float*>(st.data);
    uint8_t* slices = wireSlices_ + (k % steps_.size()) * 3 * H_ * sliceBytes_;
    auto out = [this, slices](int h) { return slices + h * sliceBytes_; };
    auto partial = [this, slices](int h) { return slices + (H_ + h) * sliceBytes_; };
    auto result = [this, slices](int h) { return slices + (2 * H_ + h) * sliceBytes_; };
    const Range mine = piece[myHost_];
    const size_t es = elementSize(wire_);
    st.partialsLeft = H_ - 1;
    st.left = 4 * (H_ - 1);
    auto sent = [&st] { --st.left; };
    auto reduceAndReturn = [this, &st, data, mine, out, partial, tag, es, sent] {
      float* own = data + mine.offset;
      std::vector<const void*> in(H_);
      // Its own partial is rounded through the wire form too: every
      // host's partial is then rounded once whichever host serves an
      // element (the pieces move with the batch), so bf16 gives the same
      // bits from run to run.
      for (int h = 0; h < H_; ++h) in[h] = partial(h);
      const int bad = s_.ctx_.traffic().serverReduce([&] {
        return serveNarrowWire(
            own, out(myHost_), in.data(), H_, myHost_, mine.count, wire_, b_.op,
            b_.op == ReduceOp::kAvg ? static_cast<double>(s_.ctx_.size()) : 1.0, scratch_);
      });
      if (bad >= 0) throwBadScale(bad, "partial");
      const size_t bytes = narrowWireBytes(mine.count, wire_);
      for (int h = 0; h < H_; ++h) {
        if (h != myHost_) ex_.send(peerOf(h), kPhaseHostsReturn, tag, mine.offset * es,
                                   out(myHost_), bytes, sent);
      }
    };
    for (int h = 0; h < H_; ++h) {
      if (h == myHost_) continue;
      ex_.recv(peerOf(h), kPhaseHostsToServer, tag, partial(h),
               narrowWireBytes(mine.count, wire_), [&st, reduceAndReturn] {
                 --st.left;
                 if (--st.partialsLeft == 0) reduceAndReturn();
               });
      const Range p = piece[h];
      ex_.recv(peerOf(h), kPhaseHostsReturn, tag, result(h), narrowWireBytes(p.count, wire_),
               [this, &st, data, p, h, result] {
                 unpackOrThrow(data + p.offset, result(h), p.count, h, "result");
                 --st.left;
               });
    }
    for (int h = 0; h < H_; ++h) {
      if (h == myHost_) continue;
      packNarrowWire(out(h), data + piece[h].offset, piece[h].count, wire_, scratch_);
      ex_.send(peerOf(h), kPhaseHostsToServer, tag, piece[h].offset * es, out(h),
               narrowWireBytes(piece[h].count, wire_), sent);
    }
  }
  void unpackOrThrow(float* dst, const uint8_t* src, uint64_t count, int host, const char* what) {
    if (!unpackNarrowWire(dst, src, count, wire_)) throwBadScale(host, what);
  }
  [[noreturn]] void throwBadScale(int host, const char* what) {
    throwInvalidWireScale(wire_, "the cross-host " + std::string(what) + " from host " +
                                     std::to_string(host) + " (rank " +
                                     std::to_string(peerOf(host)) + ")");
  }

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
