#include "server/server_wire.h"

#include <algorithm>
#include <cstdlib>

#include "common/error.h"
#include "reduce/narrow_wire.h"
#include "server/server_auth.h"

namespace smddp {

const char* toString(ServerFrameKind k) {
  switch (k) {
    case ServerFrameKind::kHello: return "hello";
    case ServerFrameKind::kWelcome: return "welcome";
    case ServerFrameKind::kData: return "data";
    case ServerFrameKind::kResult: return "result";
    case ServerFrameKind::kError: return "error";
    case ServerFrameKind::kBye: return "bye";
    case ServerFrameKind::kChallenge: return "challenge";
    case ServerFrameKind::kAnswer: return "answer";
  }
  return "unknown";
}

namespace {

// A data or result frame's fields: dtype, op, divisor, flags, and a
// payload that holds exactly `count` elements (in the narrow wire form,
// after its scale).
std::string validateDataFrame(const ServerFrame& f) {
  if (f.dtype >= static_cast<uint8_t>(DataType::kCount)) {
    return "unknown dtype " + std::to_string(f.dtype);
  }
  if (f.op >= static_cast<uint8_t>(ReduceOp::kCount)) return "unknown op " + std::to_string(f.op);
  std::string why;
  const auto dt = static_cast<DataType>(f.dtype);
  const auto op = static_cast<ReduceOp>(f.op);
  if (!isSupported(op, dt, &why)) return why;
  if (f.divisor == 0) return "divisor 0";
  if (f.payload > kServerMaxPayload) {
    return "payload of " + std::to_string(f.payload) + " bytes (at most " +
           std::to_string(kServerMaxPayload) + ")";
  }
  if (f.flags & ~kServerFlagNarrowWire) {
    return "unknown flags " + std::to_string(f.flags) + " on a data or result frame";
  }
  const bool narrow = f.flags & kServerFlagNarrowWire;
  if (narrow && dt != DataType::kBFloat16 && dt != DataType::kFloat16) {
    return std::string("a narrow wire form of ") + toString(dt) + " (bf16 or fp16 only)";
  }
  const uint64_t es = elementSize(dt);
  const uint64_t scale = narrow ? kNarrowWireScaleBytes : 0;
  if (f.payload < scale || (f.payload - scale) % es != 0 || (f.payload - scale) / es != f.count) {
    return "payload of " + std::to_string(f.payload) + " bytes for " + std::to_string(f.count) +
           " elements of " + toString(dt) +
           (narrow ? " in the narrow wire form (a " + std::to_string(scale) + "-byte scale first)"
                   : "");
  }
  return "";
}

// A hello's proof and job id, its group of hosts, piece size and flags.
std::string validateHello(const ServerFrame& f) {
  if (f.payload < kServerProofBytes || f.payload - kServerProofBytes > kServerMaxJob) {
    return "a hello of " + std::to_string(f.payload) + " bytes (a proof of " +
           std::to_string(kServerProofBytes) + " and a job id of at most " +
           std::to_string(kServerMaxJob) + ")";
  }
  if (f.hosts < 2) return "a group of " + std::to_string(f.hosts) + " hosts";
  if (f.host >= f.hosts) {
    return "host " + std::to_string(f.host) + " of " + std::to_string(f.hosts);
  }
  if (f.count > kServerMaxPayload) {
    return "pieces of up to " + std::to_string(f.count) + " bytes (at most " +
           std::to_string(kServerMaxPayload) + ")";
  }
  if (f.flags & ~(kServerFlagIntegrity | kServerFlagEncrypt)) {
    return "unknown flags " + std::to_string(f.flags);
  }
  if ((f.flags & kServerFlagEncrypt) && !(f.flags & kServerFlagIntegrity)) {
    return "a hello asking for encryption without integrity (encryption implies it)";
  }
  return "";
}

}  // namespace

std::string validateServerFrame(const ServerFrame& f,
                                std::initializer_list<ServerFrameKind> kinds) {
  if (f.magic != kServerMagic) {
    return "not a smddp reduction-server frame (bad magic; is something else talking to this port?)";
  }
  if (f.version != kServerVersion) {
    return "protocol version " + std::to_string(f.version) + ", expected " +
           std::to_string(kServerVersion);
  }
  bool known = false;
  for (ServerFrameKind k : kinds) known = known || f.kind == static_cast<uint8_t>(k);
  if (!known) {
    std::string want;
    for (ServerFrameKind k : kinds) want += std::string(want.empty() ? "" : " or ") + toString(k);
    return std::string("a ") + toString(static_cast<ServerFrameKind>(f.kind)) + " frame (kind " +
           std::to_string(f.kind) + ") where " + want + " was expected";
  }
  const auto kind = static_cast<ServerFrameKind>(f.kind);
  if (kind == ServerFrameKind::kData || kind == ServerFrameKind::kResult) {
    return validateDataFrame(f);
  } else if (kind == ServerFrameKind::kHello) {
    return validateHello(f);
  } else if (kind == ServerFrameKind::kChallenge) {
    const uint64_t fixed = kServerProofBytes + kServerShareBytes;
    if (f.count == 0 || f.count > kServerMaxAddress || f.payload < fixed + f.count ||
        f.payload - fixed - f.count > kServerMaxJob) {
      return "a challenge of " + std::to_string(f.payload) + " bytes with an address of " +
             std::to_string(f.count) + " (a nonce of " + std::to_string(kServerProofBytes) +
             ", a key share of " + std::to_string(kServerShareBytes) +
             ", an address of 1 to " + std::to_string(kServerMaxAddress) +
             " and a job id of at most " + std::to_string(kServerMaxJob) + ")";
    }
  } else if (kind == ServerFrameKind::kAnswer) {
    if (f.payload != kServerAnswerBytes) {
      return "an answer of " + std::to_string(f.payload) + " bytes (it carries " +
             std::to_string(kServerAnswerBytes) + ")";
    }
  } else if ((kind == ServerFrameKind::kWelcome || kind == ServerFrameKind::kBye) && f.payload) {
    return std::string("a ") + toString(kind) + " frame with " + std::to_string(f.payload) +
           " bytes of payload (it carries none)";
  } else if (f.payload > kServerMaxText) {
    return "a text of " + std::to_string(f.payload) + " bytes (at most " +
           std::to_string(kServerMaxText) + ")";
  }
  return "";
}

std::string samePiece(const ServerFrame& a, const ServerFrame& b) {
  auto desc = [](const ServerFrame& f) {
    return "seq " + std::to_string(f.seq) + " step " + std::to_string(f.step) + ", " +
           std::to_string(f.count) + " x " + toString(static_cast<DataType>(f.dtype)) + " " +
           toString(static_cast<ReduceOp>(f.op)) + "/" + std::to_string(f.divisor) +
           (f.flags & kServerFlagNarrowWire ? " narrow" : "");
  };
  if (a.seq == b.seq && a.step == b.step && a.count == b.count && a.dtype == b.dtype &&
      a.op == b.op && a.divisor == b.divisor && a.flags == b.flags) {
    return "";
  }
  return desc(a) + " vs " + desc(b);
}

std::vector<ServerAddress> parseServerHosts(const std::string& spec) {
  std::vector<ServerAddress> out;
  auto bad = [&](const std::string& item, const std::string& why) {
    throwError(ErrorKind::kInvalidArgument,
               "SMDDP_SERVER_HOSTS='" + spec + "': '" + item + "' " + why +
                   " (expected host:port[,host:port...])");
  };
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    if (comma == std::string::npos) comma = spec.size();
    std::string item = spec.substr(pos, comma - pos);
    pos = comma + 1;
    // Surrounding blanks are allowed; an empty list is none at all.
    while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.erase(0, 1);
    while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.pop_back();
    if (item.empty()) {
      if (comma == spec.size() && out.empty() && spec.find_first_not_of(" \t") == std::string::npos) {
        break;
      }
      bad(item, "is empty");
    }
    const size_t colon = item.rfind(':');
    if (colon == std::string::npos || colon == 0) bad(item, "has no host:port");
    std::string host = item.substr(0, colon);
    if (host.front() == '[') {
      if (host.back() != ']' || host.size() < 3) bad(item, "has an unclosed [");
      host = host.substr(1, host.size() - 2);
    } else if (host.find(':') != std::string::npos) {
      bad(item, "needs brackets around an IPv6 address");
    }
    const std::string port = item.substr(colon + 1);
    char* end = nullptr;
    long p = port.empty() ? -1 : std::strtol(port.c_str(), &end, 10);
    if (port.empty() || *end != '\0' || p < 1 || p > 65535) bad(item, "has no port in 1..65535");
    out.push_back({host, static_cast<int>(p),
                   "SMDDP_SERVER_HOSTS[" + std::to_string(out.size()) + "]"});
    if (comma == spec.size()) break;
  }
  if (out.size() > 1024) bad(std::to_string(out.size()) + " servers", "is more than 1024");
  return out;
}

}  // namespace smddp

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <cerrno>
#include <cstring>

namespace smddp {

namespace {

std::string pollOnce(int fd, short events, std::chrono::steady_clock::time_point deadline,
                     const WaitCheck& stop) {
  const auto now = std::chrono::steady_clock::now();
  if (now >= deadline) return "timed out";
  if (stop) {
    std::string why = stop();
    if (!why.empty()) return why;
  }
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
  pollfd p{fd, events, 0};
  int rc = poll(&p, 1, static_cast<int>(std::min<int64_t>(100, left + 1)));
  if (rc < 0 && errno != EINTR) return std::string("poll: ") + strerror(errno);
  return "";
}

}  // namespace

std::string writeAllBefore(int fd, const void* p, size_t n,
                           std::chrono::steady_clock::time_point deadline, const WaitCheck& stop) {
  auto* b = static_cast<const uint8_t*>(p);
  size_t done = 0;
  while (done < n) {
    ssize_t k = ::send(fd, b + done, n - done, MSG_NOSIGNAL);
    if (k > 0) {
      done += static_cast<size_t>(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      std::string why = pollOnce(fd, POLLOUT, deadline, stop);
      if (!why.empty()) return why;
      continue;
    }
    // ETIMEDOUT: unacknowledged past TCP_USER_TIMEOUT (boundSilence).
    return k < 0 && errno == ETIMEDOUT ? "silent" : "closed";  // EPIPE, ECONNRESET, ...
  }
  return "";
}

std::string readAllBefore(int fd, void* p, size_t n, std::chrono::steady_clock::time_point deadline,
                          const WaitCheck& stop) {
  auto* b = static_cast<uint8_t*>(p);
  size_t done = 0;
  while (done < n) {
    ssize_t k = ::recv(fd, b + done, n - done, 0);
    if (k > 0) {
      done += static_cast<size_t>(k);
      continue;
    }
    if (k == 0) return "closed";
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      std::string why = pollOnce(fd, POLLIN, deadline, stop);
      if (!why.empty()) return why;
      continue;
    }
    return errno == ETIMEDOUT ? "silent" : "closed";
  }
  return "";
}

std::string writeTextFrame(int fd, ServerFrame f, const std::string& text,
                           std::chrono::steady_clock::time_point deadline, FrameSeal* seal) {
  const std::string t = text.substr(0, kServerMaxText);
  f.payload = t.size();
  // One buffer, one send where the socket takes it: a peer that closes
  // at once still finds the whole frame.
  std::string out(reinterpret_cast<const char*>(&f), sizeof(f));
  out += t;
  if (seal) {
    auto* body = reinterpret_cast<uint8_t*>(out.data()) + sizeof(f);
    const Tag m = seal->seal(f, body, body);
    out.append(reinterpret_cast<const char*>(m.bytes), kTagBytes);
  }
  return writeAllBefore(fd, out.data(), out.size(), deadline);
}

namespace {

// "silent" for a connection TCP_USER_TIMEOUT ended, else the error.
std::string socketError(int e) { return e == ETIMEDOUT ? "silent" : strerror(e); }

}  // namespace

FrameIo FrameReader::read(int fd, std::string* why) {
  constexpr uint64_t kHeader = sizeof(ServerFrame);
  while (true) {
    uint8_t* dst;
    uint64_t want;
    if (got_ < kHeader) {
      dst = reinterpret_cast<uint8_t*>(&header_) + got_;
      want = kHeader - got_;
    } else if (got_ - kHeader < header_.payload) {
      want = header_.payload - (got_ - kHeader);
      if (!payload_) throwError(ErrorKind::kInternal, "FrameReader: no payloadTo() for a payload");
      dst = payload_ + (got_ - kHeader);
    } else {
      const uint64_t mac = got_ - kHeader - header_.payload;  // MAC bytes read so far
      want = seal_ ? kTagBytes - mac : 0;
      if (want == 0) {
        if (seal_ && !seal_->open(header_, payload_, mac_)) {
          *why = std::string("a frame failed its integrity check (") +
                 (seal_->encrypts() ? "SMDDP_WIRE_ENCRYPT" : "SMDDP_SERVER_INTEGRITY") +
                 "): it was altered, replayed or reordered on the way";
          return FrameIo::kFailed;
        }
        return FrameIo::kDone;
      }
      dst = mac_ + mac;
    }
    const ssize_t k = ::recv(fd, dst, want, MSG_DONTWAIT);
    if (k == 0) {
      *why = "closed";
      return FrameIo::kFailed;
    }
    if (k < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return FrameIo::kAgain;
      *why = socketError(errno);
      return FrameIo::kFailed;
    }
    got_ += static_cast<uint64_t>(k);
    bytes_ += static_cast<uint64_t>(k);
    if (got_ == kHeader) return FrameIo::kHeader;
  }
}

std::string readFrameBefore(int fd, FrameReader& reader,
                            std::initializer_list<ServerFrameKind> kinds, uint64_t most,
                            std::string* payload, std::chrono::steady_clock::time_point deadline) {
  std::string why;
  while (true) {
    const FrameIo io = reader.read(fd, &why);
    if (io == FrameIo::kFailed) return why;
    if (io == FrameIo::kDone) {
      reader.next();
      return "";
    }
    if (io == FrameIo::kHeader) {
      why = validateServerFrame(reader.header(), kinds);
      if (!why.empty()) return why;
      if (reader.header().payload > most) {
        return std::string("a ") + toString(static_cast<ServerFrameKind>(reader.header().kind)) +
               " of " + std::to_string(reader.header().payload) + " bytes (at most " +
               std::to_string(most) + " here)";
      }
      payload->assign(reader.header().payload, '\0');
      reader.payloadTo(reinterpret_cast<uint8_t*>(payload->data()));
      continue;
    }
    why = pollOnce(fd, POLLIN, deadline, nullptr);  // kAgain
    if (!why.empty()) return why;
  }
}

uint64_t FrameWriter::begin(Out& o) {
  if (seal_ && !o.sealed) {
    Tag m;
    if (seal_->encrypts() && o.header.payload) {
      // The caller's memory stays as it is (a result goes to every host
      // from one buffer): the ciphertext goes out from the writer's own.
      cipher_.resize(o.header.payload);
      m = seal_->seal(o.header, o.data, cipher_.data());
      o.data = cipher_.data();
    } else {
      m = seal_->seal(o.header, o.data, nullptr);
    }
    std::memcpy(o.mac, m.bytes, kTagBytes);
    o.sealed = true;
  }
  return sizeof(ServerFrame) + o.header.payload + (seal_ ? kTagBytes : 0);
}

FrameIo FrameWriter::write(int fd, std::string* why) {
  constexpr uint64_t kHeader = sizeof(ServerFrame);
  if (out_.empty()) return FrameIo::kAgain;
  Out& o = out_.front();
  const uint64_t total = begin(o);
  while (true) {
    // What is left of header, payload and MAC, in order.
    uint8_t* starts[3] = {reinterpret_cast<uint8_t*>(&o.header), const_cast<uint8_t*>(o.data),
                          o.mac};
    const uint64_t lo[3] = {0, kHeader, kHeader + o.header.payload};
    const uint64_t hi[3] = {kHeader, kHeader + o.header.payload, total};
    iovec iov[3];
    int n = 0;
    for (int part = 0; part < 3; ++part) {
      if (o.sent >= hi[part] || hi[part] == lo[part]) continue;
      const uint64_t skip = o.sent > lo[part] ? o.sent - lo[part] : 0;
      iov[n++] = {starts[part] + skip, hi[part] - lo[part] - skip};
    }
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = n;
    const ssize_t k = ::sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return FrameIo::kAgain;
      *why = socketError(errno);
      return FrameIo::kFailed;
    }
    o.sent += static_cast<uint64_t>(k);
    bytes_ += static_cast<uint64_t>(k);
    if (o.sent == total) return FrameIo::kDone;
  }
}

std::string FrameWriter::finishBefore(int fd, std::chrono::steady_clock::time_point deadline) {
  if (out_.empty() || out_.front().sent == 0) return "";
  Out& o = out_.front();
  const uint64_t total = begin(o);
  std::string why;
  while (why.empty() && o.sent < total) {
    std::string err;
    const FrameIo io = write(fd, &err);
    if (io == FrameIo::kFailed) why = err;
    else if (io == FrameIo::kAgain) why = pollOnce(fd, POLLOUT, deadline, nullptr);
  }
  if (why.empty()) out_.pop_front();
  return why;
}

}  // namespace smddp
