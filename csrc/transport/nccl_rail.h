// NCCL point-to-point on a rail (the ranks with one local rank, one per node),
// for FAIRRING_GPU_TRANSPORT=nccl.  NCCL is loaded at run time: the
// libnccl.so.2 torch has loaded, else the one of torch's pip NVIDIA packages
// (site-packages/nvidia/nccl/lib), else the loader's; FAIRRING_DEBUG=1 logs
// which.  So the extension neither needs NCCL's headers nor links it.
//
// The communicator is non-blocking (NCCL >= 2.14): no NCCL call waits for a
// peer, so every wait is a poll bounded by the group's timeout, and abort()
// from another thread (the group failed) ends it and whatever NCCL kernels
// are running.  NCCL allows one thread at a time on a communicator: every
// call here holds `mu_` (an exchange from group_start() to group_end()).
// That is why NCCL_COMM_BLOCKING=1 is refused: with it, group_end() would
// hold `mu_` inside ncclGroupEnd for as long as a peer takes, and abort()
// and async_error() would wait behind it.
// Only compiled with CUDA (FAIRRING_WITH_CUDA).
#pragma once

#ifdef FAIRRING_WITH_CUDA

#include <c10/util/intrusive_ptr.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <mutex>
#include <string>

namespace c10d {
class Store;
}

namespace fairring {

// The error NcclRail's constructor refuses to start with given the value of
// NCCL_COMM_BLOCKING (null: unset), or "" when it is fine: NCCL applies
// NCCL_COMM_BLOCKING=1 over the config's `blocking = 0`, and a blocking
// communicator waits in NCCL calls without a deadline.
std::string nccl_environment_refusal(const char* comm_blocking);

class NcclRail {
 public:
  // Collective over the rail: `size` ranks, this one at `index` (its node).
  // The rail's index 0 draws the NCCL unique id and shares it under `key`.
  // `rank` (the group rank) is for logs.  Waits at most `timeout` for the
  // rail's peers to join; `interrupted` is called while it waits and may
  // throw to give up (a peer published its own construction failure).
  NcclRail(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key, int size, int index,
           std::chrono::milliseconds timeout, int rank, std::function<void()> interrupted);
  // Finalizes and destroys the communicator (bounded by the timeout), or
  // aborts it after abort_on_destroy().
  ~NcclRail();
  NcclRail(const NcclRail&) = delete;
  NcclRail& operator=(const NcclRail&) = delete;

  // One exchange: byte transfers enqueued on `stream` between group_start()
  // and group_end().  group_end() returns once NCCL has taken them all (it
  // polls, at most `timeout`, and throws if abort() comes meanwhile); only
  // then may other work be enqueued on `stream`.  From one thread.
  void group_start();
  void group_end();
  void send(const void* buf, size_t bytes, int peer, cudaStream_t stream);
  void recv(void* buf, size_t bytes, int peer, cudaStream_t stream);

  // From any thread: the communicator's asynchronous error (a failed
  // transfer, a peer gone), or "" while all is well.
  std::string async_error();
  // From any thread: aborts the communicator now; its running kernels end
  // and every later call throws.
  void abort();
  // After a failure: abort the communicator instead of destroying it (its
  // operations may never complete).
  void abort_on_destroy() { abort_on_destroy_ = true; }

 private:
  // Polls the communicator's state until NCCL has done what it was asked
  // (`what`), at most until `deadline`; throws on an error, a timeout or an
  // abort.  Takes mu_ for each look only, so abort() can come in between.
  void settle(const char* what, std::chrono::steady_clock::time_point deadline,
              const std::function<void()>& interrupted = nullptr);
  // Under mu_: throws if the communicator was aborted.
  void check_live(const char* what) const;
  // A failed call inside an exchange: closes the group, then throws.
  void check_in_group(int result, const char* what);

  const int rank_;
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::unique_lock<std::mutex> group_lock_{mu_, std::defer_lock};  // group_start() .. group_end()
  void* comm_ = nullptr;                                           // null once aborted
  bool abort_on_destroy_ = false;
};

}  // namespace fairring

#endif  // FAIRRING_WITH_CUDA
