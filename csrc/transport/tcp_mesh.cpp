#include "transport/tcp_mesh.h"

#include <sys/random.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "common/log.h"

namespace fairring {

namespace {

constexpr char kHelloMagic[8] = {'F', 'A', 'I', 'R', 'R', 'N', 'G', '1'};

struct Hello {
  char magic[8];
  int32_t rank;
  uint32_t reserved;
  uint8_t secret[32];
};

// Constant-time comparison: a wrong guess takes as long as a near miss.
bool same_secret(const uint8_t* a, const uint8_t* b) {
  uint8_t diff = 0;
  for (int i = 0; i < 32; ++i) diff |= static_cast<uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

std::string addr_key(int rank) { return "fairring/addr/" + std::to_string(rank); }

}  // namespace

Secret random_secret() {
  Secret s;
  size_t got = 0;
  while (got < s.size()) {
    ssize_t n = getrandom(s.data() + got, s.size() - got, 0);
    if (n < 0) throw std::runtime_error("fairring: getrandom failed");
    got += static_cast<size_t>(n);
  }
  return s;
}

TcpMesh::TcpMesh(
    c10::intrusive_ptr<c10d::Store> store,
    int rank,
    std::vector<int> peers,
    const Secret& secret,
    const std::string& ifname,
    std::chrono::milliseconds timeout)
    : store_(std::move(store)), rank_(rank), secret_(secret), timeout_(timeout), expected_(std::move(peers)) {
  address_ = ifname.empty() ? default_address() : interface_address(ifname);
  listener_ = listen_on(address_, &port_);
  const std::string value = listen_address();
  store_->set(addr_key(rank_), std::vector<uint8_t>(value.begin(), value.end()));
  acceptor_ = std::thread([this] { accept_loop(); });
}

TcpMesh::~TcpMesh() {
  stop_ = true;
  if (acceptor_.joinable()) acceptor_.join();
}

void TcpMesh::accept_loop() {
  while (!stop_) {
    Socket s = accept_within(listener_, std::chrono::milliseconds(100));
    if (!s.valid()) continue;
    const std::string from = s.peer_name();
    Hello hello{};
    try {
      // A short deadline: a silent intruder must not hold up the peers.
      s.recv_all(&hello, sizeof(hello), Clock::now() + std::chrono::seconds(5));
    } catch (const std::exception& e) {
      FAIRRING_LOG(rank_, "rejected a connection from %s: no valid greeting (%s)", from.c_str(), e.what());
      continue;
    }
    if (std::memcmp(hello.magic, kHelloMagic, sizeof(kHelloMagic)) != 0 ||
        !same_secret(hello.secret, secret_.data())) {
      FAIRRING_LOG(rank_, "rejected a connection from %s: it does not know this process group's secret", from.c_str());
      continue;
    }
    std::lock_guard<std::mutex> lock(mu_);
    const int peer = hello.rank;
    const bool expected = std::find(expected_.begin(), expected_.end(), peer) != expected_.end();
    if (!expected || servers_.count(peer) != 0) {
      FAIRRING_LOG(rank_, "rejected a connection from %s claiming rank %d: not an expected rail peer", from.c_str(), peer);
      continue;
    }
    // Acknowledge, then hand the link over.
    uint8_t ok = 1;
    try {
      s.send_all(&ok, 1, Clock::now() + std::chrono::seconds(5));
    } catch (const std::exception&) {
      continue;
    }
    servers_.emplace(peer, std::move(s));
    cv_.notify_all();
  }
}

void TcpMesh::connect() {
  const std::vector<int>& peers = expected_;
  const auto deadline = Clock::now() + timeout_;
  for (int peer : peers) {
    auto raw = store_->get(addr_key(peer));
    std::string value(raw.begin(), raw.end());
    auto colon = value.rfind(':');
    Socket s = connect_to(value.substr(0, colon), std::stoi(value.substr(colon + 1)), deadline);
    Hello hello{};
    std::memcpy(hello.magic, kHelloMagic, sizeof(kHelloMagic));
    hello.rank = rank_;
    std::memcpy(hello.secret, secret_.data(), secret_.size());
    s.send_all(&hello, sizeof(hello), deadline);
    uint8_t ok = 0;
    try {
      s.recv_all(&ok, 1, deadline);
    } catch (const std::exception& e) {
      throw std::runtime_error(
          "fairring: rank " + std::to_string(peer) + " at " + value +
          " refused this rank's connection: " + e.what());
    }
    clients_.emplace(peer, std::move(s));
  }
  std::unique_lock<std::mutex> lock(mu_);
  bool all = cv_.wait_until(lock, deadline, [&] { return servers_.size() == peers.size(); });
  if (!all) {
    std::string missing;
    for (int peer : peers) {
      if (servers_.count(peer) == 0) missing += (missing.empty() ? "" : ", ") + std::to_string(peer);
    }
    throw std::runtime_error("fairring: timed out waiting for rank(s) " + missing + " to connect");
  }
}

}  // namespace fairring
