// The key file shared by the standalone reduction servers, their workers
// and the peer wire's pair keys (key_file.h).
#include "common/key_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/error.h"
#include "common/param.h"
#include "common/unique_fd.h"

namespace smddp {

SMDDP_PARAM_STRING(paramServerKeyFile, "SMDDP_SERVER_KEY_FILE", "",
                   "file holding the key shared by the standalone reduction servers and their "
                   "workers, and mixed into every group's pair keys on the peer wire (mode 0600; "
                   "every rank the same file; empty: servers use a key generated per job, "
                   "through the store they registered in)")
std::string serverKeyFileParam() { return paramServerKeyFile(); }

std::string readServerKeyFile(const std::string& path, const std::string& what) {
  auto bad = [&](const std::string& why) {
    throwError(ErrorKind::kInvalidArgument, what + "=" + path + ": " + why);
  };
  // O_NOFOLLOW is not used: a secrets volume (Kubernetes) mounts keys
  // through symbolic links. The checks below are on the file itself (fstat).
  // O_NONBLOCK: a FIFO at the path must fail the regular-file check below,
  // not block the open until some writer comes (it changes nothing for a
  // regular file's reads).
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!fd) bad(std::string("cannot open the key file: ") + strerror(errno));
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) bad(std::string("cannot stat the key file: ") + strerror(errno));
  if (!S_ISREG(st.st_mode)) bad("the key file is not a regular file");
  if (st.st_mode & 077) {
    char mode[8];
    snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    bad(std::string("the key file has mode ") + mode +
        ": others may read or change it (chmod 600 it)");
  }
  if (st.st_uid != geteuid() && st.st_uid != 0) {
    bad("the key file belongs to another user (uid " + std::to_string(st.st_uid) + ")");
  }
  constexpr size_t kMax = 4096;
  std::string key(kMax + 1, '\0');
  size_t got = 0;
  while (got < key.size()) {
    const ssize_t n = read(fd.get(), key.data() + got, key.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) bad(std::string("cannot read the key file: ") + strerror(errno));
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  key.resize(got);
  while (!key.empty() && (key.back() == '\n' || key.back() == '\r' || key.back() == ' ' ||
                          key.back() == '\t')) {
    key.pop_back();
  }
  if (key.size() > kMax) bad("the key file holds more than 4096 bytes");
  if (key.size() < 16) {
    bad("the key file holds " + std::to_string(key.size()) +
        " bytes; a key needs at least 16 (e.g. openssl rand -hex 32 > FILE)");
  }
  return key;
}

}  // namespace smddp
