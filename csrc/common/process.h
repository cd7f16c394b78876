#pragma once

// Whether another process on this machine has ended.
#include <cstdint>

namespace smddp {

// True when /proc says process `pid` is gone, or has ended and waits to
// be reaped (a zombie, which kill(pid, 0) still finds). Only for a pid of
// this process's PID namespace.
bool processExited(int64_t pid);

}  // namespace smddp
