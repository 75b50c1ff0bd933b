#include "transport/tcp_mesh.h"

#include <poll.h>
#include <pthread.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "common/log.h"
#include "common/error.h"
#include "transport/greetings.h"

namespace fairring {

namespace {

constexpr char kHelloMagic[8] = {'F', 'A', 'I', 'R', 'R', 'N', 'G', '1'};
// Rejected connections logged one by one per second (FAIRRING_DEBUG=1).
constexpr int kRejectionLines = 10;
// Rejections past kRejectionLines are counted and summed up once per window.
constexpr auto kRejectionLogWindow = std::chrono::seconds(1);
// The accepting thread wakes this often to see whether it should stop.
constexpr int kAcceptPollMs = 100;

std::string addr_key(int rank) { return "fairring/addr/" + std::to_string(rank); }
// Set once the rank has connected to every peer of its mesh.
std::string linked_key(int rank) { return "fairring/linked/" + std::to_string(rank); }

}  // namespace

namespace {
void random_bytes(uint8_t* out, size_t len) {
  size_t got = 0;
  while (got < len) {
    ssize_t n = getrandom(out + got, len - got, 0);
    if (n < 0) throw Error(ErrorKind::kBackend, "fairring: getrandom failed");
    got += static_cast<size_t>(n);
  }
}
}  // namespace

bool same_secret(const uint8_t* a, const uint8_t* b) {
  uint8_t diff = 0;
  for (int i = 0; i < 32; ++i) diff |= static_cast<uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

Secret random_secret() {
  Secret s;
  random_bytes(s.data(), s.size());
  return s;
}

std::string random_hex(int bytes) {
  std::vector<uint8_t> raw(bytes);
  random_bytes(raw.data(), raw.size());
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (uint8_t b : raw) {
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

TcpMesh::TcpMesh(c10::intrusive_ptr<c10d::Store> store, int rank, std::vector<int> peers, const Secret& secret,
                 const std::string& ifname, std::chrono::milliseconds timeout)
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
  pthread_setname_np(pthread_self(), "fairring-accept");
  GreetingReader<Hello> greetings(
      /*max_pending=*/64, std::chrono::seconds(5),
      [this](Socket socket, const Hello& hello, const std::string& from) { admit(std::move(socket), hello, from); },
      [this](const std::string& from, const std::string& why) { log_rejection(from, why); });
  std::vector<struct pollfd> fds;
  while (!stop_) {
    greetings.fill(fds, listener_.fd());
    if (poll(fds.data(), fds.size(), kAcceptPollMs) < 0 && errno != EINTR) break;
    log_suppressed(false);
    greetings.step(fds, listener_.fd());
  }
  log_suppressed(true);
}

void TcpMesh::log_rejection(const std::string& from, const std::string& why) {
  // A scan or a flood of rogue connections must not flood the job's logs:
  // the first one is reported, the rest at debug level only, and there at a
  // bounded rate (a flood is summed up in one line a second).
  if (rejections_++ == 0) {
    FAIRRING_LOG(rank_, "rejected a connection from %s: %s (later rejections are logged with FAIRRING_DEBUG=1)",
                 from.c_str(), why.c_str());
    return;
  }
  if (!debug_enabled()) return;
  const auto now = Clock::now();
  if (now - log_window_ >= kRejectionLogWindow) {
    log_suppressed(true);
    log_window_ = now;
    logged_in_window_ = 0;
  }
  if (logged_in_window_ < kRejectionLines) {
    ++logged_in_window_;
    FAIRRING_DEBUG_LOG(rank_, "rejected a connection from %s: %s", from.c_str(), why.c_str());
  } else {
    ++suppressed_;
  }
}

void TcpMesh::log_suppressed(bool force) {
  if (suppressed_ == 0) return;
  if (!force && Clock::now() - log_window_ < kRejectionLogWindow) return;
  FAIRRING_DEBUG_LOG(rank_, "rejected %llu more connection(s) in the last second (not logged one by one)",
                     static_cast<unsigned long long>(suppressed_));
  suppressed_ = 0;
}

void TcpMesh::admit(Socket s, const Hello& hello, const std::string& from) {
  if (std::memcmp(hello.magic, kHelloMagic, sizeof(kHelloMagic)) != 0 || !same_secret(hello.secret, secret_.data())) {
    log_rejection(from, "it does not know this process group's secret");
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  const int peer = hello.rank;
  const bool expected = std::find(expected_.begin(), expected_.end(), peer) != expected_.end();
  if (!expected || servers_.count(peer) != 0) {
    log_rejection(from, "it claims rank " + std::to_string(peer) + ", not an expected rail peer");
    return;
  }
  // Acknowledge, then hand the link over.
  uint8_t ok = 1;
  try {
    s.send_all(&ok, 1, Clock::now() + std::chrono::seconds(5));
  } catch (const std::exception&) {
    return;
  }
  servers_.emplace(peer, std::move(s));
  cv_.notify_all();
}

void TcpMesh::connect() {
  const std::vector<int>& peers = expected_;
  const auto deadline = Clock::now() + timeout_;
  // Every peer's address in one wait and one read, not a round trip each.
  std::vector<std::string> keys;
  for (int peer : peers) keys.push_back(addr_key(peer));
  std::vector<std::string> addresses;
  if (!keys.empty()) {
    store_->wait(keys, std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()),
                                std::chrono::milliseconds(1)));
    for (const std::vector<uint8_t>& v : store_->multiGet(keys)) addresses.emplace_back(v.begin(), v.end());
  }
  // Greet every peer first and read the acknowledgements after: each comes
  // when the peer's acceptor gets a turn, and waiting for them one by one
  // chains those waits (tens of ms for 15 peers on a busy machine).
  std::vector<Socket> greeted;
  for (size_t i = 0; i < peers.size(); ++i) {
    const std::string& key = keys[i];
    // A peer that failed during creation closes its listener: the store
    // (InitStore's check) says so, and the retries end with its cause.
    Socket s = connect_to(addresses[i], deadline, [&] { (void)store_->check({key}); });
    Hello hello{};
    std::memcpy(hello.magic, kHelloMagic, sizeof(kHelloMagic));
    hello.rank = rank_;
    std::memcpy(hello.secret, secret_.data(), secret_.size());
    s.send_all(&hello, sizeof(hello), deadline);
    greeted.push_back(std::move(s));
  }
  for (size_t i = 0; i < peers.size(); ++i) {
    uint8_t ok = 0;
    try {
      greeted[i].recv_all(&ok, 1, deadline);
    } catch (const std::exception& e) {
      throw Error(ErrorKind::kBackend, "fairring: rank " + std::to_string(peers[i]) + " at " + addresses[i] +
                                           " refused this rank's connection: " + e.what());
    }
    clients_.emplace(peers[i], std::move(greeted[i]));
  }
  // Each peer says in the store once it has connected to all of us.  Waiting
  // for that there, not only for the links to arrive, ends this wait as soon
  // as a peer publishes its failure (InitStore): a peer that failed after
  // taking our link would otherwise leave us here for the whole timeout.
  store_->set(linked_key(rank_), std::vector<uint8_t>{1});
  std::vector<std::string> linked;
  for (int peer : peers) linked.push_back(linked_key(peer));
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  try {
    if (!linked.empty()) store_->wait(linked, std::max(left, std::chrono::milliseconds(1)));
  } catch (const c10::DistStoreError&) {
    // A plain store's timeout: the wait below names the missing peers.
  }
  std::unique_lock<std::mutex> lock(mu_);
  bool all = cv_.wait_until(lock, deadline, [&] { return servers_.size() == peers.size(); });
  if (!all) {
    std::string missing;
    for (int peer : peers) {
      if (servers_.count(peer) == 0) missing += (missing.empty() ? "" : ", ") + std::to_string(peer);
    }
    throw Error(ErrorKind::kBackend, "fairring: Timed out waiting for rank(s) " + missing + " to connect");
  }
}

}  // namespace fairring
