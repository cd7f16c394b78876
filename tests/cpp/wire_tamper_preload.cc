// An on-path rewrite of the peer wire, for tests/python/test_wire_encrypt.py:
// an LD_PRELOAD library that changes one byte of what a rank's libfabric
// (the tcp provider) hands the kernel, after the rank sealed it. It wraps
// send() and sendmsg(). While the file named by SMDDP_TAMPER_ARM exists,
// the next call of at least SMDDP_TAMPER_MIN_BYTES bytes (default 65536)
// in one buffer removes that file and flips one byte in the middle of its
// largest buffer, in place (a partial write resends the rest of the same
// buffer, so the flip goes out either way). One flip per arming: a rank
// arms it, makes one large send, and its peer must see the change.
#include <dlfcn.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>

namespace {

using SendFn = ssize_t (*)(int, const void*, size_t, int);
using SendmsgFn = ssize_t (*)(int, const msghdr*, int);

size_t minBytes() {
  static const size_t n = [] {
    const char* v = std::getenv("SMDDP_TAMPER_MIN_BYTES");
    return v ? static_cast<size_t>(std::strtoull(v, nullptr, 10)) : size_t{65536};
  }();
  return n;
}

// True once per arming: unlink() lets one caller, of any thread, take it.
bool claim(size_t bytes) {
  static const char* armFile = std::getenv("SMDDP_TAMPER_ARM");
  return armFile != nullptr && bytes >= minBytes() && unlink(armFile) == 0;
}

void flip(const void* base, size_t len) {
  static_cast<unsigned char*>(const_cast<void*>(base))[len / 2] ^= 0x5a;
}

}  // namespace

extern "C" ssize_t send(int fd, const void* buf, size_t len, int flags) {
  static const auto real = reinterpret_cast<SendFn>(dlsym(RTLD_NEXT, "send"));
  if (claim(len)) flip(buf, len);
  return real(fd, buf, len, flags);
}

extern "C" ssize_t sendmsg(int fd, const msghdr* msg, int flags) {
  static const auto real = reinterpret_cast<SendmsgFn>(dlsym(RTLD_NEXT, "sendmsg"));
  size_t largest = 0;
  for (size_t i = 1; i < msg->msg_iovlen; ++i) {
    if (msg->msg_iov[i].iov_len > msg->msg_iov[largest].iov_len) largest = i;
  }
  if (msg->msg_iovlen > 0 && claim(msg->msg_iov[largest].iov_len)) {
    flip(msg->msg_iov[largest].iov_base, msg->msg_iov[largest].iov_len);
  }
  return real(fd, msg, flags);
}
