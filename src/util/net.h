// Network helpers. Torch-free.
#pragma once

namespace trainer {

// A TCP port that was free a moment ago (bound with port 0, then released). Throws
// std::system_error when the operating system refuses a socket.
int free_port();

}  // namespace trainer
