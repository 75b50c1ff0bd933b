// A dedicated reduction server (python -m fairring_py.server): a process
// that is no rank of the job, joins it through the job's store, and reduces
// the all-reduce pieces the workers' rails send it (docs/REDUCTION_SERVERS.md).
//
// Each rail of each group that uses it is a session: one connection per node
// of the rail.  The i-th message of every connection of a session is one
// reduction: the server checks that they are the same op, sums them in node
// order (widening compressed messages, rounding the sum once) and sends the
// sum back on every connection.  A session lives on one reduction thread;
// sessions spread over the threads.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport/socket.h"
#include "transport/tcp_mesh.h"

namespace c10d {
class Store;
}

namespace fairring {

struct ServerHello;

struct ServerOptions {
  std::string ifname;  // listen on this interface's address ("": the hostname's)
  int threads = 1;     // reduction threads (a rail's session runs on one)
  // How often the server checks that the job's store is still there.
  std::chrono::milliseconds store_poll{1000};
};

class ReductionServer {
 public:
  // Joins the job: listens, takes the next server index from the store and
  // publishes its address under it.
  ReductionServer(c10::intrusive_ptr<c10d::Store> root, ServerOptions options);
  ~ReductionServer();

  int index() const { return index_; }
  std::string address() const { return address_; }
  // Blocks up to `timeout`; false once the server has stopped (the job's
  // store went away, or stop()).
  bool wait(std::chrono::milliseconds timeout);
  // Tells every connected rank that the server stops, then stops.
  void stop(const std::string& why);
  std::string stop_reason();
  // What it has done so far: reductions, contribution bytes received (as
  // they travelled), sessions admitted.
  uint64_t reductions() const { return reductions_; }
  uint64_t bytes_in() const { return bytes_in_; }
  uint64_t sessions() const { return sessions_admitted_; }

  struct Session;
  struct Worker;

 private:
  void accept_loop();
  // A connection that sent this greeting: admits it to its rail's session
  // and hands it to the session's thread, or throws why not.
  void admit(Socket socket, const ServerHello& hello);
  void serve(Worker& w);
  void finish(const std::string& why);

  c10::intrusive_ptr<c10d::Store> root_;
  ServerOptions options_;
  Secret secret_{};
  std::string address_;
  int index_ = -1;
  Socket listener_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ = false;
  std::string stop_reason_;
  std::map<std::string, std::shared_ptr<Session>> sessions_;  // by id, under mu_
  int next_worker_ = 0;

  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> reductions_{0}, bytes_in_{0}, sessions_admitted_{0};
  std::vector<std::unique_ptr<Worker>> workers_;
  std::thread acceptor_;
};

}  // namespace fairring
