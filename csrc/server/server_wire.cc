#include "server/server_wire.h"

#include <algorithm>
#include <cstdlib>

#include "common/error.h"

namespace smddp {

const char* toString(ServerFrameKind k) {
  switch (k) {
    case ServerFrameKind::kHello: return "hello";
    case ServerFrameKind::kWelcome: return "welcome";
    case ServerFrameKind::kData: return "data";
    case ServerFrameKind::kResult: return "result";
    case ServerFrameKind::kError: return "error";
    case ServerFrameKind::kBye: return "bye";
  }
  return "unknown";
}

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
    const uint64_t es = elementSize(dt);
    if (f.payload % es != 0 || f.payload / es != f.count) {
      return "payload of " + std::to_string(f.payload) + " bytes for " + std::to_string(f.count) +
             " elements of " + toString(dt);
    }
  } else if (kind == ServerFrameKind::kHello) {
    if (f.payload > 256) return "a job id of " + std::to_string(f.payload) + " bytes (at most 256)";
    if (f.hosts < 2) return "a group of " + std::to_string(f.hosts) + " hosts";
    if (f.host >= f.hosts) {
      return "host " + std::to_string(f.host) + " of " + std::to_string(f.hosts);
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
           toString(static_cast<ReduceOp>(f.op)) + "/" + std::to_string(f.divisor);
  };
  if (a.seq == b.seq && a.step == b.step && a.count == b.count && a.dtype == b.dtype &&
      a.op == b.op && a.divisor == b.divisor) {
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
    out.push_back({host, static_cast<int>(p)});
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
                           std::chrono::steady_clock::time_point deadline) {
  const std::string t = text.substr(0, kServerMaxText);
  f.payload = t.size();
  std::string why = writeAllBefore(fd, &f, sizeof(f), deadline);
  if (why.empty() && !t.empty()) why = writeAllBefore(fd, t.data(), t.size(), deadline);
  return why;
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
    } else {
      want = header_.payload - (got_ - kHeader);
      if (want == 0) return FrameIo::kDone;
      if (!payload_) throwError(ErrorKind::kInternal, "FrameReader: no payloadTo() for a payload");
      dst = payload_ + (got_ - kHeader);
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

FrameIo FrameWriter::write(int fd, std::string* why) {
  constexpr uint64_t kHeader = sizeof(ServerFrame);
  if (out_.empty()) return FrameIo::kAgain;
  Out& o = out_.front();
  while (true) {
    iovec iov[2];
    int n = 0;
    if (o.sent < kHeader) {
      iov[n++] = {reinterpret_cast<uint8_t*>(&o.header) + o.sent, kHeader - o.sent};
      if (o.header.payload) iov[n++] = {const_cast<uint8_t*>(o.data), o.header.payload};
    } else {
      iov[n++] = {const_cast<uint8_t*>(o.data) + (o.sent - kHeader),
                  o.header.payload - (o.sent - kHeader)};
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
    if (o.sent == kHeader + o.header.payload) return FrameIo::kDone;
  }
}

std::string FrameWriter::finishBefore(int fd, std::chrono::steady_clock::time_point deadline) {
  constexpr uint64_t kHeader = sizeof(ServerFrame);
  if (out_.empty() || out_.front().sent == 0) return "";
  Out& o = out_.front();
  std::string why;
  if (o.sent < kHeader) {
    why = writeAllBefore(fd, reinterpret_cast<uint8_t*>(&o.header) + o.sent, kHeader - o.sent,
                         deadline);
    if (why.empty()) o.sent = kHeader;
  }
  if (why.empty() && o.sent < kHeader + o.header.payload) {
    why = writeAllBefore(fd, o.data + (o.sent - kHeader), kHeader + o.header.payload - o.sent,
                         deadline);
  }
  if (why.empty()) out_.pop_front();
  return why;
}

}  // namespace smddp
