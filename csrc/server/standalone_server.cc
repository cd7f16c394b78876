#include "server/standalone_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <tuple>

#include "common/error.h"
#include "common/logging.h"
#include "reduce/reduce_kernels.h"
#include "server/server_wire.h"
#include "transport/peer_monitor.h"
#include "transport/socket_address.h"

namespace smddp {

namespace {

using Clock = std::chrono::steady_clock;

int listenOnPort(const std::string& ip, int port, int* bound) {
  sockaddr_storage sa{};
  socklen_t len = 0;
  if (inet_pton(AF_INET, ip.c_str(), &reinterpret_cast<sockaddr_in*>(&sa)->sin_addr) == 1) {
    auto* in = reinterpret_cast<sockaddr_in*>(&sa);
    in->sin_family = AF_INET;
    in->sin_port = htons(static_cast<uint16_t>(port));
    len = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, ip.c_str(), &reinterpret_cast<sockaddr_in6*>(&sa)->sin6_addr) == 1) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&sa);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(static_cast<uint16_t>(port));
    len = sizeof(sockaddr_in6);
  } else {
    throwError(ErrorKind::kInvalidArgument,
               "reduction server: '" + ip + "' is not a numeric address to listen on");
  }
  int fd = socket(sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  SMDDP_CHECK(fd >= 0, kTransport, std::string("reduction server: socket: ") + strerror(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), len) != 0 || listen(fd, 256) != 0) {
    const int e = errno;
    close(fd);
    throwError(ErrorKind::kTransport, "reduction server: cannot listen on " + ip + ":" +
                                          std::to_string(port) + ": " + strerror(e));
  }
  len = sizeof(sa);
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  *bound = ntohs(sa.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&sa)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&sa)->sin_port);
  return fd;
}

ServerFrame errorFrame() {
  ServerFrame f;
  f.kind = static_cast<uint8_t>(ServerFrameKind::kError);
  return f;
}

}  // namespace

// The connections of one stream: host h's server rank for stream s of
// one group, on one server.
struct StandaloneServer::Stream {
  int hosts = 0;
  std::vector<int> fds;    // by host; -1 until it joined
  std::vector<int> ranks;  // by host, for messages
  int joined = 0;
  bool serving = false;
};

StandaloneServer::StandaloneServer(Options options) : options_(std::move(options)) {
  SMDDP_CHECK(options_.count >= 1 && options_.count <= 1024, kInvalidArgument,
              "reduction server: --servers must be in 1..1024");
  try {
    for (int i = 0; i < options_.count; ++i) {
      int port = 0;
      const int want = options_.basePort ? options_.basePort + i : 0;
      SMDDP_CHECK(want <= 65535, kInvalidArgument,
                  "reduction server: port " + std::to_string(want) + " is past 65535");
      listeners_.push_back(listenOnPort(options_.bindAddress, want, &port));
      ports_.push_back(port);
    }
  } catch (...) {
    for (int fd : listeners_) close(fd);
    throw;
  }
  std::lock_guard<std::mutex> g(mu_);
  for (int i = 0; i < options_.count; ++i) threads_.emplace_back([this, i] { acceptLoop(i); });
}

StandaloneServer::~StandaloneServer() { stop(); }

void StandaloneServer::stop() {
  if (stop_.exchange(true)) return;
  std::vector<std::thread> threads;
  // Threads may still be started by an accept loop until it sees stop_:
  // join until none is left.
  while (true) {
    {
      std::lock_guard<std::mutex> g(mu_);
      threads.swap(threads_);
    }
    if (threads.empty()) break;
    for (auto& t : threads) t.join();
    threads.clear();
  }
  for (int fd : listeners_) close(fd);
  listeners_.clear();
  std::lock_guard<std::mutex> g(mu_);
  for (auto& [key, s] : streams_) {
    for (int& fd : s->fds) {
      if (fd >= 0) close(fd);
      fd = -1;
    }
  }
  streams_.clear();
}

size_t StandaloneServer::streams() const {
  std::lock_guard<std::mutex> g(mu_);
  return streams_.size();
}

size_t StandaloneServer::threads() const {
  std::lock_guard<std::mutex> g(mu_);
  return threads_.size();
}

void StandaloneServer::reapThreads() {
  std::vector<std::thread> done;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (const auto id : finished_) {
      auto it = std::find_if(threads_.begin(), threads_.end(),
                             [id](const std::thread& t) { return t.get_id() == id; });
      if (it == threads_.end()) continue;  // stop() took it
      done.push_back(std::move(*it));
      threads_.erase(it);
    }
    finished_.clear();
  }
  for (auto& t : done) t.join();  // each has returned or is returning
}

void StandaloneServer::dropAbandonedStreamsLocked() {
  // A host that closed its end of a stream still waiting for hosts (its
  // group went on without this server, or died) will never serve in it,
  // so the stream can never be served. (Data a host sent early stays
  // queued for the serving loop: only the hang-up counts.)
  for (auto it = streams_.begin(); it != streams_.end();) {
    Stream& s = *it->second;
    const bool left = !s.serving && std::any_of(s.fds.begin(), s.fds.end(), [](int fd) {
      pollfd p{fd, POLLRDHUP, 0};
      return fd >= 0 && poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
    });
    if (!left) {
      ++it;
      continue;
    }
    for (int& fd : s.fds) {
      if (fd >= 0) close(fd);
      fd = -1;
    }
    it = streams_.erase(it);
  }
}

std::string StandaloneServer::lastError() const {
  std::lock_guard<std::mutex> g(mu_);
  return lastError_;
}

void StandaloneServer::noteError(const std::string& text) {
  refused_++;
  SMDDP_LOG(kWarn) << text;
  std::lock_guard<std::mutex> g(mu_);
  lastError_ = text;
}

void StandaloneServer::acceptLoop(int server) {
  while (!stop_.load()) {
    reapThreads();
    pollfd p{listeners_[server], POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    int fd = accept4(listeners_[server], nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) continue;
    setNoDelay(fd);
    boundSilence(fd, PeerMonitor::configuredSilence());  // a silent worker host
    std::lock_guard<std::mutex> g(mu_);
    if (stop_.load()) {
      close(fd);
      break;
    }
    threads_.emplace_back([this, server, fd] {
      handshake(server, fd);
      std::lock_guard<std::mutex> done(mu_);
      finished_.push_back(std::this_thread::get_id());
    });
  }
}

void StandaloneServer::handshake(int server, int fd) {
  const std::string who = "reduction server " + std::to_string(server);
  auto stopping = [this]() -> std::string { return stop_.load() ? "stopped" : ""; };
  auto refuse = [&](const std::string& why) {
    noteError(who + ": refused a connection: " + why);
    writeTextFrame(fd, errorFrame(), who + " refused the connection: " + why,
                   Clock::now() + std::chrono::seconds(1));
    close(fd);
  };
  // 1. The hello: a header and the job id, within 10 s of connecting.
  ServerFrame hello;
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  std::string why = readAllBefore(fd, &hello, sizeof(hello), deadline, stopping);
  if (!why.empty()) {
    if (why == "stopped") {
      close(fd);
    } else {
      refuse("no hello (" + why + ")");
    }
    return;
  }
  why = validateServerFrame(hello, {ServerFrameKind::kHello});
  if (!why.empty()) return refuse("a bad hello: " + why);
  std::string job(hello.payload, '\0');
  why = readAllBefore(fd, job.data(), job.size(), deadline, stopping);
  if (!why.empty()) return refuse("no job id (" + why + ")");
  if (!options_.job.empty() && job != options_.job) {
    return refuse("the worker belongs to job '" + job + "', this server serves job '" +
                  options_.job + "'");
  }
  // hello.server is the worker's index of this server in SMDDP_SERVER_HOSTS,
  // which spans every server process: not comparable with `server`, which
  // counts this process's listeners only.
  // 2. Join the stream; the host that completes it serves it.
  std::shared_ptr<Stream> stream;
  {
    std::lock_guard<std::mutex> g(mu_);
    dropAbandonedStreamsLocked();
    const uint64_t secret = hello.secret;  // copies: the frame is packed
    const int streamIndex = hello.stream;
    auto& s = streams_[std::make_tuple(server, secret, streamIndex)];
    if (!s) {
      s = std::make_shared<Stream>();
      s->hosts = hello.hosts;
      s->fds.assign(hello.hosts, -1);
      s->ranks.assign(hello.hosts, -1);
    }
    if (s->hosts != hello.hosts) {
      why = "host " + std::to_string(hello.host) + " says the group has " +
            std::to_string(hello.hosts) + " hosts, an earlier one said " + std::to_string(s->hosts);
    } else if (s->fds[hello.host] >= 0 || s->serving) {
      why = "host " + std::to_string(hello.host) + " of stream " + std::to_string(hello.stream) +
            " joined twice";
    } else {
      s->fds[hello.host] = fd;
      s->ranks[hello.host] = static_cast<int>(hello.seq);
      if (++s->joined == s->hosts) {
        s->serving = true;
        stream = s;
      }
    }
  }
  if (!why.empty()) return refuse(why);
  ServerFrame welcome;
  welcome.kind = static_cast<uint8_t>(ServerFrameKind::kWelcome);
  writeAllBefore(fd, &welcome, sizeof(welcome), Clock::now() + std::chrono::seconds(10));
  if (stream) serve(server, stream);
}

void StandaloneServer::serve(int server, std::shared_ptr<Stream> stream) {
  const int H = stream->hosts;
  const std::string who = "standalone reduction server " + std::to_string(server);
  std::vector<int> fds = stream->fds;
  auto name = [&](int h) {
    return "host " + std::to_string(h) + " (rank " + std::to_string(stream->ranks[h]) + ")";
  };
  // One event loop over the stream's H connections: it reads every host's
  // frames as they come, combines a step once every host's piece of it is
  // in, and sends results while it reads on. Nothing blocks on one host:
  // a worker that is busy sending step k+1 is not made to wait for this
  // server to finish sending it step k, and the next step is read while a
  // result is still on its way out.
  constexpr uint64_t kReadAhead = 64ull << 20;  // bytes of complete frames per host before it waits
  struct Frame {
    ServerFrame header;
    std::vector<uint8_t> payload;
  };
  struct Host {
    FrameReader reader;
    std::vector<uint8_t> reading;  // the payload being read
    std::deque<Frame> ready;
    uint64_t readyBytes = 0;
    FrameWriter out;  // results; each payload shared by every host's queue
    bool bye = false;  // read its goodbye: nothing follows but the close
  };
  std::vector<Host> in(H);
  std::vector<std::vector<uint8_t>> spare;  // payload buffers to reuse
  auto buffer = [&spare](uint64_t n) {
    std::vector<uint8_t> v;
    if (!spare.empty()) {
      v = std::move(spare.back());
      spare.pop_back();
    }
    v.resize(n);
    return v;
  };
  auto recycle = [&spare](std::vector<uint8_t>&& v) {
    if (spare.size() < 64) spare.push_back(std::move(v));
  };
  // Tells every host why this stream ends (after the rest of a result
  // frame already begun), then closes it.
  auto fail = [&](const std::string& why) {
    noteError(who + ": " + why);
    for (int h = 0; h < H; ++h) {
      const auto deadline = Clock::now() + std::chrono::seconds(1);
      if (!in[h].out.finishBefore(fds[h], deadline).empty()) continue;
      writeTextFrame(fds[h], errorFrame(), who + ": " + why, deadline);
    }
  };
  std::vector<const void*> inputs(H);
  std::vector<pollfd> polls(H);
  std::string failure;
  bool finished = false;
  auto broke = [&](int h, const std::string& why) {
    if (why == "closed") {
      failure = name(h) + " closed its connection without a goodbye (the worker died?)";
    } else if (why == "silent") {
      failure = name(h) + " went silent: nothing sent to it was acknowledged within "
                          "SMDDP_PEER_TIMEOUT";
    } else {
      failure = name(h) + "'s connection broke: " + why;
    }
  };
  // Reads what host h's socket holds, up to the read-ahead bound.
  auto readFrom = [&](int h) {
    Host& x = in[h];
    std::string why;
    while (failure.empty() && !x.bye && (x.ready.empty() || x.readyBytes < kReadAhead)) {
      const FrameIo io = x.reader.read(fds[h], &why);
      if (io == FrameIo::kAgain) return;
      if (io == FrameIo::kFailed) return broke(h, why);
      const ServerFrame& f = x.reader.header();
      if (io == FrameIo::kHeader) {
        why = validateServerFrame(f, {ServerFrameKind::kData, ServerFrameKind::kBye});
        if (!why.empty()) {
          failure = "a bad frame from " + name(h) + ": " + why;
          return;
        }
        if (f.kind == static_cast<uint8_t>(ServerFrameKind::kData)) {
          x.reading = buffer(f.payload);
          x.reader.payloadTo(x.reading.data());
        }
        continue;
      }
      x.readyBytes += x.reading.size();  // kDone
      x.bye = f.kind == static_cast<uint8_t>(ServerFrameKind::kBye);
      x.ready.push_back({f, std::move(x.reading)});
      x.reading = {};
      x.reader.next();
    }
  };
  auto sendTo = [&](int h) {
    Host& x = in[h];
    std::string why;
    while (failure.empty() && !x.out.empty()) {
      const FrameIo io = x.out.write(fds[h], &why);
      if (io == FrameIo::kFailed) return broke(h, why);
      if (io != FrameIo::kDone) return;
      auto sent = x.out.pop();
      if (sent.use_count() == 1) recycle(std::move(*sent));
    }
  };
  // Combines every step whose pieces are all in.
  auto combine = [&] {
    while (failure.empty()) {
      for (int h = 0; h < H; ++h) {
        if (in[h].ready.empty()) return;
      }
      // Every host said goodbye: the group shut down.
      int byes = 0;
      for (auto& x : in) byes += x.ready.front().header.kind == static_cast<uint8_t>(ServerFrameKind::kBye);
      if (byes == H) {
        finished = true;
        return;
      }
      if (byes) {
        failure = "some hosts left while others still sent data";
        return;
      }
      // Every host must send the same piece of the same call.
      for (int h = 1; h < H && failure.empty(); ++h) {
        std::string diff = samePiece(in[0].ready.front().header, in[h].ready.front().header);
        if (!diff.empty()) failure = name(0) + " and " + name(h) + " sent different pieces: " + diff;
      }
      if (!failure.empty()) return;
      // Combine in host order (bitwise the workers' own servers' result).
      const ServerFrame f = in[0].ready.front().header;
      auto result = std::make_shared<std::vector<uint8_t>>(buffer(f.payload));
      ServerFrame out = f;
      out.kind = static_cast<uint8_t>(ServerFrameKind::kResult);
      if (f.count) {
        for (int h = 0; h < H; ++h) inputs[h] = in[h].ready.front().payload.data();
        reduceOrdered(result->data(), inputs.data(), H, f.count,
                      static_cast<DataType>(f.dtype), static_cast<ReduceOp>(f.op),
                      static_cast<double>(f.divisor));
      }
      pieces_++;
      bytes_ += f.payload * H;
      for (int h = 0; h < H; ++h) {
        Host& x = in[h];
        x.readyBytes -= x.ready.front().payload.size();
        recycle(std::move(x.ready.front().payload));
        x.ready.pop_front();
        x.out.push(out, result->data(), result);
        sendTo(h);
      }
    }
  };
  while (failure.empty() && !finished && !stop_.load()) {
    for (int h = 0; h < H; ++h) {
      const Host& x = in[h];
      const bool reading = !x.bye && (x.ready.empty() || x.readyBytes < kReadAhead);
      const short events = static_cast<short>((reading ? POLLIN : 0) | (x.out.empty() ? 0 : POLLOUT));
      // No events, no fd: a closed socket would report POLLHUP at once.
      polls[h] = {events ? fds[h] : -1, events, 0};
    }
    if (poll(polls.data(), H, 100) <= 0) continue;
    for (int h = 0; h < H && failure.empty(); ++h) {
      if (polls[h].revents & POLLOUT) sendTo(h);
      if (polls[h].revents & (POLLIN | POLLHUP | POLLERR)) readFrom(h);
    }
    combine();
  }
  if (!failure.empty()) fail(failure);
  std::lock_guard<std::mutex> g(mu_);
  for (auto it = streams_.begin(); it != streams_.end(); ++it) {
    if (it->second == stream) {
      streams_.erase(it);
      break;
    }
  }
  for (int& fd : stream->fds) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
}

}  // namespace smddp
