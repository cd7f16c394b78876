// processExited (common/process.h) against what the kernel says of a
// child: alive while it runs, ended once it exits, before it is reaped
// (a zombie, which kill(pid, 0) still finds) and after.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "common/process.h"

using smddp::processExited;

namespace {

// Waits up to 5 s until /proc shows `pid` as a zombie: the child has
// exited and nobody reaped it.
bool becameZombie(pid_t pid) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < until) {
    siginfo_t info{};
    if (waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
        info.si_pid == pid) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

}  // namespace

TEST_CASE("processExited: alive, a zombie, reaped", "[process]") {
  CHECK_FALSE(processExited(getpid()));
  int go[2];
  REQUIRE(pipe(go) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // waits for a byte, then exits
    char c;
    close(go[1]);
    _exit(read(go[0], &c, 1) == 1 ? 0 : 1);
  }
  close(go[0]);
  CHECK_FALSE(processExited(child));  // blocked in read
  REQUIRE(write(go[1], "x", 1) == 1);
  close(go[1]);
  REQUIRE(becameZombie(child));
  CHECK(kill(child, 0) == 0);  // the kernel still finds it
  CHECK(processExited(child));
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(processExited(child));
}
