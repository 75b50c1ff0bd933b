// Thin TCP socket helpers: addresses, listen/connect, blocking I/O with a
// deadline (used during connection set-up).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace fairring {

using Clock = std::chrono::steady_clock;

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  Socket(Socket&& o) noexcept : fd_(o.release()) {}
  Socket& operator=(Socket&& o) noexcept;
  ~Socket() { close(); }

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void close();

  void set_nonblocking();
  void set_nodelay();
  // Blocking-with-deadline full transfers; throw on error, EOF or timeout.
  void send_all(const void* buf, size_t len, Clock::time_point deadline) const;
  void recv_all(void* buf, size_t len, Clock::time_point deadline) const;
  // "ip:port" of the remote end, for messages.
  std::string peer_name() const;

 private:
  int fd_ = -1;
};

// IPv4 address of network interface `ifname`; throws if it has none.
std::string interface_address(const std::string& ifname);
// An address of this machine that peers can reach: the hostname's address,
// preferring a non-loopback one.
std::string default_address();

// Listens on addr, port chosen by the kernel.
Socket listen_on(const std::string& addr, int* port_out);
// Connects, retrying while the peer is not listening yet, until the deadline.
// `between_tries` (if any) runs before each retry and may throw to end them
// (a peer that is known to have failed will not listen again).
Socket connect_to(const std::string& addr, int port, Clock::time_point deadline,
                  const std::function<void()>& between_tries = {});
// Closing a socket that holds unread bytes resets the connection, and a reset
// throws away what the peer has not read yet (our last message, an abort).
// So: end our stream on each of `fds`, then read and drop what still comes
// until each peer ends its own, or until `until`.  The caller closes them.
void end_streams(const std::vector<int>& fds, Clock::time_point until);

// The same for an "ip:port" string (as listeners publish theirs).
Socket connect_to(const std::string& addr_port, Clock::time_point deadline,
                  const std::function<void()>& between_tries = {});

}  // namespace fairring
