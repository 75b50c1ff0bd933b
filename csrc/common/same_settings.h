// The check that the ranks of a group were started with the settings that
// must agree between them (slice size, parallelism, GPU transport): each
// rank publishes its own under `key`/<rank> and compares everyone's.  One
// place, so the mismatch reads the same whichever setting it is.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <string>
#include <vector>

namespace c10d {
class Store;
}

namespace fairring {

// Every rank's value of `key`/<rank>, in one wait and one read (not a store
// round trip per rank: group creation at many ranks paid them).
std::vector<std::string> read_every_rank(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key,
                                         int size);

// Throws an Error of kind kInvalidArgument (ValueError in Python) naming both ranks'
// values if any rank's `mine` differs from this one's.
void check_same_settings(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key, int rank, int size,
                         const std::string& mine);
// The same check over values already read (`all`, by rank).
void check_settings_agree(const std::vector<std::string>& all, int rank, const std::string& mine);

}  // namespace fairring
