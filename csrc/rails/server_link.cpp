#include "rails/server_link.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <cstring>

#include "common/config.h"
#include "common/error.h"
#include "transport/server_protocol.h"

namespace fairring {

namespace {
// The longest a group waits at creation for servers that have not joined.
constexpr auto kServerJoinWait = std::chrono::minutes(2);
}  // namespace

bool uses_reduction_servers(const Config& config, int num_nodes) {
  return config.reduction_servers > 0 && num_nodes >= kMinNodesForServers;
}

std::vector<std::unique_ptr<Channel>> connect_reduction_servers(const c10::intrusive_ptr<c10d::Store>& store,
                                                                const Topology& topo, const Config& config,
                                                                WireDtype wire, int64_t max_message_bytes) {
  const int wanted = config.reduction_servers;
  const auto root = root_store(store);
  const Secret secret = job_server_secret(*root);
  // The rail's session: named by its rank on node 0, the same for all of it.
  const std::string session_key = "servers/session/" + std::to_string(topo.local_rank);
  std::string session;
  if (topo.node == 0) {
    session = random_hex(8) + "-" + std::to_string(topo.local_rank);
    store->set(session_key, std::vector<uint8_t>(session.begin(), session.end()));
  } else {
    const auto raw = store->get(session_key);
    session.assign(raw.begin(), raw.end());
  }
  if (session.size() >= static_cast<size_t>(kSessionIdBytes)) {
    throw Error(ErrorKind::kBackend, "fairring: malformed reduction-server session id in the store");
  }

  const auto join_wait = std::min<std::chrono::milliseconds>(config.timeout, kServerJoinWait);
  std::vector<std::unique_ptr<Channel>> out;
  for (int m = 0; m < wanted; ++m) {
    try {
      root->wait({server_addr_key(m)}, join_wait);
    } catch (const std::exception&) {
      int64_t joined = 0;
      try {
        joined = root->add(server_count_key(), 0);
      } catch (const std::exception&) {
      }
      throw Error(ErrorKind::kBackend,
                  "fairring: this group uses " + std::to_string(wanted) +
                      " reduction servers (FAIRRING_REDUCTION_SERVERS / Options.reduction_servers), but server " +
                      std::to_string(m) + " has not joined the job (" + std::to_string(joined) +
                      " joined, counting any that exited since) within " +
                      std::to_string(std::chrono::duration_cast<std::chrono::seconds>(join_wait).count()) +
                      " s: start them next to the job with `python -m fairring_py.server --store <host:port of the "
                      "job's store>`");
    }
    const auto raw = root->get(server_addr_key(m));
    const std::string address(raw.begin(), raw.end());
    const std::string name = server_name(m, address);
    const auto deadline = Clock::now() + join_wait;
    ServerWelcome welcome{};
    Socket s;
    try {
      s = connect_to(address, deadline);
      ServerHello hello{};
      std::memcpy(hello.magic, kServerHelloMagic, sizeof(kServerHelloMagic));
      std::memcpy(hello.secret, secret.data(), secret.size());
      std::memcpy(hello.session, session.c_str(), session.size() + 1);
      hello.rank = topo.rank;
      hello.node = topo.node;
      hello.num_nodes = topo.num_nodes;
      hello.group_size = topo.size;
      hello.largest_node = topo.largest_node;
      hello.uneven = topo.uneven ? 1 : 0;
      hello.wire = static_cast<uint32_t>(wire);
      hello.server = m;
      hello.header_bytes = sizeof(WireHeader);
      hello.max_message_bytes = max_message_bytes;
      s.send_all(&hello, sizeof(hello), deadline);
      s.recv_all(&welcome, sizeof(welcome), deadline);
    } catch (const std::exception& e) {
      throw Error(ErrorKind::kBackend, "fairring: could not reach " + name + ": " + error_of(e).what());
    }
    if (std::memcmp(welcome.magic, kServerHelloMagic, sizeof(kServerHelloMagic)) != 0) {
      throw Error(ErrorKind::kBackend,
                  "fairring: " + name + " did not answer as a reduction server of this Fairring version does");
    }
    if (welcome.status != 0) {
      welcome.message[sizeof(welcome.message) - 1] = '\0';
      throw Error(ErrorKind::kBackend, "fairring: " + name + " refused rank " + std::to_string(topo.rank) + ": " +
                                           std::string(welcome.message));
    }
    // Negative ranks: a server is no rank of the group.
    out.push_back(std::make_unique<Channel>(std::move(s), -1 - m, name, "server"));
  }
  return out;
}

}  // namespace fairring
