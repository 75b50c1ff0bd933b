#include "p2p/matcher.h"

namespace fairring {

std::optional<uint64_t> Matcher::post_recv(uint64_t recv, int src, int tag) {
  for (auto it = messages_.begin(); it != messages_.end(); ++it) {
    if (it->tag == tag && (src == kAnySource || it->src == src)) {
      const uint64_t msg = it->id;
      messages_.erase(it);
      return msg;
    }
  }
  recvs_.push_back(Entry{recv, src, tag});
  return std::nullopt;
}

std::optional<uint64_t> Matcher::arrive(uint64_t msg, int src, int tag) {
  for (auto it = recvs_.begin(); it != recvs_.end(); ++it) {
    if (it->tag == tag && (it->src == kAnySource || it->src == src)) {
      const uint64_t recv = it->id;
      recvs_.erase(it);
      return recv;
    }
  }
  messages_.push_back(Entry{msg, src, tag});
  return std::nullopt;
}

namespace {
// Removes the entry `id` from `entries`; true if it was there.
template <typename List>
bool erase_id(List& entries, uint64_t id) {
  for (auto it = entries.begin(); it != entries.end(); ++it) {
    if (it->id == id) {
      entries.erase(it);
      return true;
    }
  }
  return false;
}
}  // namespace

bool Matcher::cancel_recv(uint64_t recv) { return erase_id(recvs_, recv); }

bool Matcher::cancel_message(uint64_t msg) { return erase_id(messages_, msg); }

}  // namespace fairring
