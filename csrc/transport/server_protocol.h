// What a rank and a dedicated reduction server say to each other,
// and how they find each other (docs/REDUCTION_SERVERS.md).
//
// A server joins the job through the job's store (its root, not a group's
// prefix): it takes the next index from a counter and publishes its address
// under that index.  A group that asks for M servers uses servers 0..M-1.
// Each rank of the group opens one connection to each of them, greets it
// with a ServerHello (the job's server secret proves it belongs to the job;
// the session names its rail), and hears a ServerWelcome.  After that the
// connection carries the rail's framed messages (transport/channel.h): the
// rank's contributions in slice order, the server's sums back.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <string>

#include "transport/tcp_mesh.h"

namespace c10d {
class Store;
}

namespace fairring {

// The magic names the protocol's version: a server and ranks of different
// builds refuse each other instead of misreading each other's messages.
constexpr char kServerHelloMagic[8] = {'F', 'R', 'S', 'E', 'R', 'V', '0', '3'};
constexpr int kSessionIdBytes = 24;
// Bounds a server holds a greeting to (a rank's own are far below).
constexpr int32_t kMaxServerNodes = 1 << 16;
constexpr int32_t kMaxServerGroupSize = 1 << 24;

struct ServerHello {
  char magic[8];
  uint8_t secret[32];
  // The rail it belongs to, the same on every rank of that rail (of one
  // group's engine), NUL-terminated.  A server reduces the messages of the
  // connections of one session with each other.
  char session[kSessionIdBytes];
  int32_t rank;               // the worker's rank in its group (for messages)
  int32_t node;               // its node: the place of its piece in the reduction order
  int32_t num_nodes;          // contributions per reduction
  int32_t group_size;         // ranks in the group
  int32_t largest_node;       // the rank count of its largest node
  int32_t uneven;             // 1: its nodes have different rank counts
                              // (these three give AVG's divisor: reduce_op.h, avg_divisors)
  uint32_t wire;              // WireDtype of the group's compressed rails
  int32_t server;             // the index the worker knows the server by
  uint32_t header_bytes;      // sizeof(WireHeader) in the rank's build
  int64_t max_message_bytes;  // no contribution of the rank is larger
};

struct ServerWelcome {
  char magic[8];
  int32_t status;  // 0: admitted; otherwise `message` says why not
  char message[244];
};

// Keys in the job's root store.
std::string server_count_key();
std::string server_addr_key(int index);

// The job's store under every group's prefix (a group's store is a chain of
// prefix stores over it).
c10::intrusive_ptr<c10d::Store> root_store(const c10::intrusive_ptr<c10d::Store>& store);
// The job's server secret: the first of the job's workers and servers to
// ask for it creates it in the root store.
Secret job_server_secret(c10d::Store& root);

// "reduction server 1 (10.0.0.7:4242)": how messages name a server.
std::string server_name(int index, const std::string& address);

}  // namespace fairring
