// One tagged RDM endpoint with its address vector and completion queue.
// Posting never blocks: a full queue returns -FI_EAGAIN and the caller
// progresses the CQ before retrying. Real failures throw. The engine owns
// one Endpoint per process group and drives it from a single thread.
#pragma once

#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_tagged.h>
#include <sys/uio.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "transport/fabric.h"
#include "transport/shm_owner.h"

namespace smddp {

struct Completion {
  void* context = nullptr;
  size_t len = 0;       // bytes received (recv) or sent
  uint64_t tag = 0;
  int err = 0;          // 0, or a positive FI_E* code
  size_t olen = 0;      // bytes that did not fit (FI_ETRUNC)
  std::string errText;  // provider's explanation when err != 0
};

class Endpoint {
 public:
  explicit Endpoint(std::shared_ptr<Fabric> fabric);
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  const std::string& provider() const { return fabric_->provider(); }
  // Opaque address bytes that peers insert into their AV.
  std::string name() const;
  // The numeric IP in that name when the provider addresses by socket
  // (tcp), else "": where this rank's liveness connections go
  // (peer_monitor.h), so they take the data's interface.
  std::string ipAddress() const;
  std::vector<fi_addr_t> insertPeers(const std::vector<std::string>& names);

  // 0 on success, -FI_EAGAIN when the queue is full; throws otherwise.
  int postSend(fi_addr_t dest, uint64_t tag, const iovec* iov, size_t iovCount, void* ctx);
  int postRecv(fi_addr_t src, uint64_t tag, uint64_t ignore, const iovec* iov, size_t iovCount,
               void* ctx);
  // Asks the provider to cancel a posted receive: 0 when the request was
  // accepted, else the negative fi_cancel code. Either way the receive's
  // buffer stays in use until its completion is read: FI_ECANCELED if the
  // cancel took, or the matching message's completion if the provider had
  // already matched it (shm, rxm then finish the transfer). Sends cannot be
  // cancelled on shm or rxm; never ask.
  int cancel(void* ctx);
  // Reads up to `max` completions, error entries included. Never blocks.
  size_t poll(Completion* out, size_t max);

  // Sends one message to itself and waits (up to `timeout`) for it: the
  // provider then holds what a first send costs. rxm over tcp allocates
  // its transmit pool there, 17 MB at our eager limit, whose first touch
  // took ~9 ms of a group's first call (spare_endpoints.h). Its own
  // address leaves the AV again. False if the message did not come back
  // in time: the caller closes the endpoint.
  bool warmUp(std::chrono::milliseconds timeout);

  // The provider's max_msg_size: the longest message, header included, it
  // carries (engine/sealed_frames.h's maxPayloadBytes turns it into a check).
  size_t maxMessageSize() const { return maxMsgSize_; }

 private:
  std::shared_ptr<Fabric> fabric_;
  std::shared_ptr<ShmOwner> shmOwner_;  // names the shm region; outlives ep_
  FidPtr<fid_av> av_;
  FidPtr<fid_cq> cq_;
  FidPtr<fid_ep> ep_;
  size_t maxMsgSize_ = 0;
};

}  // namespace smddp
