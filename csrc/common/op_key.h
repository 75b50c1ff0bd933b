// What ranks compare to know they run the same collective: the collective's
// kind, its number in the group's issue order, size, dtype and reduction.
// Carried in the node's slot headers and in every rail message; compared and
// explained in one place (check_same_op), so every path reports a mismatch
// with the same words.
#pragma once

#include <cstdint>
#include <string>

namespace fairring {

// Every collective the pipeline runs natively, in the one list that names
// them: its kind, the number ranks compare (slot and wire headers: never
// reuse or renumber one), and its name, which is also its definition's,
// `<name>_def()` in collectives/<file> (collectives.h).  A kind is added
// here and nowhere else is it listed: the enum, the names, the definition
// lookup and its test (test_plan_topology.py) follow from this list.
//
// kBarrier runs the all-reduce's script on one byte, but is its own kind so
// that it is reported as the mismatch it is against an all-reduce.
// kReduceScatter and kAllGather move one block of `numel` elements per rank
// (plan.h: "blockwise"); kReduce is an all-reduce whose result only the
// root keeps; kAllToAllSizes shares the block sizes of an all-to-all of
// unequal blocks before it (an all-gather under its own kind);
// kAllGatherV is the all-gather of blocks of unequal sizes (the
// all-to-all's scripts, every rank's block to every rank).
#define FAIRRING_COLLECTIVES(X)          \
  X(AllReduce, 1, all_reduce)            \
  X(Barrier, 2, barrier)                 \
  X(Broadcast, 3, broadcast)             \
  X(ReduceScatter, 4, reduce_scatter)    \
  X(AllGather, 5, all_gather)            \
  X(Reduce, 6, reduce)                   \
  X(AllToAll, 7, all_to_all)             \
  X(Gather, 8, gather)                   \
  X(Scatter, 9, scatter)                 \
  X(AllToAllSizes, 10, all_to_all_sizes) \
  X(AllGatherV, 11, all_gatherv)

enum class Collective : int32_t {
#define FAIRRING_COLLECTIVE_KIND(kind, number, name) k##kind = number,
  FAIRRING_COLLECTIVES(FAIRRING_COLLECTIVE_KIND)
#undef FAIRRING_COLLECTIVE_KIND
};

// How messages describe the arguments of a collective of one kind: "1000
// elements of float32 with SUM" (elements_of, with_op).  Each collective's
// own file (collectives/) says it, registered when the library loads; the
// layers below the collectives read it here.
using DescribeArgs = std::string (*)(const struct OpKey& k);
void register_collective_args(Collective c, DescribeArgs args);

// "all_reduce"; "collective 11" for a kind this build does not know (a
// peer's newer build).
const char* collective_name(Collective c);

struct OpKey {
  uint64_t op_seq = 0;  // issue order on the engine (CPU or CUDA): what is matched
  // The op's number in the group, as every message, log line and the
  // recent-ops dump name it (the backend counts every collective, delegated
  // ones too; sends and receives apart).  Shown, never matched: ops issued concurrently from two threads
  // to two engines may get their numbers in different orders on two ranks.
  uint64_t number = 0;
  int64_t numel = 0;  // elements of the whole tensor (blockwise collectives: of one rank's block)
  int32_t collective = 0;
  int32_t dtype = 0;  // c10::ScalarType
  int32_t op = 0;     // RedOp
  int32_t root = 0;   // a broadcast's or reduce's root rank; 0 otherwise
  // A blockwise collective of blocks of unequal sizes (up to `numel`): a
  // hash of every block's size (block_layout), so that ranks that cut their
  // lists differently get a mismatch, not misaligned sums; 0 otherwise.
  uint32_t layout = 0;
  // 1: a stand-in for an op whose arguments this rank rejected (no data;
  // FairringBackend::reject_in_turn), so that its peers' op fails at once
  // with a mismatch that says so.  Stand-ins of ranks that all rejected
  // alike match, and run as the empty op they are.
  uint32_t rejected = 0;
};

// The layout of blocks of these sizes (elements): never 0.
uint32_t block_layout(const int64_t* sizes, int n);

// The same op on both sides (`number` is not compared).
inline bool operator==(const OpKey& a, const OpKey& b) {
  return a.op_seq == b.op_seq && a.numel == b.numel && a.collective == b.collective && a.dtype == b.dtype &&
         a.op == b.op && a.root == b.root && a.layout == b.layout && a.rejected == b.rejected;
}
inline bool operator!=(const OpKey& a, const OpKey& b) { return !(a == b); }

// "all_reduce of 1000 elements of float32 with SUM".  Complex tensors travel
// as their real view (twice the elements).
std::string describe(const OpKey& k);
// The same without the collective's name: "1000 elements of float32 with SUM".
std::string describe_args(const OpKey& k);
// The parts collectives describe themselves with: "1000 elements of
// float32" and " with SUM".
std::string elements_of(const OpKey& k);
std::string with_op(const OpKey& k);
// "", or for unequal blocks " (blocks of unequal sizes, layout 1f2e3d4c)":
// ranks whose sizes differ see two layouts in the mismatch message.
std::string unequal_blocks(const OpKey& k);
// " per rank", or for unequal blocks " per rank at most" and the layout.
std::string per_rank(const OpKey& k);

// Throws the error users see when ranks issued different collectives: rank
// `self` has `mine`, rank `peer` has `theirs`.  `device`: "" or "CUDA ".
void check_same_op(const OpKey& mine, int self, const OpKey& theirs, int peer, const char* device = "");

// Throws the error for a peer that runs the same collective but is at another
// step of it (an earlier collective differed between the ranks).
[[noreturn]] void throw_out_of_step(const OpKey& mine, int self, int peer, const char* device = "");

}  // namespace fairring
