// One accepted connection of a standalone reduction server, counted while
// it is open: the server bounds its connections (SMDDP_SERVER_MAX_CONNECTIONS)
// through this count, whichever of its threads holds the connection, and
// however it ends (closed by whoever holds it last).
#pragma once

#include <atomic>
#include <cstdint>
#include <utility>

#include "common/unique_fd.h"

namespace smddp {

class ServerConnection {
 public:
  ServerConnection() = default;
  ServerConnection(int fd, std::atomic<int64_t>* open) : fd_(fd), open_(open) {
    if (fd_) open_->fetch_add(1);
  }
  ~ServerConnection() { reset(); }
  ServerConnection(ServerConnection&& o) noexcept
      : fd_(std::move(o.fd_)), open_(std::exchange(o.open_, nullptr)) {}
  ServerConnection& operator=(ServerConnection&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::move(o.fd_);
      open_ = std::exchange(o.open_, nullptr);
    }
    return *this;
  }
  int fd() const { return fd_.get(); }
  explicit operator bool() const { return static_cast<bool>(fd_); }
  void reset() {
    if (fd_) open_->fetch_sub(1);
    fd_.reset();
  }

 private:
  UniqueFd fd_;
  std::atomic<int64_t>* open_ = nullptr;
};

}  // namespace smddp
