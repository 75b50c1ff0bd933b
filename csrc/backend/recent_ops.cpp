#include "backend/recent_ops.h"

#include <cstdio>

namespace fairring {

RecentOps::RecentOps(size_t capacity) : ring_(capacity) {}

RecentOps::Entry& RecentOps::claim(uint64_t seq, int64_t bytes, State state, bool p2p) {
  Entry& e = ring_[started_ % ring_.size()];
  e.stamp = ++started_;
  e.seq = seq;
  e.p2p = p2p;
  e.bytes = bytes;
  e.state = state;
  e.error.clear();
  e.start = std::chrono::steady_clock::now();
  return e;
}

RecentOps::Handle RecentOps::start(uint64_t seq, const std::string& kind, std::string what, int64_t bytes,
                                   bool delegated, bool p2p) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = claim(seq, bytes, delegated ? State::kDelegated : State::kInFlight, p2p);
  e.kind = kind;  // (assigned into the entry's own buffer: no allocation once warm)
  e.has_key = false;
  e.what = std::move(what);
  return {e.stamp, seq, p2p};
}

RecentOps::Handle RecentOps::start(uint64_t seq, const char* kind, const char* suffix, const OpKey& key,
                                   int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = claim(seq, bytes, State::kInFlight, /*p2p=*/false);
  e.kind = kind;
  e.kind += suffix;
  e.has_key = true;
  e.key = key;
  return {e.stamp, seq, false};
}

void RecentOps::finish(const Handle& h, const std::string& error) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  ++(h.p2p ? ended_.p2p : ended_.collectives);
  Entry& e = ring_[(h.stamp - 1) % ring_.size()];
  if (e.stamp != h.stamp) return;  // overwritten by a later op: the ring went round
  e.end = now;
  e.state = error.empty() ? State::kDone : State::kFailed;
  e.error = error;
}

std::vector<RecentOps::Record> RecentOps::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Record> out;
  const uint64_t n = ring_.size();
  for (uint64_t s = started_ > n ? started_ - n + 1 : 1; s <= started_; ++s) {
    const Entry& e = ring_[(s - 1) % n];
    Record r;
    r.seq = e.seq;
    r.p2p = e.p2p;
    r.kind = e.kind;
    r.what = e.has_key ? describe_args(e.key) : e.what;
    r.bytes = e.bytes;
    switch (e.state) {
      case State::kInFlight:
        r.state = "in flight";
        break;
      case State::kDone:
        r.state = "done";
        break;
      case State::kFailed:
        r.state = "failed";
        break;
      case State::kDelegated:
        r.state = "delegated";
        break;
    }
    r.error = e.error;
    r.start = e.start;
    r.end = e.end;
    out.push_back(std::move(r));
  }
  return out;
}

namespace {
std::string ms(std::chrono::steady_clock::duration d) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f ms", std::chrono::duration<double, std::milli>(d).count());
  return buf;
}
}  // namespace

std::string RecentOps::format() const {
  const auto now = std::chrono::steady_clock::now();
  std::string out;
  for (const Record& r : snapshot()) {
    out += "  #" + std::to_string(r.seq) + " " + r.kind + (r.what.empty() ? "" : " of " + r.what) + ", " +
           std::to_string(r.bytes) + " bytes: " + r.state + ", started " + ms(now - r.start) + " ago";
    if (r.ended()) out += ", took " + ms(r.end - r.start);
    if (!r.error.empty()) out += ": " + r.error.substr(0, 200);
    out += "\n";
  }
  return out;
}

RecentOps::Ended RecentOps::ended() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ended_;
}

bool RecentOps::first_failure() {
  std::lock_guard<std::mutex> lock(mu_);
  if (failure_dumped_) return false;
  failure_dumped_ = true;
  return true;
}

}  // namespace fairring
