// Errors raised by the torch-free core. Each carries a kind so the backend
// can map it onto the right Python exception, and a message that names the
// collective, the peer and the problem.
#pragma once

#include <stdexcept>
#include <string>

namespace smddp {

enum class ErrorKind {
  kInvalidArgument,  // bad input from the caller (dtype, size, layout, env var)
  kMismatch,         // ranks disagree on a collective's shape, dtype or op
  kTimeout,          // a bounded wait ran out
  kPeerLost,         // a peer died or its connection broke
  kTransport,        // libfabric reported a failure
  kProtocol,         // a malformed or foreign frame
  kAborted,          // the group was aborted or shut down
  kInternal,
};

const char* toString(ErrorKind k);

// Whether an error of this kind leaves the group unusable (every later
// call fails with it), not just the call it ended.
inline bool breaksGroup(ErrorKind k) {
  return k == ErrorKind::kTimeout || k == ErrorKind::kPeerLost || k == ErrorKind::kTransport ||
         k == ErrorKind::kAborted;
}

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& msg)
      : std::runtime_error(msg), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

[[noreturn]] void throwError(ErrorKind kind, const std::string& msg);

}  // namespace smddp

#define SMDDP_CHECK(cond, kind, msg)                                   \
  do {                                                                 \
    if (!(cond)) ::smddp::throwError(::smddp::ErrorKind::kind, (msg)); \
  } while (0)
