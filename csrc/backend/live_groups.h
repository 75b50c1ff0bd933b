// The Fairring groups alive in this process, for the status view
// (fairring_py.status).  A group joins at its first op (torch has named it
// by then) and leaves first thing in its destructor; the view reads every
// group under the registry's lock, so that no group can go while it is read,
// and no reference is ever taken (a reference held here would decide on
// which thread a group is destroyed).
#pragma once

#include "backend/recent_ops.h"

#include <cstdint>
#include <string>
#include <vector>

namespace fairring {

class FairringBackend;

void follow_group(FairringBackend* group);
void unfollow_group(FairringBackend* group);

// What the status view shows of one group, as this rank sees it.
struct GroupStatus {
  std::string name;  // c10d's group name and description
  std::string desc;
  int rank = 0;
  int size = 0;
  std::vector<uint64_t> global_ranks;  // empty when not known
  uint64_t collectives_issued = 0;
  uint64_t p2p_issued = 0;
  RecentOps::Ended ended;
  std::vector<RecentOps::Record> ops;  // oldest first
  std::string error;                   // the group's first, or ""
};
// The followed groups, oldest first.
std::vector<GroupStatus> live_group_status();

}  // namespace fairring
