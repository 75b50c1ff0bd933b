#include "backend/live_groups.h"

#include "backend/backend.h"

#include <algorithm>
#include <mutex>

namespace fairring {

namespace {
std::mutex mu;
std::vector<FairringBackend*>& followed() {
  static auto* groups = new std::vector<FairringBackend*>();  // never destroyed: groups may outlive statics
  return *groups;
}
}  // namespace

void follow_group(FairringBackend* group) {
  std::lock_guard<std::mutex> lock(mu);
  followed().push_back(group);
}

void unfollow_group(FairringBackend* group) {
  std::lock_guard<std::mutex> lock(mu);  // (waits for a reading in progress)
  auto& groups = followed();
  groups.erase(std::remove(groups.begin(), groups.end(), group), groups.end());
}

std::vector<GroupStatus> live_group_status() {
  std::lock_guard<std::mutex> lock(mu);
  std::vector<GroupStatus> out;
  for (FairringBackend* g : followed()) {
    GroupStatus s;
    s.name = g->getGroupUid();
    s.desc = g->getGroupDesc();
    s.rank = g->getRank();
    s.size = g->getSize();
    s.global_ranks = g->global_ranks();
    s.ended = g->recent_ops().ended();  // before the issued counts, so never above them
    s.collectives_issued = g->collectives_issued();
    s.p2p_issued = g->p2p_issued();
    s.ops = g->recent_ops().snapshot();
    const auto first = g->first_error();
    if (first) s.error = first->what();
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace fairring
