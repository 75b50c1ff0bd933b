#include "backend/init_store.h"
#include "common/backoff.h"

#include "backend/torch_error.h"
#include "common/error.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <stdexcept>
#include <thread>

namespace fairring {

namespace {
const char* kFailureKey = "failure";
const char* kFailureCountKey = "failures";
const std::string kFailureReadKey = "failure-read/";  // + rank: it has read the failure
// How often a waiter looks for its keys and for a failure: soon at first
// (a peer is usually a moment behind, and every wait of a group's creation
// adds up: shrink and torchft create groups while training waits), then
// every 20 ms, which keeps the store's load low during a long wait.  Not the
// store's own timed wait: TCPStore warns on every wait that times out, and
// a timed-out wait took 5 s to end (torch 2.13), for a 20 ms slice.
constexpr auto kFirstPoll = std::chrono::microseconds(50);
constexpr auto kPollEvery = std::chrono::milliseconds(20);
// How long the rank that failed first waits for the others to read why
// before it raises (it may host the store, which goes with it).
constexpr std::chrono::milliseconds kFailureReadLimit(10000);
// The first publisher of a failure counts, then writes its message.
constexpr auto kFailureMessageWait = std::chrono::seconds(10);

std::string string_of(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
}  // namespace

InitStore::InitStore(c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::chrono::milliseconds timeout)
    : c10d::PrefixStore("fairring", std::move(store)), rank_(rank), size_(size), timeout_(timeout) {}

std::vector<uint8_t> InitStore::get(const std::string& key) {
  wait({key});
  return PrefixStore::get(key);
}

void InitStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void InitStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Backoff backoff(kFirstPoll, kPollEvery);
  for (;;) {
    // Look for a failure before the keys: a peer may publish its keys and
    // then fail (a settings mismatch it saw first), and a rank that finds
    // those keys goes on to reach the same verdict of its own.
    const bool failed = PrefixStore::check({kFailureKey});
    if (PrefixStore::check(keys)) return;
    if (failed) throw_if_failed();
    if (std::chrono::steady_clock::now() > deadline) {
      std::string names;
      for (const auto& k : keys) names += (names.empty() ? "" : ", ") + k;
      throw Error(ErrorKind::kStore, "fairring: Timed out creating the process group: rank " + std::to_string(rank_) +
                                         " waited " + std::to_string(timeout.count() / 1000) + " s for " + names +
                                         " (did every rank of the group call init_process_group / new_group?)");
    }
    backoff.sleep();
  }
}

bool InitStore::check(const std::vector<std::string>& keys) {
  throw_if_failed();
  return PrefixStore::check(keys);
}

void InitStore::throw_if_failed() {
  if (!PrefixStore::check({kFailureKey})) return;
  const std::string why = string_of(PrefixStore::get(kFailureKey));
  mark_failure_read();
  throw Error(ErrorKind::kBackend, "fairring: could not create the process group: " + why);
}

bool InitStore::publish_failure(const std::string& why) {
  try {
    if (PrefixStore::add(kFailureCountKey, 1) == 1) {
      const std::string msg = "rank " + std::to_string(rank_) + " failed: " + why;
      PrefixStore::set(kFailureKey, std::vector<uint8_t>(msg.begin(), msg.end()));
      return true;
    }
    mark_failure_read();  // we fail too: the first one need not wait for us
    return false;
  } catch (const std::exception&) {
    // The store itself is gone: the peers' waits time out on their own.
    return true;
  }
}

std::string InitStore::first_failure() {
  // The first publisher counts, then writes its message: wait for it briefly.
  PrefixStore::wait({kFailureKey}, kFailureMessageWait);
  const std::string why = string_of(PrefixStore::get(kFailureKey));
  mark_failure_read();
  return "fairring: could not create the process group: " + why;
}

void InitStore::mark_failure_read() {
  try {
    PrefixStore::set(kFailureReadKey + std::to_string(rank_), std::vector<uint8_t>{1});
  } catch (const std::exception&) {
    // The store is gone: its host has already left.
  }
}

void InitStore::await_failure_read() {
  const auto deadline = std::chrono::steady_clock::now() + std::min(timeout_, kFailureReadLimit);
  try {
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const std::string key = kFailureReadKey + std::to_string(r);
      while (!PrefixStore::check({key})) {
        if (std::chrono::steady_clock::now() > deadline) return;  // a peer that never came, or died
        std::this_thread::sleep_for(kPollEvery);
      }
    }
  } catch (const std::exception&) {
    // The store is gone: nothing more can be told.
  }
}

void InitStore::checkpoint(const std::string& stage) {
  PrefixStore::set(stage + "/" + std::to_string(rank_), std::vector<uint8_t>{1});
  std::vector<std::string> keys;
  for (int r = 0; r < size_; ++r) keys.push_back(stage + "/" + std::to_string(r));
  wait(keys);
}

namespace {
void build_or_tell(InitStore& init, const std::function<void()>& build) {
  try {
    build();
    init.checkpoint("built");
  } catch (const std::exception& e) {
    const bool ours_first = init.publish_failure(e.what());
    if (ours_first) init.await_failure_read();
    // A bad setting of our own stays our error (a ValueError in Python).
    const auto* own = dynamic_cast<const Error*>(&e);
    const bool own_setting =
        dynamic_cast<const c10::ValueError*>(&e) != nullptr || (own && own->kind() == ErrorKind::kInvalidArgument);
    if (ours_first || own_setting) throw;
    // Another rank failed first; ours may only follow from it (a segment
    // its node-mate removed while failing): report the cause.
    const std::exception_ptr original = std::current_exception();
    std::string first;
    try {
      first = init.first_failure();
    } catch (...) {
      std::rethrow_exception(original);
    }
    throw Error(ErrorKind::kBackend, first + " (then on this rank: " + e.what() + ")");
  }
}

}  // namespace

void build_collectively(InitStore& init, const std::function<void()>& build) {
  with_torch_errors([&] { build_or_tell(init, build); });
}

}  // namespace fairring
