// Names the calling thread (as `top -H`, gdb and /proc/<pid>/task/*/comm
// show it), so that a thread left behind says whose it is. Linux keeps 15
// characters.
#pragma once

#include <pthread.h>

namespace smddp {

inline void nameThisThread(const char* name) { pthread_setname_np(pthread_self(), name); }

}  // namespace smddp
