#include "server/server_handshake.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace smddp {

ServerHandshake::ServerHandshake(ServerConnection conn, const ServerIdentity& identity,
                                 Clock::time_point deadline, std::string source)
    : conn_(std::move(conn)), identity_(identity), source_(std::move(source)),
      started_(Clock::now()), deadline_(deadline) {}

ServerHandshake::~ServerHandshake() { wipe(shared_); }

short ServerHandshake::events() const { return phase_ == Phase::kAnswer ? POLLOUT : POLLIN; }

ServerHandshake::State ServerHandshake::fail(const std::string& why, const std::string& refusal) {
  why_ = misdialled_.empty() ? why : why + " (" + misdialled_ + ")";
  refusal_ = refusal;
  return State::kFailed;
}

ServerHandshake::State ServerHandshake::step() {
  if (Clock::now() >= deadline_) {
    return fail(phase_ == Phase::kHello ? "no hello in time" : "no challenge in time", "");
  }
  if (phase_ == Phase::kAnswer) {
    const ssize_t k = ::send(conn_.fd(), outbox_.data(), outbox_.size(),
                             MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return State::kGoing;
    if (k <= 0) return fail("the connection closed during the handshake", "");
    outbox_.erase(0, static_cast<size_t>(k));
    if (!outbox_.empty()) return State::kGoing;
    phase_ = Phase::kHello;
  }
  // Both frames it reads are short: a nonce and a share, or a proof; an
  // address, a job id.
  const uint64_t most = kServerProofBytes + kServerShareBytes + kServerMaxAddress + kServerMaxJob;
  const auto kind = phase_ == Phase::kChallenge ? ServerFrameKind::kChallenge
                                                : ServerFrameKind::kHello;
  std::string why;
  while (true) {
    const FrameIo io = reader_.read(conn_.fd(), &why);
    if (io == FrameIo::kAgain) return State::kGoing;
    if (io == FrameIo::kFailed) return fail("the connection " + why + " during the handshake", "");
    if (io == FrameIo::kHeader) {
      why = validateServerFrame(reader_.header(), {kind});
      if (why.empty() && reader_.header().payload > most) why = "an oversized handshake frame";
      if (!why.empty()) return fail("a bad " + std::string(toString(kind)) + ": " + why, why);
      payload_.assign(reader_.header().payload, '\0');
      reader_.payloadTo(reinterpret_cast<uint8_t*>(payload_.data()));
      continue;
    }
    reader_.next();  // kDone
    return phase_ == Phase::kChallenge ? onChallenge() : onHello();
  }
}

ServerHandshake::State ServerHandshake::onChallenge() {
  std::memcpy(worker_.bytes, payload_.data(), kNonceBytes);
  workerShare_ = payload_.substr(kNonceBytes, kServerShareBytes);
  const uint64_t addressBytes = reader_.header().count;  // validated: fits the payload
  dialled_ = payload_.substr(kNonceBytes + kServerShareBytes, addressBytes);
  const std::string job = payload_.substr(kNonceBytes + kServerShareBytes + addressBytes);
  share_ = x25519KeyPair();
  try {
    shared_ = x25519SharedSecret(share_.privateKey, workerShare_, "the worker's challenge");
  } catch (const std::exception& e) {
    return fail(std::string("a bad challenge: ") + e.what(), "a bad challenge: its key share");
  }
  // This server proves itself only as itself: the address the connection
  // reached (or one it was told it is reached at), the job it serves. A
  // worker that dialled something else (a relay that forwards its
  // challenge here, a name pointing elsewhere) or serves another job gets
  // a proof under another key, which it refuses; nothing is refused here,
  // so nobody without the key learns which it was.
  const std::string reached = socketEndpoint(conn_.fd(), /*local=*/true);
  const auto& ads = identity_.advertised;
  std::string address = dialled_;
  if (dialled_ != reached && std::find(ads.begin(), ads.end(), dialled_) == ads.end()) {
    misdialled_ = "the worker dialled " + dialled_ + ", not this server's " + reached +
                  " (a relay, or an address missing from --advertise)";
    address = reached;
  }
  key_ = serverIdentityKey(identity_.key, identity_.job.empty() ? job : identity_.job, address);
  server_ = Nonce::random();
  const Mac proof = proofs().serverProof();
  ServerFrame answer;
  answer.kind = static_cast<uint8_t>(ServerFrameKind::kAnswer);
  answer.payload = kServerAnswerBytes;
  outbox_.assign(reinterpret_cast<const char*>(&answer), sizeof(answer));
  outbox_.append(reinterpret_cast<const char*>(server_.bytes), kNonceBytes);
  outbox_.append(share_.publicKey);
  outbox_.append(reinterpret_cast<const char*>(proof.bytes), kMacBytes);
  phase_ = Phase::kAnswer;
  return step();
}

ServerHandshake::State ServerHandshake::onHello() {
  hello_ = reader_.header();
  job_ = payload_.substr(kServerProofBytes);
  const Mac want = proofs().workerProof(hello_, job_);
  if (!macEquals(want, reinterpret_cast<const uint8_t*>(payload_.data()))) {
    // Nothing about this server or its key in the answer: only that the
    // worker did not prove it holds the same key.
    return fail("a worker failed authentication (its proof does not match this server's key)",
                "authentication failed: the hello does not prove the worker holds this "
                "server's key (SMDDP_SERVER_KEY_FILE, or the job's store key)");
  }
  return State::kDone;
}

}  // namespace smddp
