#include "server/stream_service.h"

#include <poll.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <new>

#include "common/error.h"
#include "reduce/narrow_wire.h"
#include "reduce/reduce_kernels.h"
#include "server/server_wire.h"

namespace smddp {

namespace {

using Clock = std::chrono::steady_clock;

// Complete frames read ahead per host before the loop stops reading it,
// and results queued for a host before it stops combining: both bound the
// memory of a stream whatever its hosts send, and TCP's flow control
// holds the hosts back meanwhile.
constexpr uint64_t kReadAhead = 64ull << 20;
constexpr uint64_t kResultQueue = 64ull << 20;

ServerFrame errorFrame() {
  ServerFrame f;
  f.kind = static_cast<uint8_t>(ServerFrameKind::kError);
  return f;
}

class StreamLoop {
 public:
  StreamLoop(const std::string& who, uint64_t group, std::vector<StreamHost>& hosts,
             const std::atomic<bool>& stop, StreamCounters counters)
      : who_(who), group_(group), hosts_(hosts), H_(static_cast<int>(hosts.size())),
        stop_(stop), counters_(counters), in_(H_), inputs_(H_), polls_(H_) {
    for (int h = 0; h < H_; ++h) {
      in_[h].reader.checkWith(hosts_[h].check.get());
      in_[h].out.sealWith(hosts_[h].seal.get());
    }
  }

  std::string run() {
    try {
      loop();
    } catch (const std::bad_alloc&) {
      // What this stream holds goes first; the frames already begun are
      // finished from the caller's memory (the results keep theirs).
      spare_.clear();
      for (auto& x : in_) {
        x.ready.clear();
        x.reading = {};
      }
      failure_ = "the server ran out of memory serving this stream";
    }
    if (failure_.empty() && !finished_) failure_ = "the server is stopping";
    if (!finished_) tellAll(failure_);
    return finished_ ? "" : failure_;
  }

 private:
  void loop() {
    while (failure_.empty() && !finished_ && !stop_.load()) {
      for (int h = 0; h < H_; ++h) {
        const short events = static_cast<short>((reading(h) ? POLLIN : 0) |
                                                (in_[h].out.empty() ? 0 : POLLOUT));
        // No events, no fd: a closed socket would report POLLHUP at once.
        polls_[h] = {events ? hosts_[h].conn.fd() : -1, events, 0};
      }
      if (poll(polls_.data(), H_, 100) <= 0) continue;
      for (int h = 0; h < H_ && failure_.empty(); ++h) {
        if (polls_[h].revents & POLLOUT) sendTo(h);
        if (polls_[h].revents & (POLLIN | POLLHUP | POLLERR)) readFrom(h);
      }
      combine();
    }
  }

  struct Frame {
    ServerFrame header;
    PayloadBuffer payload;
  };
  struct Host {
    FrameReader reader;
    PayloadBuffer reading;  // the payload being read
    std::deque<Frame> ready;
    uint64_t readyBytes = 0;
    FrameWriter out;  // results; each payload shared by every host's queue
    uint64_t queued = 0;  // result bytes in `out`
    bool bye = false;  // read its goodbye: nothing follows but the close
  };

  std::string name(int h) const {
    return "host " + std::to_string(h) + " (rank " + std::to_string(hosts_[h].rank) + ")";
  }
  bool reading(int h) const {
    const Host& x = in_[h];
    return !x.bye && (x.ready.empty() || x.readyBytes < kReadAhead);
  }
  PayloadBuffer buffer(uint64_t n) {
    PayloadBuffer v;
    if (!spare_.empty()) {
      v = std::move(spare_.back());
      spare_.pop_back();
    }
    v.resize(n);  // not zero-filled: pages are taken as the bytes land
    return v;
  }
  void recycle(PayloadBuffer&& v) {
    if (spare_.size() < 16) spare_.push_back(std::move(v));
  }

  void broke(int h, const std::string& why) {
    if (why == "closed") {
      failure_ = name(h) + " closed its connection without a goodbye (the worker died?)";
    } else if (why == "silent") {
      failure_ = name(h) + " went silent: nothing sent to it was acknowledged within "
                           "SMDDP_PEER_TIMEOUT";
    } else {
      failure_ = name(h) + "'s connection broke: " + why;
    }
  }

  // Why host h's header is refused inside the stream, or "".
  std::string refuse(int h, const ServerFrame& f) const {
    std::string why = validateServerFrame(f, {ServerFrameKind::kData, ServerFrameKind::kBye});
    if (!why.empty()) return why;
    if (f.group != group_) {
      return "a frame of another group (" + std::to_string(f.group) + ", not " +
             std::to_string(group_) + ")";
    }
    if (f.payload > hosts_[h].maxPiece) {
      return "a piece of " + std::to_string(f.payload) + " bytes, past the " +
             std::to_string(hosts_[h].maxPiece) + " its hello announced";
    }
    return "";
  }

  // Reads what host h's socket holds, up to the read-ahead bound.
  void readFrom(int h) {
    Host& x = in_[h];
    std::string why;
    while (failure_.empty() && reading(h)) {
      const FrameIo io = x.reader.read(hosts_[h].conn.fd(), &why);
      if (io == FrameIo::kAgain) return;
      if (io == FrameIo::kFailed) return broke(h, why);
      const ServerFrame& f = x.reader.header();
      if (io == FrameIo::kHeader) {
        why = refuse(h, f);
        if (!why.empty()) {
          failure_ = "a bad frame from " + name(h) + ": " + why;
          return;
        }
        x.reading = buffer(f.kind == static_cast<uint8_t>(ServerFrameKind::kData) ? f.payload : 0);
        x.reader.payloadTo(x.reading.data());
        continue;
      }
      x.readyBytes += x.reading.size();  // kDone
      x.bye = f.kind == static_cast<uint8_t>(ServerFrameKind::kBye);
      x.ready.push_back({f, std::move(x.reading)});
      x.reading = {};
      x.reader.next();
    }
  }

  void sendTo(int h) {
    Host& x = in_[h];
    std::string why;
    while (failure_.empty() && !x.out.empty()) {
      const FrameIo io = x.out.write(hosts_[h].conn.fd(), &why);
      if (io == FrameIo::kFailed) return broke(h, why);
      if (io != FrameIo::kDone) return;
      x.queued -= x.out.front().payload;
      auto sent = x.out.pop();
      if (sent.use_count() == 1) recycle(std::move(*sent));
    }
  }

  // Whether the front of every host's queue is the same step, ready to
  // combine: false while some host's piece is still to come, some host's
  // results are still queued past the bound, or the stream ended.
  bool stepReady() {
    for (int h = 0; h < H_; ++h) {
      if (in_[h].ready.empty() || in_[h].queued >= kResultQueue) return false;
    }
    int byes = 0;
    for (auto& x : in_) {
      byes += x.ready.front().header.kind == static_cast<uint8_t>(ServerFrameKind::kBye);
    }
    if (byes == H_) finished_ = true;  // every host said goodbye: the group shut down
    if (byes && byes < H_) failure_ = "some hosts left while others still sent data";
    for (int h = 1; h < H_ && failure_.empty() && !finished_; ++h) {
      const std::string diff = samePiece(in_[0].ready.front().header, in_[h].ready.front().header);
      if (!diff.empty()) failure_ = name(0) + " and " + name(h) + " sent different pieces: " + diff;
    }
    return failure_.empty() && !finished_;
  }

  // Combines every step whose pieces are all in, in host order.
  void combine() {
    while (failure_.empty() && stepReady()) {
      const ServerFrame f = in_[0].ready.front().header;
      auto result = std::make_shared<PayloadBuffer>(buffer(f.payload));
      ServerFrame out = f;
      out.kind = static_cast<uint8_t>(ServerFrameKind::kResult);
      if (f.count) {
        for (int h = 0; h < H_; ++h) inputs_[h] = in_[h].ready.front().payload.data();
        if (f.flags & kServerFlagNarrowWire) {
          if (!combineNarrow(f, result->data())) return;
        } else {
          reduceOrdered(result->data(), inputs_.data(), H_, f.count,
                        static_cast<DataType>(f.dtype), static_cast<ReduceOp>(f.op),
                        static_cast<double>(f.divisor));
        }
      } else if (f.flags & kServerFlagNarrowWire) {
        // No elements: the scale alone, 1 (what packNarrowWire writes).
        packNarrowWire(result->data(), nullptr, 0, static_cast<DataType>(f.dtype), nullptr);
      }
      counters_.pieces++;
      counters_.bytes += f.payload * H_;
      for (int h = 0; h < H_; ++h) {
        Host& x = in_[h];
        x.readyBytes -= x.ready.front().payload.size();
        recycle(std::move(x.ready.front().payload));
        x.ready.pop_front();
        x.out.push(out, result->data(), result);
        x.queued += out.payload;
        sendTo(h);
      }
    }
  }

  // A narrow step (kServerFlagNarrowWire), as a host's own server does it
  // (reduce/narrow_wire.h, combineNarrowWire): every host's piece read
  // back to f32 and combined in f32 in host order, then packed once into
  // `dst`. The f32 sum is held whole (its scale is the whole piece's), the
  // widened pieces a chunk at a time: n + (H + 1) x 64 Ki floats, never
  // n x (H + 2), and none of it zero-filled. False, with the stream
  // failed, if a piece carries an invalid scale.
  bool combineNarrow(const ServerFrame& f, uint8_t* dst) {
    const auto wire = static_cast<DataType>(f.dtype);
    const size_t n = f.count;
    const size_t chunk = std::min(n, kNarrowWireScratch);
    floats_.resize((n + (H_ + 1) * chunk) * sizeof(float));
    float* sum = reinterpret_cast<float*>(floats_.data());
    const int bad = combineNarrowWire(dst, sum, inputs_.data(), H_, n, wire,
                                      static_cast<ReduceOp>(f.op),
                                      static_cast<double>(f.divisor), sum + n);
    if (bad >= 0) {
      failure_ = "a bad frame from " + name(bad) + ": its piece (seq " + std::to_string(f.seq) +
                 " step " + std::to_string(f.step) + ") carries an invalid scale for " +
                 toString(wire);
      return false;
    }
    return true;
  }

  // Tells every host why this stream ends, after the rest of a result
  // frame already begun.
  void tellAll(const std::string& why) {
    for (int h = 0; h < H_; ++h) {
      const auto deadline = Clock::now() + std::chrono::seconds(1);
      const int fd = hosts_[h].conn.fd();
      if (!in_[h].out.finishBefore(fd, deadline).empty()) continue;
      writeTextFrame(fd, errorFrame(), who_ + ": " + why, deadline, hosts_[h].seal.get());
    }
  }

  const std::string& who_;
  const uint64_t group_;
  std::vector<StreamHost>& hosts_;
  const int H_;
  const std::atomic<bool>& stop_;
  StreamCounters counters_;
  std::vector<Host> in_;
  std::vector<const void*> inputs_;
  std::vector<pollfd> polls_;
  std::vector<PayloadBuffer> spare_;  // payload buffers to reuse
  PayloadBuffer floats_;              // narrow steps' f32 room (combineNarrow)
  std::string failure_;
  bool finished_ = false;
};

}  // namespace

std::string serveStream(const std::string& who, uint64_t group, std::vector<StreamHost>& hosts,
                        const std::atomic<bool>& stop, StreamCounters counters) {
  std::unique_ptr<StreamLoop> loop;
  try {
    loop = std::make_unique<StreamLoop>(who, group, hosts, stop, counters);
  } catch (const std::bad_alloc&) {
    // Nothing was sent on these connections yet: an error frame starts
    // on a frame boundary. The server goes on with its other streams.
    const std::string why = "the server ran out of memory starting this stream";
    tellStreamHosts(hosts, who + ": " + why);
    return why;
  }
  return loop->run();
}

void tellStreamHosts(std::vector<StreamHost>& hosts, const std::string& text) {
  for (auto& h : hosts) {
    if (!h.conn) continue;
    writeTextFrame(h.conn.fd(), errorFrame(), text, Clock::now() + std::chrono::seconds(1),
                   h.seal.get());
  }
}

}  // namespace smddp
