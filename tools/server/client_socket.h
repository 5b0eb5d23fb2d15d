// Noticing that the client of a request has gone away while its handler waits for a job: the
// HTTP library does not hand handlers their socket, so the socket is found by its peer address.
#pragma once

#include <string>

namespace klein::server {

// The fd of this process's TCP connection with the given local port and peer address/port, or -1.
int find_connection_fd(int local_port, const std::string& peer_addr, int peer_port);
// True when the peer of `fd` has closed or reset the connection (never blocks).
bool peer_closed(int fd);

}  // namespace klein::server
