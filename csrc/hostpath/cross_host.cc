// FusionBufferScheduler::CrossHost: the pipelined network step of a
// multi-host batch (cross_host.h).
#include "hostpath/cross_host.h"

#include <algorithm>

#include "common/error.h"
#include "observe/stats.h"
#include "reduce/narrow_wire.h"
#include "reduce/reduce_kernels.h"
#include "server/server_wire.h"
#include "transport/frame.h"

namespace smddp {

FusionBufferScheduler::CrossHost::CrossHost(FusionBufferScheduler& s, Batch& b, int server,
                                            uint64_t depth, uint64_t chunkElems)
    : s_(s), b_(b), H_(s.topo_.hosts()), myHost_(s.topo_.hostIndex),
      local_(s.segment_->serverRank(server)), K_(s.standalone_),
      share_(serverShareMillionths(H_, K_, hostPathConfig(s.ctx_.config()).serverSharePercent)),
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

void FusionBufferScheduler::CrossHost::post(uint64_t k, uint8_t* data, uint64_t len) {
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

bool FusionBufferScheduler::CrossHost::poll() {
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

std::string FusionBufferScheduler::CrossHost::waitingOn() const {
  std::string servers = K_ ? s_.serverLinks_->waitingOn() : std::string();
  return ex_.waitingOn() + " (across hosts)" + (servers.empty() ? "" : "; " + servers);
}

// A batch that unwinds with steps in flight leaves results on their way
// from the standalone servers into its slots: the links drop them and
// refuse later batches (ServerLinks::abandon).
FusionBufferScheduler::CrossHost::~CrossHost() {
  if (K_ && done_ < posted_) {
    s_.serverLinks_->abandon("the allreduce of seq " + std::to_string(b_.firstSeq) + " failed");
  }
}

// Step k's pieces H.. to the K standalone servers, queued on their links.
void FusionBufferScheduler::CrossHost::postToServers(uint64_t k, Step& st, uint8_t* data,
                                                     const std::vector<Range>& piece) {
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

bool FusionBufferScheduler::CrossHost::stepDone(const Step& st) const {
  if (st.left) return false;
  for (int j = 0; j < K_; ++j) {
    if (!s_.serverLinks_->received(j, st.tickets[j])) return false;
  }
  return true;
}

// post() across hosts in the narrow wire type (reduce/narrow_wire.h):
// this host's pieces go out packed; host h's server widens the partials
// (its own one rounded the same way), sums them in f32 in host order, and
// packs the result once, which every host then reads back (itself
// included), so every rank gets the same bytes.
void FusionBufferScheduler::CrossHost::postNarrow(uint64_t k, Step& st,
                                                  const std::vector<Range>& piece, uint32_t tag) {
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

void FusionBufferScheduler::CrossHost::unpackOrThrow(float* dst, const uint8_t* src, uint64_t count,
                                                     int host, const char* what) {
  if (!unpackNarrowWire(dst, src, count, wire_)) throwBadScale(host, what);
}

void FusionBufferScheduler::CrossHost::throwBadScale(int host, const char* what) {
  throwInvalidWireScale(wire_, "the cross-host " + std::string(what) + " from host " +
                                   std::to_string(host) + " (rank " +
                                   std::to_string(peerOf(host)) + ")");
}

}  // namespace smddp
