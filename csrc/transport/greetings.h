// Reading the fixed-size greeting every accepted connection must send first,
// from many connections at once, each with its own deadline: a client that
// connects and stays silent (or a flood of them) holds up no real peer's
// admission.  Used by the rails' mesh (TcpMesh) and the reduction server,
// each with its own greeting struct and its own admit/refuse.
#pragma once

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "transport/socket.h"

namespace fairring {

template <typename Hello>
class GreetingReader {
 public:
  using Clock = std::chrono::steady_clock;
  // `admit` takes a connection whose greeting is whole; `refuse(from, why)`
  // is told of each connection dropped (`from`: its address).
  using Admit = std::function<void(Socket, const Hello&, const std::string& from)>;
  using Refuse = std::function<void(const std::string& from, const std::string& why)>;

  // At most `max_pending` connections wait for their greeting; beyond, the
  // oldest is dropped (a silent flood cannot keep a peer that greets at once
  // out).
  GreetingReader(size_t max_pending, std::chrono::seconds timeout, Admit admit, Refuse refuse)
      : max_pending_(max_pending), timeout_(timeout), admit_(std::move(admit)), refuse_(std::move(refuse)) {}

  // The pollfds to wait on: the listener's first, then each waiting connection's.
  void fill(std::vector<struct pollfd>& fds, int listener_fd) const {
    fds.assign(1, {listener_fd, POLLIN, 0});
    for (const auto& p : pending_) fds.push_back({p.socket.fd(), POLLIN, 0});
  }

  // After a poll() on fill()'s fds: reads what came, admits whole greetings,
  // drops the closed and the late, and accepts a new connection.
  void step(const std::vector<struct pollfd>& fds, int listener_fd) {
    const auto now = Clock::now();
    std::vector<Pending> still;
    for (size_t i = 0; i < pending_.size(); ++i) {
      Pending& p = pending_[i];
      if (fds[i + 1].revents != 0) {
        const ssize_t r =
            recv(p.socket.fd(), reinterpret_cast<char*>(&p.hello) + p.got, sizeof(Hello) - p.got, MSG_DONTWAIT);
        if (r > 0) p.got += static_cast<size_t>(r);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
          refuse_(p.from, "closed the connection before its greeting");
          continue;
        }
      }
      if (p.got == sizeof(Hello)) {
        admit_(std::move(p.socket), p.hello, p.from);
        continue;
      }
      if (now > p.deadline) {
        refuse_(p.from, "sent no greeting within " + std::to_string(timeout_.count()) + " s");
        continue;
      }
      still.push_back(std::move(p));
    }
    pending_.swap(still);
    if (fds[0].revents & POLLIN) {
      Socket s(accept4(listener_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (!s.valid()) return;
      std::string from = s.peer_name();
      if (pending_.size() >= max_pending_) {
        refuse_(pending_.front().from, "dropped: too many connections waiting to greet");
        pending_.erase(pending_.begin());
      }
      pending_.push_back(Pending{std::move(s), std::move(from), now + timeout_});
    }
  }

 private:
  struct Pending {
    Socket socket;
    std::string from;
    Clock::time_point deadline;
    Hello hello{};
    size_t got = 0;
  };
  const size_t max_pending_;
  const std::chrono::seconds timeout_;
  Admit admit_;
  Refuse refuse_;
  std::vector<Pending> pending_;
};

}  // namespace fairring
