#include "backend/recent_ops.h"

#include <c10/util/ApproximateClock.h>

#include <cstdio>

namespace fairring {

RecentOps::RecentOps(size_t capacity, std::shared_ptr<FlightRecord> torch)
    : torch_(std::move(torch)), ring_(capacity) {}

RecentOps::Handle RecentOps::record(uint64_t seq, std::string_view kind, std::string_view suffix, int64_t bytes,
                                    const InTorch* torch, bool p2p, State state, const OpKey* key, std::string what) {
  // torch's entry first, outside mu_: it may take the GIL (a Python stack).
  FlightRecord::Id id;
  if (torch != nullptr) {
    id = torch_->issued(torch->uid, torch->desc, torch->name, torch->detail, p2p, torch->inputs, torch->outputs,
                        torch->timeout);
  }
  const int64_t now = id.id ? 0 : c10::getTime();
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = ring_[started_ % ring_.size()];
  e.stamp = ++started_;
  e.seq = seq;
  e.p2p = p2p;
  e.kind.assign(kind);  // into the entry's own buffer: no allocation once warm
  e.kind.append(suffix);
  e.has_key = key != nullptr;
  if (key != nullptr) {
    e.key = *key;
  } else {
    e.what = std::move(what);
  }
  e.bytes = bytes;
  e.torch = id;
  e.state = state;
  e.start_ns = now;
  e.end_ns = 0;
  e.error.clear();
  return {e.stamp, seq, p2p, id};
}

RecentOps::Handle RecentOps::start(uint64_t seq, std::string_view kind, std::string_view suffix, std::string what,
                                   int64_t bytes, const InTorch* torch, bool p2p) {
  return record(seq, kind, suffix, bytes, torch, p2p, State::kInFlight, nullptr, std::move(what));
}

RecentOps::Handle RecentOps::start(uint64_t seq, std::string_view kind, std::string_view suffix, const OpKey& key,
                                   int64_t bytes, const InTorch* torch) {
  return record(seq, kind, suffix, bytes, torch, /*p2p=*/false, State::kInFlight, &key, "");
}

void RecentOps::delegated(uint64_t seq, std::string_view kind) {
  (void)record(seq, kind, " (gloo)", 0, nullptr, /*p2p=*/false, State::kDelegated, nullptr, "");
}

void RecentOps::finish(const Handle& h, const std::string& error) {
  torch_->ended(h.torch, error.empty());
  const int64_t now = c10::getTime();
  std::lock_guard<std::mutex> lock(mu_);
  ++(h.p2p ? ended_.p2p : ended_.collectives);
  Entry& e = ring_[(h.stamp - 1) % ring_.size()];
  if (e.stamp != h.stamp) return;  // overwritten by a later op: the ring went round
  // torch's entry has the end of an op that completed; not the error and
  // the end of one that failed.
  if (!error.empty()) {
    e.error = error;
    e.end_ns = now;
  }
  if (!e.torch.id) {
    e.state = error.empty() ? State::kDone : State::kFailed;
    e.end_ns = now;
  }
}

std::vector<RecentOps::Record> RecentOps::snapshot() const {
  std::vector<Record> out;
  std::vector<FlightRecord::Id> ids;
  std::vector<State> states;
  std::vector<int64_t> starts, ends;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t n = ring_.size();
    for (uint64_t s = started_ > n ? started_ - n + 1 : 1; s <= started_; ++s) {
      const Entry& e = ring_[(s - 1) % n];
      Record r;
      r.seq = e.seq;
      r.p2p = e.p2p;
      r.kind = e.kind;
      r.what = e.has_key ? describe_args(e.key) : e.what;
      r.bytes = e.bytes;
      r.error = e.error;
      out.push_back(std::move(r));
      ids.push_back(e.torch);
      states.push_back(e.state);
      starts.push_back(e.start_ns);
      ends.push_back(e.end_ns);
    }
  }
  // The states and times torch's entries hold, read outside mu_ (the two
  // locks are never held together).
  const std::vector<FlightRecord::Seen> seen = FlightRecord::look(ids);
  for (size_t i = 0; i < out.size(); ++i) {
    Record& r = out[i];
    if (!ids[i].id) {
      static const char* const names[] = {"in flight", "done", "failed", "delegated"};
      r.state = names[static_cast<int>(states[i])];
      r.start_ns = starts[i];
      if (r.ended()) r.end_ns = ends[i];
      continue;
    }
    const FlightRecord::Seen& s = seen[i];
    if (!s.found) {
      // Gone from torch's ring: a failure is still known here (its error and end).
      r.state = r.error.empty() ? "unknown" : "failed";
      if (!r.error.empty()) r.end_ns = ends[i];
      continue;
    }
    r.start_ns = s.created_ns;
    if (!s.retired) {
      r.state = "in flight";
    } else if (s.completed_ns) {
      r.state = "done";
      r.end_ns = *s.completed_ns;
    } else {
      r.state = "failed";
      r.end_ns = ends[i];
    }
  }
  return out;
}

namespace {
std::string ms(int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f ms", static_cast<double>(ns) / 1e6);
  return buf;
}
}  // namespace

std::string RecentOps::format() const {
  const int64_t now = c10::getTime();
  std::string out;
  for (const Record& r : snapshot()) {
    out += "  #" + std::to_string(r.seq) + " " + r.kind + (r.what.empty() ? "" : " of " + r.what) + ", " +
           std::to_string(r.bytes) + " bytes: " + r.state;
    if (r.start_ns) out += ", started " + ms(now - *r.start_ns) + " ago";
    if (r.start_ns && r.end_ns) out += ", took " + ms(*r.end_ns - *r.start_ns);
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
