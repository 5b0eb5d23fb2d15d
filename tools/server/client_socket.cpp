#include "client_socket.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>
#include <cstring>

namespace klein::server {

namespace {
bool address_of(const sockaddr_storage& sa, socklen_t len, std::string* addr, int* port) {
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&sa), len, host, sizeof host, serv, sizeof serv,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  *addr = host;
  *port = std::atoi(serv);
  return true;
}
}  // namespace

int find_connection_fd(int local_port, const std::string& peer_addr, int peer_port) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int found = -1;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0') continue;
    sockaddr_storage sa{};
    socklen_t len = sizeof sa;
    std::string addr;
    int port = -1;
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&sa), &len) != 0) continue;
    if (!address_of(sa, len, &addr, &port) || port != peer_port || addr != peer_addr) continue;
    len = sizeof sa;
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&sa), &len) != 0) continue;
    if (!address_of(sa, len, &addr, &port) || port != local_port) continue;
    found = static_cast<int>(fd);
    break;
  }
  closedir(d);
  return found;
}

bool peer_closed(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  // Readable: either the next pipelined request (still there) or end of stream (gone).
  char c;
  const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0;
}

}  // namespace klein::server
