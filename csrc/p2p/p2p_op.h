// What the point-to-point engine keeps of one send or receive, and of a
// message that arrived before its receive; shared by its three files.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>

#include "common/dtype_name.h"
#include "common/host_blocks.h"
#include "p2p/p2p_engine.h"

namespace fairring {

inline std::string what_tensor(int32_t dtype, int64_t numel) {
  return std::to_string(numel) + " element(s) of " + dtype_name(static_cast<c10::ScalarType>(dtype));
}

struct P2pEngine::Op {
  bool is_send = false;
  int peer = kAnySource;  // group rank
  int tag = 0;
  at::Tensor t;
  char* data = nullptr;
  uint64_t bytes = 0;
  int32_t dtype = 0;
  int64_t numel = 0;
  Footprint fp;
  Done done;
  uint64_t id = 0;
  uint64_t moved = 0;
  Clock::time_point last_progress;

  std::string describe() const {
    const std::string who = peer == kAnySource ? "any rank" : "rank " + std::to_string(peer);
    if (tag < 0) {  // a block of an all-to-all or uneven all-gather (the backend's exchange_blocks)
      return std::string("block ") + (is_send ? "to " : "from ") + who + " of a pairwise exchange (" +
             what_tensor(dtype, numel) + ")";
    }
    return std::string(is_send ? "send to " : "recv from ") + who + " (tag " + std::to_string(tag) + ", " +
           what_tensor(dtype, numel) + ")";
  }
  std::exception_ptr error(ErrorKind kind, const std::string& why) const {
    return std::make_exception_ptr(Error(kind, "fairring: " + describe() + ": " + why));
  }
};

struct P2pEngine::Unexpected {
  int src = -1;
  CellHeader meta;
  // Large ones come from the process's block cache (warm when a message of
  // that size came early before) and go back to it.
  HostBlock buffer;
  char* data() const { return buffer.data(); }
  bool whole = false;         // its last byte is in (a message of 0 bytes too)
  std::shared_ptr<Op> taker;  // the receive that matched it before it was whole
  bool dropped = false;       // matched by a receive that did not fit: dropped once whole
};

}  // namespace fairring
