// The key file (SMDDP_SERVER_KEY_FILE, --key-file): shared by the
// standalone reduction servers and their workers (server/server_auth.h),
// and mixed into the peer wire's pair keys (transport/peer_keys.h), so it
// lives below both.
#pragma once

#include <string>

namespace smddp {

// A key file: a regular file of 16 to 4096 bytes (trailing blanks and line
// breaks are not part of the key) that its owner alone may read (mode 0600
// or 0400). Throws kInvalidArgument naming `what` (the variable or option
// that named it) and the path; the key itself is never in a message.
std::string readServerKeyFile(const std::string& path, const std::string& what);
// SMDDP_SERVER_KEY_FILE ("" when unset).
std::string serverKeyFileParam();

}  // namespace smddp
