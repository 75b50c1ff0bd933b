#include "backend/recent_ops.h"

#include <cstdio>

namespace fairring {

RecentOps::RecentOps(size_t capacity) : capacity_(capacity) {}

RecentOps::Handle RecentOps::start(uint64_t seq, std::string kind, std::string what, int64_t bytes, bool delegated) {
  auto h = std::make_shared<Record>();
  h->seq = seq;
  h->kind = std::move(kind);
  h->what = std::move(what);
  h->bytes = bytes;
  h->state = delegated ? "delegated" : "in flight";
  h->start = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  ops_.push_back(h);
  if (ops_.size() > capacity_) ops_.pop_front();
  return h;
}

void RecentOps::finish(const Handle& h, const std::string& error) {
  std::lock_guard<std::mutex> lock(mu_);
  h->end = std::chrono::steady_clock::now();
  h->state = error.empty() ? "done" : "failed";
  h->error = error;
}

std::vector<RecentOps::Record> RecentOps::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Record> out;
  for (const auto& h : ops_) out.push_back(*h);
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

bool RecentOps::first_failure() {
  std::lock_guard<std::mutex> lock(mu_);
  if (failure_dumped_) return false;
  failure_dumped_ = true;
  return true;
}

}  // namespace fairring
