// Network helpers. Torch-free.
#pragma once

#include <string>

namespace trainer {

// A TCP port that was free a moment ago (bound with port 0, then released). Throws
// std::system_error when the operating system refuses a socket.
int free_port();

// Whether a TCP connection to host:port succeeds before `timeout_s` seconds have passed, trying
// again every 100 ms while it is refused (a server not yet listening) and resolving `host` each
// time. Opens and closes each connection; never waits past the deadline.
bool wait_for_listener(const std::string& host, int port, double timeout_s);

// This machine's host name (gethostname); `fallback` when it has none.
std::string host_name(const std::string& fallback);

// The local address (numeric) of the interface this machine reaches `host`:`port` through, found
// by connecting a UDP socket (nothing is sent); "" when `host` does not resolve or no route
// leads there.
std::string local_address_toward(const std::string& host, int port);

// Whether `host` names this machine's loopback interface (localhost, 127.0.0.0/8, ::1).
bool is_loopback(const std::string& host);

}  // namespace trainer
