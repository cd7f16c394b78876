// The group's asynchronous error, as torchft and c10d's Backend::getError
// read it: the first failure of a call that leaves the group unusable (a
// timeout, a lost peer, a transport or protocol failure, an abort). Every
// Work's completion passes its error through note(), on whatever thread
// completes it; a mismatch or a bad argument fails only its own call and
// is not recorded.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <exception>
#include <mutex>
#include <optional>
#include <string>

#include "common/error.h"

namespace c10d_smddp {

class AsyncError {
 public:
  void note(const std::exception_ptr& e) {
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const smddp::Error& err) {
      if (err.kind() == smddp::ErrorKind::kMismatch ||
          err.kind() == smddp::ErrorKind::kInvalidArgument) {
        return;
      }
      record(err.kind(), err.what());
    } catch (...) {
      // torch errors (a staged copy that failed) are the caller's own.
    }
  }
  void record(smddp::ErrorKind kind, const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    if (message_) return;  // the first cause wins
    kind_ = kind;
    message_ = what;
  }
  std::optional<std::string> message() const {
    std::lock_guard<std::mutex> lock(mu_);
    return message_;
  }
  c10d::ErrorType type() const {
    std::lock_guard<std::mutex> lock(mu_);
    if (!message_) return c10d::ErrorType::SUCCESS;
    return kind_ == smddp::ErrorKind::kTimeout ? c10d::ErrorType::TIMEOUT
                                               : c10d::ErrorType::COMM_ERROR;
  }

 private:
  mutable std::mutex mu_;
  smddp::ErrorKind kind_ = smddp::ErrorKind::kInternal;  // guarded by mu_
  std::optional<std::string> message_;                    // guarded by mu_
};

}  // namespace c10d_smddp
