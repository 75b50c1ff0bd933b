// When a group fails and torch's flight recorder is to be dumped
// (TORCH_FR_DUMP_ON_TIMEOUT), the ranks that see the failure dump their own;
// a rank that is stalled outside Fairring (in Python, in a kernel, waiting
// on something else) never sees it.  So the first rank to fail asks every
// rank of the job to dump, through the listener each process keeps for the
// status view (fairring_py/_status_listener.py), whose address and token
// are in the job's store: one folder then holds every live rank's picture.
#pragma once

#include <c10/util/intrusive_ptr.h>

namespace c10d {
class Store;
}

namespace fairring {

// Once per job (the first caller, counted in the store); never throws.
// `rank`: ours, for the log line.
void ask_every_rank_to_dump(const c10::intrusive_ptr<c10d::Store>& store, int rank);

}  // namespace fairring
