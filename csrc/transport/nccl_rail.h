// NCCL point-to-point on a rail (the ranks with one local rank, one per node),
// for FAIRRING_GPU_TRANSPORT=nccl.  NCCL is loaded at run time: the
// libnccl.so.2 torch has loaded, else the one of torch's pip NVIDIA packages
// (site-packages/nvidia/nccl/lib), else the loader's; FAIRRING_DEBUG=1 logs
// which.  So the extension neither needs NCCL's headers nor links it.  Only
// compiled with CUDA (FAIRRING_WITH_CUDA).
#pragma once

#ifdef FAIRRING_WITH_CUDA

#include <c10/util/intrusive_ptr.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <string>

namespace c10d {
class Store;
}

namespace fairring {

class NcclRail {
 public:
  // Collective over the rail: `size` ranks, this one at `index` (its node).
  // The rail's index 0 draws the NCCL unique id and shares it under `key`.
  // `rank` (the group rank) is for logs.
  NcclRail(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key, int size, int index,
           std::chrono::milliseconds timeout, int rank);
  ~NcclRail();
  NcclRail(const NcclRail&) = delete;
  NcclRail& operator=(const NcclRail&) = delete;

  // Byte transfers, enqueued on `stream`; put the sends and receives of one
  // exchange between group_start() and group_end().
  void group_start();
  void group_end();
  void send(const void* buf, size_t bytes, int peer, cudaStream_t stream);
  void recv(void* buf, size_t bytes, int peer, cudaStream_t stream);
  // After a failure: abort the communicator instead of destroying it (its
  // operations may never complete).
  void abort_on_destroy() { abort_ = true; }

 private:
  void* comm_ = nullptr;
  bool abort_ = false;
};

}  // namespace fairring

#endif  // FAIRRING_WITH_CUDA
