// CUDA memory and events shared between the processes of one node through
// CUDA IPC handles, exchanged through the c10d store.  Only compiled with
// CUDA (FAIRRING_WITH_CUDA).
#pragma once

#ifdef FAIRRING_WITH_CUDA

#include <c10/util/intrusive_ptr.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/cuda_check.h"

namespace c10d {
class Store;
}

namespace fairring {

// Device memory this process allocates (cudaMalloc, so it can be exported)
// and the mappings of the same allocation made by every other local rank.
class SharedDeviceMemory {
 public:
  // Collective over the node's local ranks: each allocates `bytes` on the
  // current device, publishes its handle under `key`, and opens every peer's.
  // `local_ranks` are the group ranks of the node, `me` this rank's index.
  SharedDeviceMemory(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key,
                     const std::vector<int>& local_ranks, int me, size_t bytes, std::chrono::milliseconds timeout);
  ~SharedDeviceMemory();
  SharedDeviceMemory(const SharedDeviceMemory&) = delete;
  SharedDeviceMemory& operator=(const SharedDeviceMemory&) = delete;

  // Base of local rank x's allocation as this process sees it.
  char* base(int x) const { return bases_[x]; }

  // Teardown, first phase: unmap the peers' allocations (once every use of
  // them on our streams is over).  Our own is freed by the destructor, which
  // must not run before every peer has closed its mapping of it (freeing an
  // exported allocation a peer still maps is undefined behaviour); or
  // leak_own(), when the peers cannot be waited for.
  void close_peers();
  void leak_own() { bases_[me_] = nullptr; }

 private:
  std::vector<char*> bases_;  // [me] is our own allocation
  int me_ = 0;
  int rank_ = -1;  // for logs
};

// Events created with cudaEventInterprocess by one process and opened by the
// others: a peer's stream can wait on an owner's record.  As with any CUDA
// event, cudaStreamWaitEvent waits for the record most recently enqueued when
// it is called, so an owner must not re-record an event before every waiter
// has enqueued its wait (the schedule's host counters ensure that).
class SharedEvents {
 public:
  // Collective: every local rank creates `count` events and opens the peers'.
  SharedEvents(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key,
               const std::vector<int>& local_ranks, int me, int count, std::chrono::milliseconds timeout);
  ~SharedEvents();
  SharedEvents(const SharedEvents&) = delete;
  SharedEvents& operator=(const SharedEvents&) = delete;

  // Event i of local rank x (ours when x == me).
  cudaEvent_t at(int x, int i) const { return events_[static_cast<size_t>(x) * count_ + i]; }

  // Teardown, as SharedDeviceMemory: close the peers' events first; ours
  // are destroyed by the destructor once every peer has closed them (or
  // leaked).
  void close_peers();
  void leak_own();

 private:
  std::vector<cudaEvent_t> events_;
  int count_ = 0;
  int me_ = 0;
  int rank_ = -1;  // for logs
};

}  // namespace fairring

#endif  // FAIRRING_WITH_CUDA
