#include "common/process.h"

#include <fstream>
#include <string>

namespace smddp {

bool processExited(int64_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  if (!f.good()) return true;
  std::string line;
  std::getline(f, line);
  // The state follows the command name, which may itself hold ')'.
  const size_t p = line.rfind(')');
  if (p == std::string::npos || p + 2 >= line.size()) return false;
  const char state = line[p + 2];
  return state == 'Z' || state == 'X';
}

}  // namespace smddp
