#include "common/error.h"

namespace smddp {

const char* toString(ErrorKind k) {
  switch (k) {
    case ErrorKind::kInvalidArgument: return "invalid argument";
    case ErrorKind::kMismatch: return "collective mismatch";
    case ErrorKind::kTimeout: return "timeout";
    case ErrorKind::kPeerLost: return "peer lost";
    case ErrorKind::kTransport: return "transport error";
    case ErrorKind::kProtocol: return "protocol error";
    case ErrorKind::kAborted: return "aborted";
    case ErrorKind::kInternal: return "internal error";
  }
  return "error";
}

void throwError(ErrorKind kind, const std::string& msg) { throw Error(kind, msg); }

}  // namespace smddp
