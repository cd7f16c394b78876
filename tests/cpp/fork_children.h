// Runs functions in forked children under a hard deadline and collects
// their verdicts ("" = fine). The harnesses that need whole processes
// (world.h's ranks, transport_harness.h's pairs, the spare endpoints'
// exit handler) share it: a child that throws, dies or hangs becomes a
// verdict that names it, so it fails its test instead of the suite.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace smddp::test {

// Child i runs fn(i, dir); `dir` is a fresh directory all of them share
// (for a FileBootstrap, or flags between them) and that goes afterwards.
using ChildFn = std::function<std::string(int child, const std::string& dir)>;

// How a child ends once it has written its verdict.
enum class ChildExit {
  kQuick,         // _exit(0): skips the parent's atexit handlers and Catch's state
  kExitHandlers,  // exit(0): the process's exit handlers run, and a crash there shows
};

// The verdicts of `n` children, in order. A child that has not ended by
// `hardDeadline` is SIGKILLed and reported as hung; one that threw, or died
// before writing its verdict, or ended with a non-zero status after
// writing it, is reported as such.
inline std::vector<std::string> runChildren(int n, const ChildFn& fn,
                                            std::chrono::milliseconds hardDeadline,
                                            ChildExit how = ChildExit::kQuick) {
  using Clock = std::chrono::steady_clock;
  char tmpl[] = "/tmp/smddp-children-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const auto resultPath = [&](int i) { return dir + "/result." + std::to_string(i); };
  std::fflush(nullptr);  // a child's exit() must not print the runner's buffered output again
  std::vector<pid_t> pids(n);
  for (int i = 0; i < n; ++i) {
    pids[i] = fork();
    if (pids[i] != 0) continue;
    std::string result;
    try {
      result = fn(i, dir);
    } catch (const std::exception& e) {
      result = "child " + std::to_string(i) + " threw: " + e.what();
    }
    std::ofstream(resultPath(i)) << result;
    if (how == ChildExit::kExitHandlers) std::exit(0);
    _exit(0);
  }
  std::vector<std::string> out(n);
  std::vector<bool> reaped(n, false);
  int remaining = n;
  const auto deadline = Clock::now() + hardDeadline;
  while (remaining > 0) {
    for (int i = 0; i < n; ++i) {
      int status = 0;
      if (reaped[i] || waitpid(pids[i], &status, WNOHANG) != pids[i]) continue;
      reaped[i] = true;
      --remaining;
      std::ifstream f(resultPath(i));
      std::stringstream ss;
      ss << f.rdbuf();
      const std::string ended = "status " + std::to_string(status);
      if (!f.good()) {
        out[i] = "child " + std::to_string(i) + " died (" + ended + ")";
      } else {
        out[i] = ss.str();
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) out[i] += " (child ended with " + ended + ")";
      }
    }
    if (remaining > 0 && Clock::now() > deadline) {
      for (int i = 0; i < n; ++i) {
        if (reaped[i]) continue;
        kill(pids[i], SIGKILL);
        waitpid(pids[i], nullptr, 0);
        reaped[i] = true;
        out[i] = "child " + std::to_string(i) + " hung and was killed";
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  return out;
}

}  // namespace smddp::test
