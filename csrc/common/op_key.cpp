#include "common/op_key.h"

#include <c10/core/ScalarType.h>

#include <cstdio>
#include <stdexcept>

#include "common/dtype_name.h"
#include "common/reduce_op.h"
#include "common/error.h"

namespace fairring {

namespace {
// By kind; kinds are small integers (op_key.h).
constexpr int kMaxCollectiveKinds = 64;
DescribeArgs* describers() {
  static DescribeArgs table[kMaxCollectiveKinds] = {};
  return table;
}
}  // namespace

void register_collective_args(Collective c, DescribeArgs args) {
  const int i = static_cast<int>(c);
  if (i < 0 || i >= kMaxCollectiveKinds) {
    throw Error(ErrorKind::kBackend, "fairring: collective kind " + std::to_string(i) + " out of range");
  }
  describers()[i] = args;
}

const char* collective_name(Collective c) {
  switch (c) {
#define FAIRRING_COLLECTIVE_NAME(kind, number, name) \
  case Collective::k##kind:                          \
    return #name;
    FAIRRING_COLLECTIVES(FAIRRING_COLLECTIVE_NAME)
#undef FAIRRING_COLLECTIVE_NAME
  }
  static thread_local std::string unknown;
  unknown = "collective " + std::to_string(static_cast<int>(c));
  return unknown.c_str();
}

uint32_t block_layout(const int64_t* sizes, int n) {
  uint32_t h = 2166136261u;  // FNV-1a over the sizes' bytes
  for (int i = 0; i < n; ++i) {
    uint64_t v = static_cast<uint64_t>(sizes[i]);
    for (int b = 0; b < 8; ++b, v >>= 8) h = (h ^ (v & 0xff)) * 16777619u;
  }
  return h == 0 ? 1 : h;
}

std::string elements_of(const OpKey& k) {
  return std::to_string(k.numel) + " elements of " + dtype_name(static_cast<c10::ScalarType>(k.dtype));
}

std::string with_op(const OpKey& k) { return std::string(" with ") + redop_name(static_cast<RedOp>(k.op)); }

std::string unequal_blocks(const OpKey& k) {
  if (k.layout == 0) return "";
  char hex[16];
  std::snprintf(hex, sizeof(hex), "%08x", k.layout);
  return std::string(" (blocks of unequal sizes, layout ") + hex + ")";
}

std::string per_rank(const OpKey& k) { return k.layout == 0 ? " per rank" : " per rank at most" + unequal_blocks(k); }

std::string describe_args(const OpKey& k) {
  const int i = k.collective;
  const DescribeArgs args = i >= 0 && i < kMaxCollectiveKinds ? describers()[i] : nullptr;
  return args ? args(k) : elements_of(k);
}

std::string describe(const OpKey& k) {
  if (k.rejected) {
    return std::string(collective_name(static_cast<Collective>(k.collective))) +
           " whose arguments that rank rejected (its own error says why)";
  }
  const std::string args = describe_args(k);
  return std::string(collective_name(static_cast<Collective>(k.collective))) + (args.empty() ? "" : " of " + args);
}

namespace {
std::string mismatch_prefix(const OpKey& mine, const char* device) {
  return std::string(device) + collective_name(static_cast<Collective>(mine.collective)) + " mismatch between ranks: ";
}

// What to do about the one mismatch a correct program can hit by accident:
// an all_to_all given splits on some ranks and none on others (the first
// runs a sizes exchange, the second goes straight to the blocks).
std::string mismatch_hint(const OpKey& a, const OpKey& b) {
  auto is = [](const OpKey& k, Collective c) { return k.collective == static_cast<int32_t>(c); };
  const bool splits_on_one_side = (is(a, Collective::kAllToAllSizes) && is(b, Collective::kAllToAll)) ||
                                  (is(b, Collective::kAllToAllSizes) && is(a, Collective::kAllToAll));
  return splits_on_one_side ? " An all_to_all needs its splits passed on every rank or on none (torch "
                              "all_to_all_single's output_split_sizes and input_split_sizes)."
                            : "";
}
}  // namespace

void check_same_op(const OpKey& mine, int self, const OpKey& theirs, int peer, const char* device) {
  if (mine == theirs) return;
  throw Error(
      ErrorKind::kBackend,
      mismatch_prefix(mine, device) + "for collective #" + std::to_string(mine.number) + " rank " +
          std::to_string(self) + " has " + describe(mine) + " but rank " + std::to_string(peer) + " has collective #" +
          std::to_string(theirs.number) + ": " + describe(theirs) +
          (mine.rejected || theirs.rejected
               ? std::string(". Nothing of it was moved.")
               : ". Every rank must issue the same collectives in the same order." + mismatch_hint(mine, theirs)));
}

void throw_out_of_step(const OpKey& mine, int self, int peer, const char* device) {
  throw Error(ErrorKind::kBackend, mismatch_prefix(mine, device) + "rank " + std::to_string(peer) +
                                       " is out of step with rank " + std::to_string(self) + " at collective #" +
                                       std::to_string(mine.number) + " (an earlier collective differed between ranks)");
}

}  // namespace fairring
