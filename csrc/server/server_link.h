// A worker's connections to the standalone reduction servers
// (standalone_server.h; docs/design.md, "Standalone reduction servers").
// Host h's server rank for stream s (its server index on the host) holds one
// TCP connection to every server listed in SMDDP_SERVER_HOSTS; in each step
// of a multi-host fusion batch it posts one piece of its host partial to
// each server and takes the piece reduced over every host back. Nothing
// here blocks unless asked to (wait): a post queues its frame and sends
// what the socket takes, and progress() sends the rest and reads whatever
// results came back, so a worker keeps many steps in flight and never
// stops reading while it sends (a blocking send of step k+1 while the
// server blocks sending step k's result to this worker would deadlock
// once both directions' socket buffers fill). A server that dies closes
// its sockets: the next progress() fails at once with an error naming it.
// A server that cannot prove it holds the key (server_auth.h) is sent
// nothing but a challenge: not the hello, not a byte of data.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "server/server_auth.h"
#include "server/server_wire.h"

namespace smddp {

class ServerLinks {
 public:
  struct Identity {
    std::string job;     // SMDDP_SERVER_JOB
    uint64_t group = 0;  // serverGroupId of the group's secret
    int hosts = 0, host = 0, stream = 0, rank = 0;
    std::string key;           // the key shared with the servers (server_auth.h)
    bool integrity = false;    // SMDDP_SERVER_INTEGRITY: a MAC on every frame
    bool encrypt = false;      // SMDDP_WIRE_ENCRYPT: every frame encrypted (implies integrity)
    uint64_t maxPiece = kServerMaxPayload;  // the largest piece it will post, in bytes
  };
  // Connects to every server (retrying refusals: a server may start after
  // the workers), challenges it, says hello and waits for its welcome, all
  // within `wait` (each server gets at least a second to connect and five
  // to answer, however long an earlier one took). A server still
  // unreachable then (unresolvable, refused, silent, closed or busy before
  // it proved itself) is noted in unreachable(): the group decides together
  // whether it goes on without it (agreeOnServers). Throws an error naming
  // a server that failed authentication, refused the hello (another job,
  // another host count) or answered with garbage: those are a rogue server
  // or mistakes in the job's set-up, not failures to fail over.
  // `quick` (one flag per server, or empty): servers the group already
  // knows died (knownDown on some rank) get one attempt of about a second,
  // not `wait`: a group rebuilt after a server died (torchft's
  // reconfigure) goes on without it at once, and still takes back a
  // server started again at its address.
  ServerLinks(const std::vector<ServerAddress>& servers, const Identity& me,
              std::chrono::milliseconds wait, const std::vector<bool>& quick = {});
  ~ServerLinks();  // says goodbye and closes
  // Process-wide verdicts: a server whose connection failed during a step
  // (closed, silent) is down until a group of this process reaches it
  // again. Any thread.
  static bool knownDown(const ServerAddress& server);
  ServerLinks(const ServerLinks&) = delete;
  ServerLinks& operator=(const ServerLinks&) = delete;

  int count() const { return static_cast<int>(links_.size()); }
  // "standalone reduction server 1 (10.77.0.13:29500, SMDDP_SERVER_HOSTS[1])"
  // (or where else the list came from: ServerAddress::origin)
  // (k counts the servers in use; the name keeps its place in the list).
  std::string describe(int k) const;
  // Per server of the list: "" if reached, else why not (with its name).
  const std::vector<std::string>& unreachable() const { return unreachable_; }
  // Keeps the listed servers marked in `live` (one per server of the
  // list, each reached here) and says goodbye to the others; servers in
  // use are then counted 0..count()-1 in list order.
  void keep(const std::vector<bool>& live);

  // Queues the data frame `f` (payload from `data`) for server k and the
  // result it answers with, to land in `dst` (which may be `data`: the
  // server answers only once every host's piece, this one included, has
  // arrived). Sends what the socket takes now. `data` must stay valid
  // until sent and `dst` until received. Returns a ticket for received().
  uint64_t post(int k, const ServerFrame& f, const void* data, void* dst);
  // Sends and reads what the sockets allow, without blocking; true if any
  // byte moved. Throws an error naming the server on a closed connection,
  // a silent host (TCP_USER_TIMEOUT), an error frame or a result that is
  // not the piece expected next.
  bool progress();
  // Whether server k's result for the post that returned `ticket` is in.
  bool received(int k, uint64_t ticket) const { return links_[k].received > ticket; }
  // progress() until that result is in, waiting in poll slices of 100 ms;
  // throws "timed out" at `deadline`, or `stop`'s text when it returns one.
  void wait(int k, uint64_t ticket, std::chrono::steady_clock::time_point deadline,
            const WaitCheck& stop);
  // The results still awaited, for desync reports; "" if none.
  std::string waitingOn() const;
  // After a failed batch: frames it queued point into memory the caller
  // reuses, and the server's answers to them would land there. Drops them
  // and fails every later post with `why` (the stream is out of step with
  // the server's, and the group is broken anyway).
  void abandon(const std::string& why);

 private:
  struct Link {
    UniqueFd fd;
    FrameWriter out;  // data frames, payloads in the caller's memory
    // Results: read straight into their step's slot, or with a seal into
    // `staged` first, which lands in the slot once its tag checked.
    FrameReader in;
    PayloadBuffer staged;
    struct Expect {
      ServerFrame sent;
      uint8_t* dst = nullptr;
    };
    std::deque<Expect> expect;
    uint64_t posted = 0, received = 0;
    std::string errorText;  // an error frame's text, while it is read
    // SMDDP_SERVER_INTEGRITY: frames to the server, and from it (null: off).
    std::unique_ptr<FrameSeal> seal, check;
  };
  // The constructor's work for server i of the list: a link, or a note in
  // unreachable_; throws on a refusal or a failed authentication.
  void connectTo(int i, const Identity& me, std::chrono::steady_clock::time_point deadline);
  // Challenge and hello on a connected socket: "" and `l` set up, or why
  // not; a server that did not prove it holds the key throws.
  std::string handshake(int i, const Identity& me, Link& l,
                        std::chrono::steady_clock::time_point answerBy);
  // The handshake's last step: the server's welcome, or why not; throws on
  // a refusal.
  std::string welcome(Link& l, const std::string& name, bool encrypt,
                      std::chrono::steady_clock::time_point answerBy);
  bool send(int k);
  bool receive(int k);
  [[noreturn]] void fail(int k, const std::string& why, const std::string& during);
  std::vector<ServerAddress> servers_;  // the whole list
  std::vector<std::string> ips_;        // per server of the list
  std::vector<std::string> unreachable_;
  std::vector<int> listed_;             // per server in use: its place in the list
  std::vector<Link> links_;             // per server in use
  uint64_t group_ = 0;   // every data frame's (Identity::group)
  bool broken_ = false;  // no goodbye after a failure
  std::string abandoned_;
};

// Whether the group goes on without some standalone servers. Each rank
// gathers every rank's reachStatus() and takes the same verdict from them:
// a server any server rank could not reach is left out by every rank,
// unless `required` (SMDDP_SERVER_REQUIRED), which makes that an error, as
// is any rank's set-up error (a refusal). So every rank shards the same
// way, or every rank raises the same error.
std::string reachStatus(const std::string& error, const std::vector<std::string>& unreachable,
                        int servers);
struct ServerVerdict {
  std::string error;               // "" or why the group cannot be made
  std::vector<bool> live;          // per server of the list
  std::vector<std::string> why;    // per server left out: "rank R: ..." for each rank that
                                   // could not reach it, joined by "; "
  int inUse() const;
};
ServerVerdict agreeOnServers(const std::vector<std::string>& statuses, int servers, bool required);

}  // namespace smddp
