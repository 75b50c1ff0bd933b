#include "common/op_key.h"

#include <c10/core/ScalarType.h>

#include <stdexcept>

#include "common/dtype_name.h"
#include "common/reduce_op.h"

namespace fairring {

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::kAllReduce:
      return "all_reduce";
    case Collective::kBarrier:
      return "barrier";
    case Collective::kBroadcast:
      return "broadcast";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kAllGather:
      return "all_gather";
    case Collective::kReduce:
      return "reduce";
  }
  return "collective";
}

std::string describe_args(const OpKey& k) {
  const std::string elements =
      std::to_string(k.numel) + " elements of " + dtype_name(static_cast<c10::ScalarType>(k.dtype));
  const std::string with = std::string(" with ") + redop_name(static_cast<RedOp>(k.op));
  switch (static_cast<Collective>(k.collective)) {
    case Collective::kBroadcast:
      return std::to_string(k.numel) + " bytes from rank " + std::to_string(k.root);
    case Collective::kBarrier:
      return "";
    case Collective::kAllGather:
      return elements + " per rank";
    case Collective::kReduceScatter:
      return elements + " per rank" + with;
    case Collective::kReduce:
      return elements + with + " to rank " + std::to_string(k.root);
    case Collective::kAllReduce:
      break;
  }
  return elements + with;
}

std::string describe(const OpKey& k) {
  const std::string args = describe_args(k);
  return std::string(collective_name(static_cast<Collective>(k.collective))) + (args.empty() ? "" : " of " + args);
}

namespace {
std::string mismatch_prefix(const OpKey& mine, const char* device) {
  return std::string(device) + collective_name(static_cast<Collective>(mine.collective)) + " mismatch between ranks: ";
}
}  // namespace

void check_same_op(const OpKey& mine, int self, const OpKey& theirs, int peer, const char* device) {
  if (mine == theirs) return;
  throw std::runtime_error(mismatch_prefix(mine, device) + "for collective #" + std::to_string(mine.number) + " rank " +
                           std::to_string(self) + " has " + describe(mine) + " but rank " + std::to_string(peer) +
                           " has collective #" + std::to_string(theirs.number) + ": " + describe(theirs) +
                           ". Every rank must issue the same collectives in the same order.");
}

void throw_out_of_step(const OpKey& mine, int self, int peer, const char* device) {
  throw std::runtime_error(mismatch_prefix(mine, device) + "rank " + std::to_string(peer) +
                           " is out of step with rank " + std::to_string(self) + " at collective #" +
                           std::to_string(mine.number) + " (an earlier collective differed between ranks)");
}

}  // namespace fairring
