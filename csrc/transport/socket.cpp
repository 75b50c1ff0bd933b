#include "transport/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "common/backoff.h"
#include "common/error.h"

namespace fairring {

namespace {

// A peer that does not listen yet is retried, backing off.
constexpr auto kConnectRetryFirst = std::chrono::milliseconds(5);
constexpr auto kConnectRetryCap = std::chrono::milliseconds(200);
[[noreturn]] void sys_fail(const std::string& what) {
  throw Error(ErrorKind::kBackend, "fairring: " + what + ": " + std::strerror(errno));
}

int ms_until(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(std::min<long long>(left, 1000000));
}

void wait_ready(int fd, short events, Clock::time_point deadline, const char* what) {
  for (;;) {
    struct pollfd p{fd, events, 0};
    int r = poll(&p, 1, ms_until(deadline));
    if (r > 0) return;
    if (r == 0) throw Error(ErrorKind::kBackend, std::string("fairring: Timed out while ") + what);
    if (errno != EINTR) sys_fail(what);
  }
}

sockaddr_in make_addr(const std::string& addr, int port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, addr.c_str(), &sa.sin_addr) != 1) {
    throw Error(ErrorKind::kBackend, "fairring: not an IPv4 address: '" + addr + "'");
  }
  return sa;
}
}  // namespace

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.release();
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void Socket::set_nonblocking() {
  int flags = fcntl(fd_, F_GETFL, 0);
  if (flags < 0 || fcntl(fd_, F_SETFL, flags | O_NONBLOCK) < 0) sys_fail("fcntl(O_NONBLOCK)");
}

void Socket::set_nodelay() {
  int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void Socket::send_all(const void* buf, size_t len, Clock::time_point deadline) const {
  auto* p = static_cast<const char*>(buf);
  while (len > 0) {
    wait_ready(fd_, POLLOUT, deadline, "sending during connection set-up");
    ssize_t n = ::send(fd_, p, len, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      sys_fail("send to " + peer_name());
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
}

void Socket::recv_all(void* buf, size_t len, Clock::time_point deadline) const {
  auto* p = static_cast<char*>(buf);
  while (len > 0) {
    wait_ready(fd_, POLLIN, deadline, "receiving during connection set-up");
    ssize_t n = ::recv(fd_, p, len, 0);
    if (n == 0) throw Error(ErrorKind::kBackend, "fairring: connection closed by " + peer_name());
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      sys_fail("recv from " + peer_name());
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
}

std::string Socket::peer_name() const {
  sockaddr_in sa{};
  socklen_t sl = sizeof(sa);
  if (getpeername(fd_, reinterpret_cast<sockaddr*>(&sa), &sl) != 0) return "?";
  char buf[INET_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET, &sa.sin_addr, buf, sizeof(buf));
  return std::string(buf) + ":" + std::to_string(ntohs(sa.sin_port));
}

std::string interface_address(const std::string& ifname) {
  struct ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) sys_fail("getifaddrs");
  std::string found;
  bool exists = false;
  for (auto* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_name == nullptr || ifname != it->ifa_name) continue;
    exists = true;
    if (it->ifa_addr != nullptr && it->ifa_addr->sa_family == AF_INET) {
      char buf[INET_ADDRSTRLEN] = {0};
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(it->ifa_addr)->sin_addr, buf, sizeof(buf));
      found = buf;
      break;
    }
  }
  freeifaddrs(list);
  if (found.empty()) {
    throw Error(ErrorKind::kInvalidArgument,
                exists ? "FAIRRING_SOCKET_IFNAME: interface '" + ifname + "' has no IPv4 address"
                       : "FAIRRING_SOCKET_IFNAME: no network interface named '" + ifname + "'");
  }
  return found;
}

std::string default_address() {
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) return "127.0.0.1";
  struct addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* res = nullptr;
  if (getaddrinfo(host, nullptr, &hints, &res) != 0 || res == nullptr) return "127.0.0.1";
  std::string loopback, other;
  for (auto* it = res; it != nullptr; it = it->ai_next) {
    char buf[INET_ADDRSTRLEN] = {0};
    auto* sa = reinterpret_cast<sockaddr_in*>(it->ai_addr);
    inet_ntop(AF_INET, &sa->sin_addr, buf, sizeof(buf));
    bool is_loop = (ntohl(sa->sin_addr.s_addr) >> 24) == 127;
    if (is_loop && loopback.empty()) loopback = buf;
    if (!is_loop && other.empty()) other = buf;
  }
  freeaddrinfo(res);
  if (!other.empty()) return other;
  // The hostname maps to loopback only (common on Debian: 127.0.1.1), which
  // peers on other machines cannot reach: take an interface that is up.
  struct ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    for (auto* it = list; it != nullptr; it = it->ifa_next) {
      if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET) continue;
      if ((it->ifa_flags & IFF_UP) == 0 || (it->ifa_flags & IFF_LOOPBACK) != 0) continue;
      char buf[INET_ADDRSTRLEN] = {0};
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(it->ifa_addr)->sin_addr, buf, sizeof(buf));
      other = buf;
      break;
    }
    freeifaddrs(list);
  }
  return !other.empty() ? other : (!loopback.empty() ? loopback : "127.0.0.1");
}

Socket listen_on(const std::string& addr, int* port_out) {
  Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) sys_fail("socket");
  int one = 1;
  setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in sa = make_addr(addr, 0);
  if (bind(s.fd(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) sys_fail("bind to " + addr);
  if (listen(s.fd(), 128) != 0) sys_fail("listen");
  socklen_t sl = sizeof(sa);
  if (getsockname(s.fd(), reinterpret_cast<sockaddr*>(&sa), &sl) != 0) sys_fail("getsockname");
  *port_out = ntohs(sa.sin_port);
  return s;
}

Socket connect_to(const std::string& addr, int port, Clock::time_point deadline,
                  const std::function<void()>& between_tries) {
  sockaddr_in sa = make_addr(addr, port);
  Backoff backoff(kConnectRetryFirst, kConnectRetryCap);
  for (;;) {
    Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!s.valid()) sys_fail("socket");
    if (::connect(s.fd(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0) return s;
    int err = errno;
    if (Clock::now() >= deadline) {
      errno = err;
      sys_fail("connect to " + addr + ":" + std::to_string(port));
    }
    if (err != ECONNREFUSED && err != EINTR && err != ETIMEDOUT && err != EAGAIN) {
      errno = err;
      sys_fail("connect to " + addr + ":" + std::to_string(port));
    }
    if (between_tries) between_tries();
    backoff.sleep();
  }
}

Socket connect_to(const std::string& addr_port, Clock::time_point deadline,
                  const std::function<void()>& between_tries) {
  const size_t colon = addr_port.rfind(':');
  if (colon == std::string::npos) throw Error(ErrorKind::kBackend, "fairring: malformed address " + addr_port);
  return connect_to(addr_port.substr(0, colon), std::stoi(addr_port.substr(colon + 1)), deadline, between_tries);
}

void end_streams(const std::vector<int>& fds, Clock::time_point until) {
  std::vector<int> open;
  for (int fd : fds) {
    if (::shutdown(fd, SHUT_WR) == 0) open.push_back(fd);
  }
  std::vector<char> scratch(64 << 10);
  while (!open.empty() && Clock::now() < until) {
    std::vector<struct pollfd> pfds;
    for (int fd : open) pfds.push_back({fd, POLLIN, 0});
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    if (poll(pfds.data(), pfds.size(), static_cast<int>(std::max<long long>(left, 1))) <= 0) continue;
    std::vector<int> still;
    for (const auto& p : pfds) {
      if (p.revents == 0) {
        still.push_back(p.fd);
        continue;
      }
      const ssize_t r = recv(p.fd, scratch.data(), scratch.size(), MSG_DONTWAIT);
      if (r > 0 || (r < 0 && (errno == EAGAIN || errno == EINTR))) still.push_back(p.fd);
      // 0: the peer's end of stream; < 0: the connection is gone anyway.
    }
    open.swap(still);
  }
}

}  // namespace fairring
