// ListenFailure: probes a listening address with a plain socket.
#include "comm/listen_address.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace dlrm::comm {
namespace {

// "" when `address` can be bound now, else why not (strerror, first letter
// lowercased, or the resolver's error).
std::string BindReason(const std::string& address) {
  if (address.starts_with("unix:")) return "";
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return "not HOST:PORT";
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const int resolved = getaddrinfo(host.empty() ? nullptr : host.c_str(),
                                   port.c_str(), &hints, &found);
  if (resolved != 0) return gai_strerror(resolved);
  std::string reason;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) {
      reason = std::strerror(errno);
      continue;
    }
    const int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    const bool bound =
        bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 1) == 0;
    if (!bound) reason = std::strerror(errno);
    close(fd);
    if (!bound) break;
  }
  freeaddrinfo(found);
  if (!reason.empty()) {
    reason[0] =
        static_cast<char>(std::tolower(static_cast<unsigned char>(reason[0])));
  }
  return reason;
}

}  // namespace

absl::Status ListenFailure(const std::string& flag,
                           const std::string& address) {
  std::string reason = BindReason(address);
  if (reason.empty()) reason = "the listener could not bind it";
  return absl::UnavailableError(absl::StrCat(flag, " ", address, ": ", reason));
}

}  // namespace dlrm::comm
