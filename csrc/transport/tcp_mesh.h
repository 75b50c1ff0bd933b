// TCP connections between a rank and its rail peers.  Every rank listens;
// every rank connects once to each peer (its "client" link: it sends shards to
// the peer's reduction server and gets results back) and accepts one link from
// each peer (its "server" link).  A peer proves it belongs to the process group
// with a secret shared through the store before anything else is accepted.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport/socket.h"

namespace c10d {
class Store;
}

namespace fairring {

using Secret = std::array<uint8_t, 32>;

// The first bytes a connecting peer sends.
struct Hello {
  char magic[8];
  int32_t rank;  // the peer's rank in the group
  uint32_t reserved;
  uint8_t secret[32];
};

class TcpMesh {
 public:
  // Starts listening for `peers` (group ranks) and publishes this rank's
  // address in the store.
  TcpMesh(c10::intrusive_ptr<c10d::Store> store, int rank, std::vector<int> peers, const Secret& secret,
          const std::string& ifname, std::chrono::milliseconds timeout);
  ~TcpMesh();

  // Connects to every peer and waits for each to connect back.
  void connect();

  // Available after connect(); each taken once.
  Socket take_client(int peer) { return std::move(clients_.at(peer)); }
  Socket take_server(int peer) { return std::move(servers_.at(peer)); }

  std::string listen_address() const { return address_ + ":" + std::to_string(port_); }

 private:
  void accept_loop();
  // Keeps the connection if the greeting is right and from an expected peer.
  void admit(Socket socket, const Hello& hello, const std::string& from);
  void log_rejection(const std::string& from, const std::string& why);
  // Reports how many rejections the debug log's rate limit left out.
  void log_suppressed(bool force);

  c10::intrusive_ptr<c10d::Store> store_;
  int rank_;
  Secret secret_;
  std::chrono::milliseconds timeout_;
  std::string address_;
  int port_ = 0;
  Socket listener_;
  std::thread acceptor_;
  std::atomic<bool> stop_{false};
  // Acceptor thread only.  Each rejected connection is logged once: the
  // first always, the others with FAIRRING_DEBUG=1 at most kRejectionLines a
  // second; those beyond are counted and reported in one line.
  uint64_t rejections_ = 0;
  std::chrono::steady_clock::time_point log_window_{};
  int logged_in_window_ = 0;
  uint64_t suppressed_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  const std::vector<int> expected_;  // peers allowed to connect
  std::map<int, Socket> servers_;
  std::map<int, Socket> clients_;
};

// Whether two 32-byte secrets are equal, in constant time: a wrong guess
// takes as long as a near miss.
bool same_secret(const uint8_t* a, const uint8_t* b);

// A random secret (from the kernel's generator).
Secret random_secret();
// A random id of `bytes` bytes as hex, for names that must not collide
// between jobs or groups (shared memory, reduction-server sessions).
std::string random_hex(int bytes);

}  // namespace fairring
