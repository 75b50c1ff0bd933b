// The store a process group is built through.  Creating a group is collective
// (settings, shared memory, TCP rails), and a rank that fails half-way would
// leave the others blocked on a key it never writes, to fail much later with
// a raw store timeout that names nothing.  Through this store a failing rank
// publishes its error once (the first cause wins), and every wait of the
// others ends with that error instead.
#pragma once

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace fairring {

class InitStore : public c10d::PrefixStore {
 public:
  InitStore(c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::chrono::milliseconds timeout);

  // Waits for the keys, or for a peer's published failure (thrown), or until
  // the group's timeout (thrown, naming the keys).
  std::vector<uint8_t> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  // Throws a peer's published failure, if there is one, before it looks
  // (for a retry loop outside the store, a connect say, to end with it).
  bool check(const std::vector<std::string>& keys) override;

  // Throws a peer's published failure, if there is one (for waits outside
  // the store, NCCL's init say, to end with it too).
  void throw_if_failed();
  // Publishes this rank's failure (only the first failure of the group is
  // kept).  False if another rank's came first: this one may be only its
  // consequence (a peer removed what we were opening), and the caller should
  // report the first one, from first_failure().
  bool publish_failure(const std::string& why);
  // The group's first failure, as the other ranks report it.
  std::string first_failure();
  // For the rank that published the first failure, before its error leaves
  // group creation: waits (up to the timeout, at most 10 s) until every other
  // rank has read it, so that none is left with a bare "connection reset"
  // when this rank (perhaps the store's host) exits with its error.
  void await_failure_read();
  // Every rank reached `stage` ("built"): returns once all have, throws the
  // first failure if one rank published it instead.
  void checkpoint(const std::string& stage);

 private:
  void mark_failure_read();

  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
};

// Runs `build` (collective: every rank of the group runs it through `init`)
// and the "built" checkpoint.  If it throws, the rank publishes its error
// and rethrows it if it was the first (or a bad setting of its own: a
// ValueError stays one); a rank that failed only after another did raises
// the first cause, with its own appended.  So every rank ends the same way.
void build_collectively(InitStore& init, const std::function<void()>& build);

}  // namespace fairring
